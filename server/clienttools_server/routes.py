"""The HTTP routes of pending calls: JSON in and out, over :class:`PendingCalls`.

    GET  /executions?status=&session=&limit=&before=
    GET  /executions/{executionId}
    POST /executions/{executionId}/steps/{seq}/resolve   {"output": <any JSON>}
    POST /executions/{executionId}/steps/{seq}/approve   {"approved": bool, "reason"?: str}
    POST /executions/{executionId}/steps/{seq}/reject    {"message": str, "code"?: str}

Every POST answers ``{"outcome", "message"?}``: 200 ``applied``, 409
``duplicate`` or ``stale``, 422 ``invalid`` (the output breaks the
outputSchema, a body of another shape, the wrong kind of step); 404
``{"message"}`` for an unknown execution or seq. A GET with a bad query gets
422 ``{"message"}``. With ``--token`` or ``--admin-token`` set, every route
needs ``Authorization: Bearer TOKEN`` with one of them (401, no body,
otherwise); pages reach the WebSocket with ``?token=`` and ``--token`` only.

    routes = pending_routes()      # Route objects, before the static mount
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictBool, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .config import ServerConfig
from .pending import DEFAULT_LIMIT, DEFAULT_REJECT_CODE, Answer, InvalidQuery, PendingCalls

logger = logging.getLogger(__name__)

# A body larger than this is refused before it is parsed: an output is at most
# max_result_bytes, and the rest of a body is a few short fields.
_BODY_SLACK = 64 * 1024
_MAX_CODE = 64


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ResolveBody(_Body):
    output: JsonValue


class ApproveBody(_Body):
    approved: StrictBool
    reason: str | None = None


class RejectBody(_Body):
    message: str
    code: Annotated[str, Field(min_length=1, max_length=_MAX_CODE)] = DEFAULT_REJECT_CODE


def authorized(request: Request, config: ServerConfig) -> bool:
    """Does the request carry ``Authorization: Bearer`` with a configured token (constant time)?"""
    tokens = [t for t in (config.token, config.admin_token) if t is not None]
    if not tokens:
        return True
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        given = ""
    found = False
    for token in tokens:
        # Every token is compared, so the time does not tell which one matched.
        found |= hmac.compare_digest(given.strip().encode(), token.encode())
    return found


def _message(status: int, message: str) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=status)


def _answer(answer: Answer) -> JSONResponse:
    return JSONResponse(answer.body(), status_code=answer.status)


def _pending(request: Request) -> PendingCalls:
    pending: PendingCalls = request.app.state.pending
    return pending


def _refused(request: Request) -> Response | None:
    if authorized(request, request.app.state.config):
        return None
    return Response(status_code=401, headers={"WWW-Authenticate": "Bearer"})


async def list_executions(request: Request) -> Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    query = request.query_params
    raw_limit = query.get("limit", str(DEFAULT_LIMIT))
    try:
        limit = int(raw_limit)
    except ValueError:
        return _message(422, f"limit must be an integer, not {raw_limit[:32]!r}")
    try:
        executions = await _pending(request).executions(
            status=query.get("status") or None,
            session=query.get("session"),
            limit=limit,
            before=query.get("before") or None,
        )
    except InvalidQuery as exc:
        return _message(422, str(exc))
    return JSONResponse({"executions": executions})


async def get_execution(request: Request) -> Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    execution_id: str = request.path_params["execution_id"]
    found = await _pending(request).execution(execution_id)
    if found is None:
        return _message(404, f"no execution {execution_id[:64]!r}")
    return JSONResponse(found)


async def _read_json(request: Request, limit: int) -> Any:
    body = bytearray()
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen <= limit:
            body += chunk
        elif seen > 4 * limit:
            break  # stop reading: the connection is then reset, not drained forever
    if seen > limit:
        # Read to the end (up to 4 x the limit) so the client gets this answer
        # instead of a reset connection.
        raise ValueError(f"the body is larger than {limit:,} bytes")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"the body is not JSON: {exc}") from exc


def _shape_problem(error: ValidationError) -> str:
    problems = []
    for item in error.errors()[:5]:
        where = ".".join(str(part) for part in item["loc"]) or "body"
        problems.append(f"{where}: {item['msg']}")
    return "the body is not the expected shape: " + "; ".join(problems)


_BODIES: dict[str, type[_Body]] = {
    "resolve": ResolveBody,
    "approve": ApproveBody,
    "reject": RejectBody,
}


async def settle_step(request: Request) -> Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    execution_id: str = request.path_params["execution_id"]
    raw_seq: str = request.path_params["seq"]
    action: str = request.path_params["action"]
    pending = _pending(request)
    shape = _BODIES.get(action)
    if shape is None:
        return _message(404, f"no action {action[:32]!r}: resolve, approve or reject")
    if not raw_seq.isascii() or not raw_seq.isdigit() or len(raw_seq) > 18:
        return _message(404, f"no step {raw_seq[:32]!r} in execution {execution_id[:64]!r}")
    seq = int(raw_seq)
    # Before the body is read: a missing step is a 404 whatever the body.
    missing = await pending.find_step(execution_id, seq)
    if isinstance(missing, Answer):
        return _answer(missing)
    config: ServerConfig = request.app.state.config
    try:
        raw = await _read_json(request, config.max_result_bytes + _BODY_SLACK)
        body = shape.model_validate(raw)
    except ValueError as exc:
        message = _shape_problem(exc) if isinstance(exc, ValidationError) else str(exc)
        return JSONResponse({"outcome": "invalid", "message": message}, status_code=422)
    if isinstance(body, ResolveBody):
        answer = await pending.resolve(execution_id, seq, body.output)
    elif isinstance(body, ApproveBody):
        answer = await pending.approve(execution_id, seq, body.approved, body.reason)
    else:
        assert isinstance(body, RejectBody)
        answer = await pending.reject(execution_id, seq, body.message, body.code)
    if answer.ok:
        logger.info("step %s of execution %s: %s over HTTP", seq, execution_id, action)
    return _answer(answer)


def pending_routes() -> list[Route]:
    """The routes, to be placed before any catch-all mount (static files at ``/``)."""
    return [
        Route("/executions", list_executions, methods=["GET"]),
        Route("/executions/{execution_id}", get_execution, methods=["GET"]),
        Route("/executions/{execution_id}/steps/{seq}/{action}", settle_step, methods=["POST"]),
    ]
