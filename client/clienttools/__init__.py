"""clienttools: Python tools that live in the browser, called by a server-side agent.

from clienttools import ToolClient

client = ToolClient("ws://127.0.0.1:8000/agents/chat/demo")

@client.tool
def add(a: int, b: int) -> int:
    \"\"\"Add two integers.\"\"\"
    return a + b

await client.connect()
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from clienttools.client import ToolClient
from clienttools.tools import (
    InvalidInput,
    InvalidOutput,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
)
from clienttools.transport import (
    ConnectError,
    ConnectionFailed,
    RegistrationTimeout,
    ToolsRejected,
)

__version__ = "0.1.0"

# The chat layer is imported on first use: it is most of the SDK's import time, and a
# page that only hosts tools never needs it (cold start, bench/README.md).
_CHAT_NAMES = frozenset({"Chat", "ChatResponseError", "ChatStatus", "UIMessage"})

if TYPE_CHECKING:
    from clienttools.chat import Chat, ChatResponseError, ChatStatus, UIMessage


def __getattr__(name: str) -> Any:
    if name in _CHAT_NAMES:
        from clienttools import chat

        return getattr(chat, name)
    raise AttributeError(f"module 'clienttools' has no attribute {name!r}")


if sys.platform == "emscripten":  # in a page: the browser adapter, and logs to the console
    import clienttools.browser  # noqa: F401

__all__ = [
    "Chat",
    "ChatResponseError",
    "ChatStatus",
    "ConnectError",
    "ConnectionFailed",
    "InvalidInput",
    "InvalidOutput",
    "RegistrationTimeout",
    "Tool",
    "ToolClient",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolsRejected",
    "UIMessage",
    "__version__",
]
