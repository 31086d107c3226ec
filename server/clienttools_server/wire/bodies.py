"""An HTTP request's body, read up to a limit: the one reader of every route that takes one.

    body = await bounded_body(request, limit)   # raises BodyTooLarge past `limit` bytes

A body over the limit is still read on, up to four times the limit, so the client
gets the route's answer instead of a reset connection; past that (or when its
Content-Length already says so) reading stops.
"""

from __future__ import annotations

from starlette.requests import Request


class BodyTooLarge(ValueError):
    """The body passed the route's limit; the message says the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is larger than {limit:,} bytes")


async def bounded_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > 4 * limit:
        raise BodyTooLarge(limit)
    body = bytearray()
    seen = 0
    async for part in request.stream():
        seen += len(part)
        if seen <= limit:
            body += part
        elif seen > 4 * limit:
            break  # stop reading: the connection is then reset, not drained forever
    if seen > limit:
        raise BodyTooLarge(limit)
    return bytes(body)
