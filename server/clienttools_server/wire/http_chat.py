"""The AI SDK's HTTP chat transport: ``DefaultChatTransport`` on the same runs as the WebSocket.

A page whose chat is ``useChat()`` / ``AbstractChat`` with the ``ai`` package's
default transport and ``api: "/agents/chat/{session}"`` talks to these routes:

    POST /agents/chat/{session}                       the turn's response, as server-sent events
    GET  /agents/chat/{session}/{chatId}/stream       the chat's active response from its first
                                                      chunk, then live; 204 when none is active
    POST /agents/chat/{session}/{chatId}/abort        {"aborted": bool}: stops the chat's run
    POST /agents/chat/{session}/{chatId}/approval     {"toolCallId" | "id", "approved", "reason"?}:
                                                      answers a tool-approval-request

Each request is a subscriber of the hub like a chat socket: a POST is the
WebSocket ``send`` (:meth:`Hub.start_run`), a GET its ``resume``
(:meth:`Hub.resume`), so the run, the page tools it calls over the page's
tools socket, the chunk log shared between processes and the approvals are
the same machinery. The response is framed exactly as the ``ai`` package
parses it (``parseJsonEventStream`` over ``eventsource-parser``): one
``data: JSON`` line and a blank line per UIMessageChunk, ``data: [DONE]`` at
the end, and, after ``sse_keepalive`` seconds without a chunk (a page tool or
an approval that takes long), a comment line ``: keep-alive``, which the
parser skips, so that proxies do not cut an idle response.

A response whose client goes away (``useChat().stop()`` aborts the fetch)
unsubscribes; the run goes on and the GET route resumes it. Only the abort
route stops the run.

    routes = chat_http_routes()     # before any catch-all mount, beside the WebSocket route
    frame = parse_send(b'{"id": "c1", "messages": [], "trigger": "submit-message"}', "r1")
    frame.id, frame.trigger         # ('c1', 'submit-message')
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
from collections.abc import Mapping
from typing import Any

from pydantic import JsonValue, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from clienttools.protocol import (
    ChunkFrame,
    EndFrame,
    ErrorFrame,
    NoActiveFrame,
    ProtocolErrorFrame,
    ResumeFrame,
    SendFrame,
    StartFrame,
    ToolApprovalFrame,
    ToolSpec,
    WireModel,
    describe_validation_error,
    dump_json,
)

from ..agent.launcher import BUSY
from ..config import ServerConfig
from ..hub import Hub
from ..ledger import LeaseLost, LedgerUnavailable
from .auth import access, authorize, route_of
from .bodies import BodyTooLarge, bounded_body
from .connection import MAX_SESSION_NAME, origin_allowed

logger = logging.getLogger(__name__)

# What the ai package's own createUIMessageStreamResponse sends (UI_MESSAGE_STREAM_HEADERS).
SSE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"connection", b"keep-alive"),
    (b"x-vercel-ai-ui-message-stream", b"v1"),
    (b"x-accel-buffering", b"no"),
)
DONE = b"data: [DONE]\n\n"
KEEP_ALIVE = b": keep-alive\n\n"
# The fields of the body DefaultChatTransport sets itself; any other is the app's `body`.
_OWN_FIELDS = {"id": "id", "messages": "messages", "trigger": "trigger", "messageId": "messageId"}
MAX_CHAT_ID = 256
APPROVAL_ID_PREFIX = "approval-"


class ChatRequestError(Exception):
    """A request these routes refuse: its HTTP status and a message for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message)


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


# -- the request body (sans-I/O) ---------------------------------------------------------


_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def parse_json_body(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; ChatRequestError 400 saying what is wrong with it."""
    try:
        text = body.decode("utf-8")
        raw = json.loads(text, parse_constant=_refuse_constant)
        if _ESCAPED_SURROGATE.search(text):
            # A lone surrogate ("\\ud800") decodes, but could be neither stored nor sent on.
            dump_json(raw).encode("utf-8")
    except UnicodeError:
        raise ChatRequestError(400, "the body is not valid UTF-8 JSON") from None
    except RecursionError:
        raise ChatRequestError(400, "the body is nested too deeply") from None
    except ValueError as exc:
        raise ChatRequestError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ChatRequestError(400, f"the body must be a JSON object, got {type(raw).__name__}")
    return raw


def parse_send(body: bytes, request_id: str) -> SendFrame:
    """A POST body as DefaultChatTransport sends it, as the WebSocket ``send`` it stands for.

    ``id``, ``messages``, ``trigger`` and ``messageId`` are the transport's
    fields; every other field is the app's ``body``. Raises ChatRequestError
    (400) naming the first problems.
    """
    raw = parse_json_body(body)
    fields: dict[str, Any] = {"type": "send", "requestId": request_id}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _OWN_FIELDS:
            fields[key] = value
        else:
            extra[key] = value
    missing = [name for name in ("id", "messages", "trigger") if name not in raw]
    if missing:
        raise ChatRequestError(400, "the body has no " + ", ".join(repr(m) for m in missing))
    fields["body"] = extra
    if fields.get("messageId") is None:
        fields.pop("messageId", None)
    try:
        frame = SendFrame.model_validate(fields, by_alias=True)
    except ValidationError as exc:
        raise ChatRequestError(400, f"invalid body: {describe_validation_error(exc)}") from None
    except RecursionError:
        raise ChatRequestError(400, "the body is nested too deeply") from None
    if not 0 < len(frame.id) <= MAX_CHAT_ID:
        raise ChatRequestError(400, f"invalid body: id: 1 to {MAX_CHAT_ID} characters")
    return frame


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or ChatRequestError 413 once it passes ``limit`` bytes."""
    try:
        return await bounded_body(request, limit)
    except BodyTooLarge as exc:
        raise ChatRequestError(413, str(exc)) from None


# -- admission --------------------------------------------------------------------------


async def admit(request: Request, config: ServerConfig, *, claim: bool = False) -> Response | None:
    """Who may use these routes: None admits, else the refusal to answer.

    The one place their admission is decided: a sane session name, the
    WebSocket's ``Origin`` allow-list (S10: a page of another site must not
    start runs, even where the browser sends the request without asking), then
    the app's authorizer (401 when it refuses) and the session's owner (O1: a
    404, as for a session of nothing). ``claim``: a first use makes the caller
    the session's owner, as a handshake does.
    """
    session = request.path_params.get("session", "")
    if not isinstance(session, str) or not 0 < len(session) <= MAX_SESSION_NAME:
        return error_response(404, "no such session")
    if not origin_allowed(request.headers.get("origin"), request.headers.get("host"), config):
        return error_response(403, "this origin is not allowed")
    principal = await authorize(request)
    if principal is None:
        response = error_response(401, "unauthorized")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
    rules = access(request)
    try:
        if not claim and principal.session in (None, session) and not await rules.owner(session):
            return None  # nobody's session has nothing to show: answered as a chat of nothing
        allowed = await rules.allows(principal, session, route=route_of(request), claim=claim)
    except LedgerUnavailable:
        return error_response(503, "the server's database is not reachable; try again")
    if not allowed:
        return error_response(404, "no such session")
    return None


def cross_origin(request: Request, config: ServerConfig) -> dict[str, str]:
    """The CORS headers for a page on another origin of the allow-list; {} for any other.

    A chat UI served apart from the server (``--allow-origin http://localhost:3000``)
    reaches the WebSocket without them, but its fetches need them. No credentials:
    the token goes in ``Authorization``, which the preflight allows.
    """
    origin = request.headers.get("origin")
    host = request.headers.get("host")
    if origin is None or origin in (f"http://{host}", f"https://{host}"):
        return {}
    if not origin_allowed(origin, host, config):
        return {}
    return {
        "access-control-allow-origin": origin,
        "access-control-expose-headers": "x-vercel-ai-ui-message-stream",
        "vary": "Origin",
    }


async def preflight(request: Request) -> Response:
    """The answer to a browser's CORS preflight of these routes."""
    headers = cross_origin(request, _config(request))
    if not headers:
        return error_response(403, "this origin is not allowed")
    headers["access-control-allow-methods"] = "GET, POST"
    headers["access-control-allow-headers"] = "authorization, content-type"
    headers["access-control-max-age"] = "600"
    return Response(status_code=204, headers=headers)


def _with_cors(endpoint: Any) -> Any:
    async def answer(request: Request) -> Any:
        response = await endpoint(request)
        # A Response's headers or an EventStream's: both take the CORS headers as they are.
        response.headers.update(cross_origin(request, _config(request)))
        return response

    answer.__doc__ = endpoint.__doc__
    return answer


# -- one HTTP request as a subscriber of the hub ----------------------------------------


def sse_event(chunk: Mapping[str, JsonValue]) -> bytes:
    """One UIMessageChunk as parseJsonEventStream reads it (JSON escapes every line break)."""
    return b"data: " + dump_json(chunk).encode("utf-8") + b"\n\n"


class ResponsePeer:
    """An HTTP request as the hub sees a chat socket: a ``Client`` with no tools.

    The hub's frames become bytes of the event stream: ``chunk`` a ``data:``
    event, ``end`` the ``[DONE]`` event, ``error`` an ``error`` chunk and
    ``[DONE]``. The first frame says how the request went (``start``, or a
    refusal), before the HTTP status is chosen.
    """

    def __init__(self, session: str) -> None:
        self._id = "http-" + secrets.token_hex(8)
        self.request_id = secrets.token_hex(16)
        self._session = session
        self.first: WireModel | None = None
        self.pending: list[bytes] = []
        self.done = False
        self.open = True
        self.wake = asyncio.Event()

    @property
    def id(self) -> str:
        return self._id

    @property
    def session(self) -> str:
        return self._session

    @property
    def client_id(self) -> str | None:
        return None

    @property
    def is_open(self) -> bool:
        return self.open

    @property
    def tools(self) -> Mapping[str, ToolSpec]:
        return {}

    @property
    def registration(self) -> int:
        return 0

    def set_tools(self, client_id: str, tools: dict[str, ToolSpec], registration: int) -> None:
        raise RuntimeError("an HTTP chat request registers no tools")

    def tool_spec(self, name: str) -> ToolSpec | None:
        return None

    def send(self, frame: WireModel) -> None:
        if self.first is None:
            self.first = frame
        if not self.open or self.done:
            return
        if isinstance(frame, ChunkFrame):
            self.pending.append(sse_event(frame.chunk))
        elif isinstance(frame, EndFrame):
            self._end()
        elif isinstance(frame, ErrorFrame | ProtocolErrorFrame):
            text = frame.error_text if isinstance(frame, ErrorFrame) else frame.message
            self.pending.append(sse_event({"type": "error", "errorText": text or "error"}))
            self._end()
        elif isinstance(frame, NoActiveFrame):
            self.done = True
        elif not isinstance(frame, StartFrame):
            return
        self.wake.set()

    def _end(self) -> None:
        self.pending.append(DONE)
        self.done = True


class EventStream:
    """The ASGI response that writes a :class:`ResponsePeer`'s events until the end.

    Everything buffered is written in one body message; a disconnect (the
    client aborted its fetch) stops the writing and unsubscribes the peer,
    and the run goes on.
    """

    def __init__(self, peer: ResponsePeer, hub: Hub, keepalive: float) -> None:
        self.peer = peer
        self.hub = hub
        self.keepalive = keepalive
        # Besides SSE_HEADERS (the CORS headers of a page on another allowed origin).
        self.headers: dict[str, str] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        peer = self.peer
        watcher = asyncio.create_task(self._watch(receive))
        try:
            headers = [*SSE_HEADERS, *((k.encode(), v.encode()) for k, v in self.headers.items())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            while peer.open:
                peer.wake.clear()
                if peer.pending:
                    body = b"".join(peer.pending)
                    peer.pending.clear()
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                if peer.done:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    break
                try:
                    async with asyncio.timeout(self.keepalive):
                        await peer.wake.wait()
                except TimeoutError:
                    if peer.open:
                        message: Message = {"type": "http.response.body", "body": KEEP_ALIVE}
                        await send({**message, "more_body": True})
        except OSError:
            pass  # the client went away while we wrote (uvicorn's ClientDisconnected)
        finally:
            peer.open = False
            watcher.cancel()
            # A closed peer gets nothing more, whatever happens here: its log forgets
            # it when the response ends at the latest.
            await self.hub.detach(peer)

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.peer.open = False
        self.peer.wake.set()


# -- the routes -------------------------------------------------------------------------


def _hub(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


def _config(request: Request) -> ServerConfig:
    config: ServerConfig = request.app.state.config
    return config


def _refusal(first: WireModel | None) -> Response:
    """The answer to a request the hub refused before its response started."""
    if isinstance(first, ErrorFrame) and first.error_text == BUSY:
        return error_response(409, BUSY)
    if isinstance(first, ErrorFrame):
        return error_response(400, first.error_text or "the request was not usable")
    if isinstance(first, ProtocolErrorFrame):
        # A chat of another session (H5): refused as if it did not exist.
        return error_response(404, first.message)
    logger.error("an HTTP chat request got %r first", first)
    return error_response(500, "the server could not handle this request")


async def _subscribe(request: Request, peer: ResponsePeer, frame: SendFrame | ResumeFrame) -> Any:
    hub = _hub(request)
    try:
        if isinstance(frame, SendFrame):
            await hub.start_run(peer, frame)
        else:
            await hub.resume(peer, frame)
    except LedgerUnavailable as exc:
        logger.warning("an HTTP chat request met the ledger away: %s", exc)
        return error_response(503, "the server's database is not reachable; try again")
    except LeaseLost as exc:
        hub.lease_lost(exc.execution_id)
        return error_response(503, "the chat moved to another server process; try again")
    if isinstance(peer.first, StartFrame):
        return EventStream(peer, hub, _config(request).sse_keepalive)
    if isinstance(peer.first, NoActiveFrame):
        return Response(status_code=204)
    return _refusal(peer.first)


async def post_chat(request: Request) -> Any:
    """One turn: the WebSocket ``send``, answered as an event stream."""
    config = _config(request)
    refused = await admit(request, config, claim=True)
    if refused is not None:
        return refused
    peer = ResponsePeer(request.path_params["session"])
    try:
        frame = parse_send(await read_body(request, config.max_frame_bytes), peer.request_id)
    except ChatRequestError as exc:
        return exc.response()
    return await _subscribe(request, peer, frame)


async def resume_chat(request: Request) -> Any:
    """The chat's active response from its first chunk (the WebSocket ``resume``); 204: none."""
    refused = await admit(request, _config(request))
    if refused is not None:
        return refused
    peer = ResponsePeer(request.path_params["session"])
    chat_id: str = request.path_params["chat_id"]
    return await _subscribe(request, peer, ResumeFrame(request_id=peer.request_id, id=chat_id))


async def abort_chat(request: Request) -> Response:
    """Stop the chat's run (the WebSocket ``abort``): ``{"aborted": false}`` when none runs."""
    refused = await admit(request, _config(request))
    if refused is not None:
        return refused
    session: str = request.path_params["session"]
    chat_id: str = request.path_params["chat_id"]
    try:
        aborted = await _hub(request).abort_chat(session, chat_id)
    except LedgerUnavailable:
        return error_response(503, "the server's database is not reachable; try again")
    return JSONResponse({"aborted": aborted})


async def approve_chat(request: Request) -> Response:
    """Answer a ``tool-approval-request`` of the chat's response (``cf_agent_tool_approval``)."""
    config = _config(request)
    refused = await admit(request, config)
    if refused is not None:
        return refused
    peer = ResponsePeer(request.path_params["session"])
    try:
        raw = parse_json_body(await read_body(request, config.max_frame_bytes))
        approval_id = raw.pop("id", None)
        if "toolCallId" not in raw and isinstance(approval_id, str):
            # What AbstractChat.addToolApprovalResponse takes: {id: approvalId, approved,
            # reason}; the server's approvalId is "approval-" + the toolCallId (agent/journal.py).
            raw["toolCallId"] = approval_id.removeprefix(APPROVAL_ID_PREFIX)
        frame = ToolApprovalFrame.model_validate({**raw, "type": "cf_agent_tool_approval"})
    except ChatRequestError as exc:
        return exc.response()
    except ValidationError as exc:
        return error_response(400, f"invalid body: {describe_validation_error(exc)}")
    try:
        await _hub(request).approve(peer, frame)
    except LedgerUnavailable:
        return error_response(503, "the server's database is not reachable; try again")
    if isinstance(peer.first, ProtocolErrorFrame):
        return error_response(409, peer.first.message)
    return JSONResponse({"outcome": "applied"})


def chat_http_routes() -> list[Route]:
    """The routes, beside the chat WebSocket route and before any catch-all mount."""
    routes = {
        "/agents/chat/{session}": (post_chat, "POST"),
        "/agents/chat/{session}/{chat_id}/stream": (resume_chat, "GET"),
        "/agents/chat/{session}/{chat_id}/abort": (abort_chat, "POST"),
        "/agents/chat/{session}/{chat_id}/approval": (approve_chat, "POST"),
    }
    found = [Route(path, _with_cors(e), methods=[m]) for path, (e, m) in routes.items()]
    return found + [Route(path, preflight, methods=["OPTIONS"]) for path in routes]


__all__ = [
    "ChatRequestError",
    "EventStream",
    "ResponsePeer",
    "admit",
    "chat_http_routes",
    "cross_origin",
    "parse_json_body",
    "parse_send",
    "sse_event",
]
