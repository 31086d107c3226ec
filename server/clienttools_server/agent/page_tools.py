"""The tools a session's pages registered, as a pydantic-ai toolset (S2-S5).

Each tool the session's pages registered (``name``, ``description``,
``inputSchema`` as the parameters schema, ``outputSchema``, ``needsApproval``,
``timeoutMs``) reaches the model as an ordinary tool of the run. A call goes
through the browser-call proxy (:mod:`clienttools_server.calls.proxy`): invoked on the newest live
page that registered it, timed with progress, cancelled, re-delivered with
``attempt``, settled only by the connection invoked, its output checked
against ``outputSchema``; and it is a ledger step, so a run replayed after a
restart waits for the same call instead of making a new one.

How a browser outcome reaches the model (see docs/protocol.md):

- an output is the tool's return value;
- ``invalid_input`` is a retry prompt (pydantic-ai's ``ModelRetry``), so the
  model can fix its arguments and call again;
- a refused approval is a denied call;
- every other error (``tool_error``, ``timeout``, ``disconnected``, ...) is a
  failed tool result ``code: message`` the model reads and can tell the user.

With ``deferred`` (``--client-tools round-trip``) the tools are offered
without execution: a call ends the response with ``finishReason: tool-calls``
and the page sends the output in its next request, as the AI SDK's own
client-side tools do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from pydantic_ai import RunContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool

from clienttools.protocol import ToolSpec

from .journal import OfferedTool, RunJournal, tool_result
from .server_tools import ANY_ARGS, MAX_RETRIES


class PageTools(Protocol):
    """The tools of one session's pages, live or remembered (S2)."""

    async def specs(self) -> Mapping[str, ToolSpec]: ...


class PageToolset(AbstractToolset[Any]):
    """The page tools of one session for one run."""

    def __init__(self, pages: PageTools, journal: RunJournal, *, deferred: bool = False) -> None:
        self.pages = pages
        self.journal = journal
        self.deferred = deferred

    @property
    def id(self) -> str:
        return "clienttools-page-tools"

    async def tool_definitions(self) -> list[ToolDefinition]:
        specs = dict(await self.pages.specs())
        definitions = [definition(spec) for spec in specs.values()]
        # A call recorded before a restart still names its tool, registered again or not.
        for name in sorted(self.journal.recorded_client_tools - specs.keys()):
            definitions.append(ToolDefinition(name=name, description="a tool of the page"))
        for d in definitions:
            spec = specs.get(d.name)
            self.journal.catalog[d.name] = OfferedTool(
                "client", bool(spec and spec.needs_approval), spec
            )
        if self.deferred:
            self.journal.deferred_tools.update(d.name for d in definitions)
            definitions = [dataclasses.replace(d, kind="external") for d in definitions]
        return definitions

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            d.name: ToolsetTool(
                toolset=self, tool_def=d, max_retries=MAX_RETRIES, args_validator=ANY_ARGS
            )
            for d in await self.tool_definitions()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        planned = await self.journal.approved_call(ctx)
        return tool_result(await self.journal.run_client(planned))


def definition(spec: ToolSpec) -> ToolDefinition:
    """A registered page tool as pydantic-ai describes a tool to the model."""
    metadata: dict[str, Any] = {"clienttools": "page"}
    if spec.output_schema is not None:
        metadata["outputSchema"] = dict(spec.output_schema)
    if spec.timeout_ms:
        metadata["timeoutMs"] = spec.timeout_ms
    if spec.needs_approval:
        metadata["needsApproval"] = True
    return ToolDefinition(
        name=spec.name,
        parameters_json_schema=dict(spec.input_schema),
        description=spec.description,
        metadata=metadata,
    )
