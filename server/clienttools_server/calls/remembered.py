"""S2: the tools each session's pages registered, remembered after the pages left.

A call to a tool of the session waits for the next page that registers it
instead of failing. Bounded, so a stream of session names cannot grow the
server without limit: the least recently used session is forgotten first (its
calls then fail as unknown_tool).

    >>> from clienttools.protocol import ToolSpec
    >>> remembered = RememberedTools()
    >>> remembered.remember("s1", {"t": ToolSpec(name="t", description="", inputSchema={})})
    >>> remembered.get("s1", "t").name, remembered.get("s2", "t")
    ('t', None)

The ledger keeps them too (``Ledger.remember_tools``), so that a run started or
resumed after a restart, or taken over by another process, before any page of its
session is back still offers the model the session's tools (``Pages.recall``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from clienttools.protocol import MAX_TOOLS_PER_CONNECTION, ToolSpec

MAX_REMEMBERED_SESSIONS = 10_000
MAX_REMEMBERED_TOOLS = 4 * MAX_TOOLS_PER_CONNECTION


class RememberedTools:
    """session -> tool name -> the spec a page of the session registered last."""

    def __init__(
        self,
        max_sessions: int = MAX_REMEMBERED_SESSIONS,
        max_tools: int = MAX_REMEMBERED_TOOLS,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_tools = max_tools
        self._known: OrderedDict[str, dict[str, ToolSpec]] = OrderedDict()

    def remember(self, session: str, specs: Mapping[str, ToolSpec]) -> None:
        """Remember the newest specs of the session's tools (registered now, or recalled)."""
        known = self._known.pop(session, {})
        for name, spec in specs.items():
            known.pop(name, None)  # re-inserted last: the newest registrations survive the cap
            known[name] = spec
        while len(known) > self.max_tools:
            del known[next(iter(known))]
        self._known[session] = known
        while len(self._known) > self.max_sessions:
            self._known.popitem(last=False)

    def knows(self, session: str) -> bool:
        """Whether a page of the session registered here, or its tools were recalled."""
        return session in self._known

    def get(self, session: str, name: str) -> ToolSpec | None:
        known = self._known.get(session)
        return None if known is None else known.get(name)

    def of(self, session: str) -> dict[str, ToolSpec]:
        """Every remembered spec of the session (a copy)."""
        return dict(self._known.get(session, {}))
