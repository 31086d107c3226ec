"""The HTTP routes of the stored chats (rules H1-H5): JSON out, pending_routes' authorizer.

    GET    /chats?session=&limit=&before=   {"chats": [{"id", "session", "messageCount",
                                                        "version", "updatedAt"}]} newest first
    GET    /chats/{id}                      {"id", "session", "version", "messages"}; 404 unknown
    DELETE /chats/{id}                      204; 409 while a response streams; 404 unknown

``before`` is a cursor: the id of the last chat of the previous page. A bad
query gets 422 ``{"message"}``. Every route asks the app's authorizer (401
with no body when it refuses); a principal sees and deletes only the chats of
its own sessions, an operator every one: another's chat is a 404 word for word
as for one that does not exist (O1-O3), decided in one place, :func:`_chat`.

    routes = chat_routes()      # Route objects, before the static mount
"""

from __future__ import annotations

import json
import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..agent.conversations import Conversations
from ..calls.pending import iso_time
from ..hub import Hub
from ..ledger import StoredChat
from .auth import Principal, access, authorize, route_of, unauthorized
from .pending_routes import _message, listing_limit

logger = logging.getLogger(__name__)


def _hub(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


def _conversations(request: Request) -> Conversations:
    return _hub(request).conversations


async def _chat(request: Request, principal: Principal) -> tuple[str, StoredChat | None]:
    """The chat of the path if ``principal`` may see it, else None (answered as unknown)."""
    chat_id: str = request.path_params["chat_id"]
    found = await _conversations(request).get(chat_id)
    if found is None or not await access(request).allows(
        principal, found.session, route=route_of(request)
    ):
        return chat_id, None
    return chat_id, found


def _unknown(chat_id: str) -> JSONResponse:
    return _message(404, f"no chat {chat_id[:64]!r}")


async def list_chats(request: Request) -> Response:
    principal = await authorize(request)
    if principal is None:
        return unauthorized()
    query = request.query_params
    limit = listing_limit(query)
    if isinstance(limit, Response):
        return limit
    session, before = query.get("session") or None, query.get("before") or None
    visible = await access(request).sessions(principal)
    listed = await _conversations(request).listing(session, limit, before, visible)
    if listed is None:
        assert before is not None
        return _message(422, f"no chat {before[:64]!r} to page from")
    chats = [
        {
            "id": chat.id,
            "session": chat.session,
            "messageCount": chat.message_count,
            "version": chat.version,
            "updatedAt": iso_time(chat.updated_at),
        }
        for chat in listed
    ]
    return JSONResponse({"chats": chats})


async def get_chat(request: Request) -> Response:
    principal = await authorize(request)
    if principal is None:
        return unauthorized()
    chat_id, chat = await _chat(request, principal)
    if chat is None:
        return _unknown(chat_id)
    # The messages are stored as JSON text: joined as they are, not parsed and dumped again.
    head = json.dumps({"id": chat.id, "session": chat.session, "version": chat.version})
    body = f'{head[:-1]}, "messages": [{",".join(chat.messages)}]}}'
    return Response(body, media_type="application/json")


async def delete_chat(request: Request) -> Response:
    principal = await authorize(request)
    if principal is None:
        return unauthorized()
    chat_id, chat = await _chat(request, principal)
    if chat is None:
        return _unknown(chat_id)
    if await _hub(request).chat_streams(chat_id):
        return _message(409, "a response is streaming for this chat: it was not deleted")
    if not await _conversations(request).delete(chat_id):
        return _unknown(chat_id)
    logger.info("chat %r deleted over HTTP", chat_id)
    return Response(status_code=204)


def chat_routes() -> list[Route]:
    """The routes, to be placed before any catch-all mount (static files at ``/``)."""
    return [
        Route("/chats", list_chats, methods=["GET"]),
        Route("/chats/{chat_id}", get_chat, methods=["GET"]),
        Route("/chats/{chat_id}", delete_chat, methods=["DELETE"]),
    ]
