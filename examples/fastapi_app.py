"""clienttools mounted in a FastAPI app, beside the app's own routes, behind the app's own login.

    uvicorn examples.fastapi_app:app --port 8000
    curl -c jar -H 'Content-Type: application/json' \\
        -d '{"username": "alice", "password": "alice-demo-password"}' \\
        http://127.0.0.1:8000/login                        # sets the signed session cookie
    curl -b jar http://127.0.0.1:8000/clienttools/executions   # alice's executions only
    # a page of this origin connects to ws://127.0.0.1:8000/clienttools/agents/chat/{session}:
    # the browser sends the cookie with the handshake, and the session becomes alice's;
    # a useChat() page of this origin posts to http://127.0.0.1:8000/clienttools/agents/chat/{session}

``create_app`` returns an ASGI app serving the agent with each session's page
tools. A mounted app's lifespan does not run by itself, so the FastAPI app
runs it in its own (that starts the ledger and the run supervisor).

Who is asking is the app's business: its ``/login`` route checks a password
and sets a cookie signed with the app's secret (``mint_token``, the format of
the server's signed tokens: principal, operator flag, expiry, HMAC-SHA256).
``authorize`` reads that cookie on every WebSocket handshake and every HTTP
request the server answers, and names the principal; the server then keeps
each session to the principal that first used it, and lets the operator
(``root``) see and settle every one (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time

from examples.agent import agent
from fastapi import FastAPI, HTTPException, Request, Response
from pydantic import BaseModel
from starlette.requests import HTTPConnection

from clienttools_server.app import create_app
from clienttools_server.config import ServerConfig
from clienttools_server.wire.auth import Principal, TokenRefused, mint_token, verify_token

COOKIE = "clienttools_session"
SESSION_SECONDS = 8 * 3600
# The app's own secret; one drawn at start-up signs out everyone at each restart.
SECRET = os.environ.get("EXAMPLE_APP_SECRET") or secrets.token_urlsafe(32)


def _hashed(password: str, salt: bytes) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 100_000)


_SALT = secrets.token_bytes(16)
# Demo users (a real app asks its user store): name -> (password hash, operator).
USERS = {
    "alice": (_hashed("alice-demo-password", _SALT), False),
    "bob": (_hashed("bob-demo-password", _SALT), False),
    "root": (_hashed("root-demo-password", _SALT), True),
}


def authorize(connection: HTTPConnection) -> Principal | None:
    """The principal of the signed session cookie, or None (no cookie, expired, forged)."""
    cookie = connection.cookies.get(COOKIE)
    if cookie is None:
        return None
    try:
        return verify_token(SECRET, cookie, now=time.time())
    except TokenRefused:
        return None


clienttools = create_app(ServerConfig(), agent=agent, authorize=authorize)
app = FastAPI(lifespan=lambda _: clienttools.router.lifespan_context(clienttools))
app.mount("/clienttools", clienttools)


class Login(BaseModel):
    username: str
    password: str


@app.post("/login", status_code=204)
def login(body: Login, response: Response) -> None:
    """Check the password; set the signed session cookie."""
    user = USERS.get(body.username)
    # Hash even for an unknown name, so the time does not tell which names exist.
    given = _hashed(body.password, _SALT)
    if user is None or not hmac.compare_digest(given, user[0]):
        raise HTTPException(status_code=401, detail="wrong username or password")
    cookie = mint_token(SECRET, body.username, operator=user[1], ttl=SESSION_SECONDS)
    # HttpOnly: no script reads it. SameSite=Lax: other sites' requests do not carry it
    # (a WebSocket handshake from another site is refused by its Origin anyway: S10).
    # Behind HTTPS add secure=True.
    response.set_cookie(
        COOKIE, cookie, max_age=SESSION_SECONDS, httponly=True, samesite="lax", path="/"
    )


@app.post("/logout", status_code=204)
def logout(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/")


@app.get("/me")
def me(request: Request) -> dict[str, object]:
    """Who the cookie says the caller is: the app's routes use the same authorizer."""
    principal = authorize(request)
    if principal is None:
        raise HTTPException(status_code=401, detail="log in first")
    return {"principal": principal.id, "operator": principal.operator}


@app.get("/health")
def health() -> dict[str, str]:
    """One of the app's own routes."""
    return {"status": "ok"}
