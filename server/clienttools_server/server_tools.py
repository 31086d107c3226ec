"""Tools that run in the server process, next to the browser tools of each session.

>>> tools = default_server_tools()
>>> sorted(tools)
['server_time']
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import JsonValue

from .clock import SYSTEM_CLOCK, Clock
from .models import JsonObject, ToolDescription
from .runtime import ToolFailure


@dataclass(frozen=True, slots=True)
class ServerTool:
    name: str
    description: str
    input_schema: JsonObject
    run: Callable[[JsonObject], Awaitable[JsonValue]]
    needs_approval: bool = False

    def describe(self) -> ToolDescription:
        return ToolDescription(self.name, self.description, self.input_schema)


def default_server_tools(clock: Clock = SYSTEM_CLOCK) -> dict[str, ServerTool]:
    """The server tools of the reference server: ``server_time``."""

    async def server_time(tool_input: JsonObject) -> JsonValue:
        if tool_input:
            raise ToolFailure("invalid_input", "server_time takes no arguments")
        now = clock.now()
        iso = datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat()
        return {"unix": now, "iso": iso}

    tool = ServerTool(
        "server_time",
        "The server's current time, as Unix seconds and ISO 8601 (UTC).",
        {"type": "object", "properties": {}, "additionalProperties": False},
        server_time,
    )
    return {tool.name: tool}
