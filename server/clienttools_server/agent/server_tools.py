"""Tools that run in the server process, next to the browser tools of each session.

>>> tools = default_server_tools()
>>> sorted(tools)
['server_time']
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue
from pydantic_ai import RunContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from ..clock import SYSTEM_CLOCK, Clock
from .journal import JsonObject, ToolFailure

# Arguments go to the tool as the model sent them; the tool checks them itself.
ANY_ARGS = SchemaValidator(schema=core_schema.any_schema())
# A model that keeps sending arguments a tool refuses gets this many retries (page tools too).
MAX_RETRIES = 3


@dataclass(frozen=True, slots=True)
class ServerTool:
    name: str
    description: str
    input_schema: JsonObject
    run: Callable[[JsonObject], Awaitable[JsonValue]]
    needs_approval: bool = False


class ServerToolset(AbstractToolset[Any]):
    """The server tools as a pydantic-ai toolset; ``needs_approval`` ones ask for approval."""

    def __init__(self, tools: Mapping[str, ServerTool]) -> None:
        self.tools = dict(tools)

    @property
    def id(self) -> str:
        return "clienttools-server-tools"

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            tool.name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=tool.name,
                    parameters_json_schema=dict(tool.input_schema),
                    description=tool.description,
                    kind="unapproved" if tool.needs_approval else "function",
                ),
                max_retries=MAX_RETRIES,
                args_validator=ANY_ARGS,
            )
            for tool in self.tools.values()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        return await self.tools[name].run(tool_args)


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
