"""The HTTP routes of the stored chats (rules H1-H5): JSON out, the token rules of ``routes``.

    GET    /chats?session=&limit=&before=   {"chats": [{"id", "session", "messageCount",
                                                        "version", "updatedAt"}]} newest first
    GET    /chats/{id}                      {"id", "session", "version", "messages"}; 404 unknown
    DELETE /chats/{id}                      204; 409 while a response streams; 404 unknown

``before`` is a cursor: the id of the last chat of the previous page. A bad
query gets 422 ``{"message"}``. Who may see a chat is decided in one place,
:func:`_visible`, for every route.

    routes = chat_routes()      # Route objects, before the static mount
"""

from __future__ import annotations

import json
import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .conversations import Conversations
from .hub import Hub
from .ledger import StoredChat
from .pending import DEFAULT_LIMIT, MAX_LIMIT
from .routes import _message, _refused

logger = logging.getLogger(__name__)


def _hub(request: Request) -> Hub:
    hub: Hub = request.app.state.hub
    return hub


def _conversations(request: Request) -> Conversations:
    return _hub(request).conversations


def _visible(request: Request, chat: StoredChat | None) -> StoredChat | None:
    """The chat if this request may see it, else None (answered as unknown: a 404).

    Today the token of ``_refused`` admits to every chat; a per-session owner
    check belongs here, so every route applies it alike.
    """
    return chat


async def _chat(request: Request) -> tuple[str, StoredChat | None]:
    chat_id: str = request.path_params["chat_id"]
    found = await _conversations(request).get(chat_id)
    return chat_id, _visible(request, found)


def _unknown(chat_id: str) -> JSONResponse:
    return _message(404, f"no chat {chat_id[:64]!r}")


async def list_chats(request: Request) -> Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    query = request.query_params
    raw_limit = query.get("limit", str(DEFAULT_LIMIT))
    try:
        limit = int(raw_limit)
    except ValueError:
        return _message(422, f"limit must be an integer, not {raw_limit[:32]!r}")
    if not 1 <= limit <= MAX_LIMIT:
        return _message(422, f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    before = query.get("before") or None
    listed = await _conversations(request).listing(query.get("session"), limit, before)
    if listed is None:
        assert before is not None
        return _message(422, f"no chat {before[:64]!r} to page from")
    chats = [
        {
            "id": chat.id,
            "session": chat.session,
            "messageCount": chat.message_count,
            "version": chat.version,
            "updatedAt": chat.updated_at,
        }
        for chat in listed
    ]
    return JSONResponse({"chats": chats})


async def get_chat(request: Request) -> Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    chat_id, chat = await _chat(request)
    if chat is None:
        return _unknown(chat_id)
    # The messages are stored as JSON text: joined as they are, not parsed and dumped again.
    head = json.dumps({"id": chat.id, "session": chat.session, "version": chat.version})
    body = f'{head[:-1]}, "messages": [{",".join(chat.messages)}]}}'
    return Response(body, media_type="application/json")


async def delete_chat(request: Request) -> Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    chat_id, chat = await _chat(request)
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
