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
422 ``{"message"}``. Every route asks the app's authorizer
(:mod:`clienttools_server.wire.auth`; by default ``Authorization: Bearer`` with
``--token`` or ``--admin-token`` when either is set): refused, 401 with no
body. A principal sees and settles only the executions of its own sessions
(an operator every one); another's is a 404 word for word as for one that
does not exist (O1-O3).

    routes = pending_routes()      # Route objects, before the static mount
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictBool, ValidationError
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..calls.pending import (
    DEFAULT_LIMIT,
    DEFAULT_REJECT_CODE,
    MAX_LIMIT,
    Answer,
    InvalidQuery,
    PendingCalls,
)
from ..config import ServerConfig
from .auth import Principal, access, authorize, route_of, unauthorized
from .bodies import bounded_body

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


def _message(status: int, message: str) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=status)


def _answer(answer: Answer) -> JSONResponse:
    return JSONResponse(answer.body(), status_code=answer.status)


def _pending(request: Request) -> PendingCalls:
    pending: PendingCalls = request.app.state.pending
    return pending


def _not_found(execution_id: str) -> JSONResponse:
    # Word for word the answer for an execution that does not exist: another
    # principal's execution is one that does not exist, as far as the caller can tell (O1).
    return _message(404, f"no execution {execution_id[:64]!r}")


def listing_limit(query: QueryParams) -> int | Response:
    """A listing's ``limit`` (1 to MAX_LIMIT, DEFAULT_LIMIT when absent), else the 422."""
    # An empty parameter is one not given (a form, URLSearchParams): ?session=&limit=
    raw_limit = query.get("limit") or str(DEFAULT_LIMIT)
    try:
        limit = int(raw_limit)
    except ValueError:
        return _message(422, f"limit must be an integer, not {raw_limit[:32]!r}")
    if not 1 <= limit <= MAX_LIMIT:
        return _message(422, f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    return limit


async def list_executions(request: Request) -> Response:
    principal = await authorize(request)
    if principal is None:
        return unauthorized()
    query = request.query_params
    limit = listing_limit(query)
    if isinstance(limit, Response):
        return limit
    try:
        executions = await _pending(request).executions(
            status=query.get("status") or None,
            session=query.get("session") or None,
            limit=limit,
            before=query.get("before") or None,
            sessions=await access(request).sessions(principal),
        )
    except InvalidQuery as exc:
        return _message(422, str(exc))
    return JSONResponse({"executions": executions})


async def _visible(request: Request, principal: Principal, execution_id: str) -> bool:
    """Does the execution exist, in a session ``principal`` may use (O1, O3)?"""
    session = await _pending(request).session_of(execution_id)
    if session is None:
        return False
    return await access(request).allows(principal, session, route=route_of(request))


async def get_execution(request: Request) -> Response:
    principal = await authorize(request)
    if principal is None:
        return unauthorized()
    execution_id: str = request.path_params["execution_id"]
    if not await _visible(request, principal, execution_id):
        return _not_found(execution_id)
    found = await _pending(request).execution(execution_id)
    if found is None:
        return _not_found(execution_id)
    return JSONResponse(found)


async def _read_json(request: Request, limit: int) -> Any:
    body = await bounded_body(request, limit)  # BodyTooLarge is a ValueError too
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
    principal = await authorize(request)
    if principal is None:
        return unauthorized()
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
    if not await _visible(request, principal, execution_id):
        return _not_found(execution_id)
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
        logger.info(
            "step %s of execution %s: %s over HTTP by principal %r",
            seq, execution_id, action, principal.id,
        )  # fmt: skip
    return _answer(answer)


def pending_routes() -> list[Route]:
    """The routes, to be placed before any catch-all mount (static files at ``/``)."""
    return [
        Route("/executions", list_executions, methods=["GET"]),
        Route("/executions/{execution_id}", get_execution, methods=["GET"]),
        Route("/executions/{execution_id}/steps/{seq}/{action}", settle_step, methods=["POST"]),
    ]
