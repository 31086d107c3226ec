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

import importlib
from typing import TYPE_CHECKING, Any

from clienttools.client import ToolClient
from clienttools.rules import LocalProtocolError
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
# page that only hosts tools never needs it.
_LAZY_NAMES = {
    "Chat": "clienttools.chatclient",
    "ChatResponseError": "clienttools.chat",
    "ChatStatus": "clienttools.chat",
    "UIMessage": "clienttools.uimessage",
}

if TYPE_CHECKING:
    from clienttools.chat import ChatResponseError, ChatStatus
    from clienttools.chatclient import Chat
    from clienttools.uimessage import UIMessage


def __getattr__(name: str) -> Any:
    module = _LAZY_NAMES.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'clienttools' has no attribute {name!r}")


__all__ = [
    "Chat",
    "ChatResponseError",
    "ChatStatus",
    "ConnectError",
    "ConnectionFailed",
    "InvalidInput",
    "InvalidOutput",
    "LocalProtocolError",
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
