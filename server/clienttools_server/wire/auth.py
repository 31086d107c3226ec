"""Who is asking, and what they may see: principals, the authorizer, signed tokens, owners.

Identity enters the server in one place: the ``authorize`` argument of
:func:`clienttools_server.app.create_app`, an :data:`Authorizer`. It is called
with every WebSocket handshake and every HTTP request that needs an identity
(a Starlette ``HTTPConnection``: headers, cookies, query, path params) and
returns a :class:`Principal`, or ``None`` to refuse. Without one, the server
keeps its token rules (:func:`default_authorizer`): whoever holds ``--token``
(or everyone, when none is set) is the one principal :data:`SHARED`, and
``--admin-token`` makes the operator :data:`ADMIN`. With ``--secret``, signed
tokens (:func:`mint_token`) name principals of their own.

Then the rules of ownership (O1-O4), kept by :class:`Access` (``app.state.access``):
a session belongs to the first principal that uses it, recorded in the ledger
(so it survives restarts and every process sees it); another principal that is
not an operator is refused and learns nothing; listings show a principal its
own sessions only. Any route asks the same two questions::

    from clienttools_server.wire.auth import access, authorize, unauthorized

    async def my_route(request: Request) -> Response:
        principal = await authorize(request)            # None: answer 401
        if principal is None:
            return unauthorized()
        if not await access(request).allows(principal, session, route="GET /mine"):
            return JSONResponse({"message": "no such thing"}, status_code=404)
        ...

Signed tokens are an HMAC-SHA256 over the principal, the session (or none),
the operator flag and the expiry, made with the standard library's ``hmac``,
``hashlib`` and ``base64``; the signature is compared in constant time
(``hmac.compare_digest``)::

    token = mint_token("a-long-random-secret", "alice", session="desk", ttl=3600)
    principal = verify_token("a-long-random-secret", token, now=time.time())
    principal.id, principal.session, principal.operator     # ("alice", "desk", False)

Why not a JWT library: the server both mints and checks its tokens, so no
other party needs JWT's interoperability, and what it adds (a header that
names the algorithm, key ids, many claims) is what JWT's known failures come
from (``alg: none``, a public key taken as an HMAC secret). One fixed format
with one fixed algorithm has none of them, and needs no new dependency.
The format: ``ct1.<payload>.<signature>``, both parts unpadded base64url;
the payload is canonical JSON ``{"exp", "op", "p", "s"}``; the signature is
HMAC-SHA256, under a key derived from the secret, of ``ct1.<payload>``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import inspect
import json
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeAlias

from starlette.requests import HTTPConnection
from starlette.responses import Response

from ..clock import SYSTEM_CLOCK, Clock
from ..config import ServerConfig
from ..ledger import Ledger

logger = logging.getLogger(__name__)

# Principal ids and session names: the same bound the WebSocket puts on a session name.
MAX_ID = 256
# A credential longer than this is refused before any work is done on it.
MAX_TOKEN = 4096
# A secret shorter than this is refused: an HMAC key is only as strong as its secret.
MIN_SECRET = 16
TOKEN_PREFIX = "ct1"
# The close code of a WebSocket refused by ownership (O1): 4000 + HTTP's 403.
CLOSE_NOT_YOURS = 4403
# Owners known to this process; a session's owner never changes, so a cached one stays
# right. Bounded, so a flood of session names cannot grow it without end.
OWNER_CACHE = 10_000

_KEY_LABEL = b"clienttools signed token v1"
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: an id, and whether it is an operator.

    ``session``: the credential is good for that one session only (a signed token
    minted with ``--session``); every other session is refused, operator or not.
    """

    id: str
    operator: bool = False
    session: str | None = None


#: The principal of the token rules: whoever holds ``--token``, or everyone without one.
SHARED = Principal("shared")
#: The operator of the token rules: whoever holds ``--admin-token``.
ADMIN = Principal("admin", operator=True)

#: Called with each WebSocket handshake and each HTTP request: the principal, or None
#: to refuse. Sync or async.
Authorizer: TypeAlias = Callable[[HTTPConnection], Principal | Awaitable[Principal | None] | None]


# --------------------------------------------------------------------------- signed tokens


class TokenRefused(ValueError):
    """A signed token that admits nobody; ``reason`` is safe to log (it quotes no token).

    ``principal``: the id the token names, once its signature proved it (an expired
    or wrongly scoped token); None when the token could not be trusted at all.
    """

    def __init__(self, reason: str, principal: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.principal = principal


@functools.lru_cache(maxsize=16)
def _key(secret: str) -> bytes:
    # A key of its own for tokens: the secret may serve the app for other things too.
    # Cached: a server checks every token with the same one or two secrets.
    return hmac.new(secret.encode("utf-8"), _KEY_LABEL, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: str, signed: str) -> str:
    return _b64(hmac.new(_key(secret), signed.encode("ascii"), hashlib.sha256).digest())


def check_secret(secret: str) -> str:
    """The secret, or ValueError saying why it cannot sign tokens."""
    if not isinstance(secret, str) or len(secret) < MIN_SECRET:
        raise ValueError(f"the secret must be at least {MIN_SECRET} characters")
    return secret


def _check_id(what: str, value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID:
        raise ValueError(f"{what} must be 1 to {MAX_ID} characters")
    return value


def mint_token(
    secret: str,
    principal: str,
    session: str | None = None,
    operator: bool = False,
    ttl: float = 3600.0,
    *,
    now: float | None = None,
) -> str:
    """A signed token for ``principal``, good for ``ttl`` seconds from ``now`` (the wall clock).

    With ``session`` it admits that session only; without, any session the
    principal owns or is the first to use. ValueError for a short secret, an
    empty or overlong principal or session, or a ttl that is not a positive number.
    """
    check_secret(secret)
    _check_id("the principal", principal)
    if session is not None:
        _check_id("the session", session)
    if not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0:
        raise ValueError("the ttl must be a positive number of seconds")
    issued = SYSTEM_CLOCK.now() if now is None else now
    claims = {"exp": math.ceil(issued + ttl), "op": bool(operator), "p": principal, "s": session}
    payload = _b64(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode("utf-8"))
    signed = f"{TOKEN_PREFIX}.{payload}"
    return f"{signed}.{_signature(secret, signed)}"


def is_signed_token(text: str) -> bool:
    """Does ``text`` have the shape of a signed token (not whether it is valid)?"""
    return text.startswith(TOKEN_PREFIX + ".")


def verify_token(secret: str, token: str, *, now: float) -> Principal:
    """The principal a signed token names; :class:`TokenRefused` for any token that fails.

    The signature is checked before anything in the token is read, and compared
    in constant time; then the expiry against ``now``.
    """
    if not isinstance(token, str) or len(token) > MAX_TOKEN:
        raise TokenRefused("malformed")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise TokenRefused("malformed")
    _, payload, signature = parts
    if not (_BASE64URL.fullmatch(payload) and _BASE64URL.fullmatch(signature)):
        raise TokenRefused("malformed")
    expected = _signature(secret, f"{TOKEN_PREFIX}.{payload}")
    # Compared as text, not as decoded bytes: base64 has several spellings of some
    # byte strings, and any change to the token must refuse it.
    if not hmac.compare_digest(signature.encode("ascii"), expected.encode("ascii")):
        raise TokenRefused("bad signature")
    try:
        claims = json.loads(_unb64(payload))
    except ValueError:
        raise TokenRefused("malformed") from None  # only a secret holder could sign this
    if not isinstance(claims, dict) or set(claims) != {"exp", "op", "p", "s"}:
        raise TokenRefused("malformed")
    expiry, operator, principal, session = claims["exp"], claims["op"], claims["p"], claims["s"]
    if (
        type(expiry) is not int
        or type(operator) is not bool
        or not isinstance(principal, str)
        or not (session is None or isinstance(session, str))
    ):
        raise TokenRefused("malformed")
    if now >= expiry:
        raise TokenRefused("expired", principal)
    return Principal(principal, operator, session)


# --------------------------------------------------------------------------- authorizers


def credential(connection: HTTPConnection) -> str | None:
    """The token a request carries: ``?token=`` on a WebSocket, ``Authorization: Bearer``
    on HTTP (browsers cannot set a WebSocket handshake's headers)."""
    if connection.scope["type"] == "websocket":
        return connection.query_params.get("token")
    scheme, _, given = connection.headers.get("authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else None


def _route(connection: HTTPConnection) -> str:
    # The path only: the query may hold a token, and is never logged.
    method = "WS" if connection.scope["type"] == "websocket" else connection.scope.get("method")
    return f"{method} {connection.url.path}"


def default_authorizer(config: ServerConfig, clock: Clock = SYSTEM_CLOCK) -> Authorizer:
    """The token rules of a server given no authorizer, plus signed tokens with ``secret``.

    WebSocket: ``?token=`` must be ``config.token`` when one is set (the admin
    token never opens a socket). HTTP: ``Authorization: Bearer`` must be either
    token when either is set; the admin token's holder is :data:`ADMIN`, an
    operator. Holders of the page token, and everyone when no token is set, are
    :data:`SHARED`. With ``config.secret``, a signed token names its own
    principal, and a request with no valid credential is refused even when no
    token is set.
    """
    secret = config.secret

    def authorize(connection: HTTPConnection) -> Principal | None:
        given = credential(connection)
        if secret is not None and given is not None and is_signed_token(given):
            try:
                return verify_token(secret, given, now=clock.now())
            except TokenRefused as refused:
                who = "" if refused.principal is None else f" of principal {refused.principal!r}"
                logger.info("refused %s: a signed token%s: %s", _route(connection), who, refused)
                return None
        candidates = [(config.token, SHARED)]
        if connection.scope["type"] != "websocket":
            candidates.append((config.admin_token, ADMIN))
        configured = [(token, principal) for token, principal in candidates if token is not None]
        if not configured:
            if secret is None:
                return SHARED
            logger.info("refused %s: no signed token", _route(connection))
            return None
        found: Principal | None = None
        offered = (given or "").encode("utf-8", "surrogatepass")
        for token, principal in configured:
            # Every token is compared, so the time does not tell which one matched.
            if hmac.compare_digest(offered, token.encode("utf-8")) and found is None:
                found = principal
        if found is None:
            logger.info("refused %s: no valid token", _route(connection))
        return found

    return authorize


# --------------------------------------------------------------------------- ownership


def _valid_principal(principal: Principal) -> bool:
    # The id is stored as a session's owner: text the ledger can hold and compare.
    def fits(value: object) -> bool:
        return isinstance(value, str) and 0 < len(value) <= MAX_ID

    session_ok = principal.session is None or fits(principal.session)
    return fits(principal.id) and isinstance(principal.operator, bool) and session_ok


_PRINCIPAL_KEY = "clienttools.principal"


class Access:
    """The one check of who may use a session (O1-O4), on ``app.state.access``.

    ``authorize`` asks the app's authorizer (once per request: the answer is kept
    on the request); ``allows`` says whether a principal may use a session,
    claiming it for the principal when ``claim`` and nobody owns it yet;
    ``sessions`` is what a listing may show.
    """

    def __init__(self, authorizer: Authorizer, ledger: Ledger, clock: Clock = SYSTEM_CLOCK) -> None:
        self._authorizer = authorizer
        self._ledger = ledger
        self._clock = clock
        self._owners: OrderedDict[str, str] = OrderedDict()

    async def authorize(self, connection: HTTPConnection) -> Principal | None:
        """The principal of this request, or None (refused; the authorizer said why, or
        this logs that it failed)."""
        state = connection.scope.setdefault("state", {})
        if _PRINCIPAL_KEY in state:
            known: Principal | None = state[_PRINCIPAL_KEY]
            return known
        try:
            answer = self._authorizer(connection)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception:
            # An authorizer that fails refuses: failing open would admit anyone.
            logger.exception("the authorizer failed on %s; refused", _route(connection))
            answer = None
        if answer is not None and not isinstance(answer, Principal):
            logger.error(
                "the authorizer returned a %s, not a Principal or None, on %s; refused",
                type(answer).__name__,
                _route(connection),
            )
            answer = None
        elif answer is not None and not _valid_principal(answer):
            logger.error(
                "the authorizer returned a Principal whose id or session is not 1 to %d "
                "characters of text, on %s; refused",
                MAX_ID,
                _route(connection),
            )
            answer = None
        if answer is None:
            logger.info("refused %s: the authorizer named no principal", _route(connection))
        state[_PRINCIPAL_KEY] = answer
        return answer

    async def owner(self, session: str) -> str | None:
        """The principal id that owns ``session``, or None while nobody does."""
        known = self._owners.get(session)
        if known is not None:
            return known
        found = await self._ledger.session_owner(session)
        if found is not None:
            self._remember(session, found)
        return found

    def _remember(self, session: str, owner: str) -> None:
        self._owners[session] = owner
        self._owners.move_to_end(session)
        while len(self._owners) > OWNER_CACHE:
            self._owners.popitem(last=False)

    async def allows(
        self, principal: Principal, session: str, *, route: str, claim: bool = False
    ) -> bool:
        """May ``principal`` use ``session``? The owner and operators may (O1, O3).

        ``claim``: a first use (a WebSocket handshake, a chat request) makes the
        principal the owner of a session nobody owns yet. A refusal is logged with
        the principal, the session and ``route``; the caller answers as if the
        session's data did not exist (HTTP 404, WebSocket 4403).
        """
        if principal.session is not None and principal.session != session:
            self._refused(principal, session, route, "its token is for another session")
            return False
        owner = await self.owner(session)
        if owner is None and claim:
            owner = await self._ledger.claim_session(session, principal.id, self._clock.now())
            self._remember(session, owner)
            if owner == principal.id:
                logger.info("session %r is owned by principal %r now", session, principal.id)
        if principal.operator or (owner is not None and owner == principal.id):
            return True
        reason = "the session is not its own" if owner is not None else "nobody owns the session"
        self._refused(principal, session, route, reason)
        return False

    @staticmethod
    def _refused(principal: Principal, session: str, route: str, reason: str) -> None:
        logger.info(
            "refused principal %r on session %r (%s): %s", principal.id, session, route, reason
        )

    async def sessions(self, principal: Principal) -> frozenset[str] | None:
        """The sessions a listing shows ``principal`` (O2); None: every session (an operator)."""
        if principal.session is not None:
            owner = await self.owner(principal.session)
            mine = principal.operator or owner == principal.id
            return frozenset({principal.session}) if mine else frozenset()
        if principal.operator:
            return None
        return frozenset(await self._ledger.sessions_owned_by(principal.id))


def access(connection: HTTPConnection) -> Access:
    """The app's :class:`Access` (``app.state.access``)."""
    found: Access = connection.app.state.access
    return found


async def authorize(connection: HTTPConnection) -> Principal | None:
    """The principal of a request or handshake, by the app's authorizer; None: refused."""
    return await access(connection).authorize(connection)


def unauthorized() -> Response:
    """The answer to an HTTP request the authorizer refused: 401, no detail."""
    return Response(status_code=401, headers={"WWW-Authenticate": "Bearer"})


class RedactTokens(logging.Filter):
    """Rewrites ``token=...`` in a query string of a log line as ``token=[redacted]``.

    uvicorn logs each WebSocket handshake with its path and query
    (``"WebSocket /agents/chat/desk?token=..." [accepted]``): a page's token
    would end up in every log; at trace level its ``uvicorn.asgi`` logger prints
    each scope's query string. Installed on uvicorn's loggers by
    :func:`clienttools_server.app.uvicorn_config`.
    """

    # After "?" or "&" in a path, or at the start of a query string logged alone (at
    # trace level uvicorn.asgi logs each scope: ``'query_string': b'token=...'``).
    _TOKEN = re.compile(r"((?:[?&]|b')token=)[^&\s\"']*")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "token=" in message:
            record.msg, record.args = self._TOKEN.sub(r"\1[redacted]", message), None
        return True


def redact_tokens(*loggers: str) -> None:
    """Install :class:`RedactTokens` on the named loggers (once each)."""
    for name in loggers:
        target = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in target.filters):
            target.addFilter(RedactTokens())


def route_of(connection: HTTPConnection) -> str:
    """How logs name a request: method (``WS`` for a socket) and path, never the query."""
    return _route(connection)
