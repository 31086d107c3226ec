"""The CPython adapter: `transport.Connector` on the `websockets` library (asyncio API).

`ToolClient` uses it by itself outside Pyodide, which makes it possible to host
tools from a Python process, and to test the client against a real server:

    client = ToolClient("ws://127.0.0.1:8000/agents/chat/demo", connector=NativeConnector())

Needs the `native` extra: `pip install clienttools[native]`.
"""

from __future__ import annotations

from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI, WebSocketException

from clienttools import protocol
from clienttools.transport import ConnectionFailed

# The session refuses (and logs) frames over protocol.MAX_FRAME_BYTES without
# dropping the connection (C13). The library limit only stops a runaway peer.
SOCKET_MAX_MESSAGE_BYTES = 16 * protocol.MAX_FRAME_BYTES


class NativeSocket:
    """One `websockets` client connection as a `transport.Socket`."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection

    async def send(self, text: str) -> None:
        await self.connection.send(text)

    async def receive(self) -> str | bytes | None:
        try:
            return await self.connection.recv()
        except ConnectionClosed:
            return None

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.connection.close(code, reason)

    @property
    def close_code(self) -> int | None:
        return self.connection.close_code

    @property
    def close_reason(self) -> str:
        return self.connection.close_reason or ""


class NativeConnector:
    """Opens `websockets` connections; keyword arguments go to `websockets.asyncio.client.connect`.

    The library's keepalive pings stay on (they find a dead TCP connection even
    when the server sends no `cf_agent_ping`); `close_timeout` is short because
    the client reconnects right after dropping a connection.
    """

    def __init__(self, **connect_options: Any) -> None:
        self.connect_options: dict[str, Any] = {
            "max_size": SOCKET_MAX_MESSAGE_BYTES,
            "close_timeout": 2.0,
            **connect_options,
        }

    async def open(self, url: str, timeout: float) -> NativeSocket:
        try:
            connection = await connect(url, open_timeout=timeout, **self.connect_options)
        except InvalidURI as exc:
            raise ConnectionFailed(url, f"not a WebSocket URL ({exc.msg})") from None
        except InvalidStatus as exc:
            status = exc.response.status_code
            raise ConnectionFailed(
                url, f"the server answered HTTP {status} instead of opening a WebSocket"
            ) from None
        except TimeoutError:
            raise ConnectionFailed(url, f"no answer within {timeout:g} s") from None
        except ConnectionRefusedError:
            raise ConnectionFailed(url, "connection refused (is the server running?)") from None
        except OSError as exc:
            raise ConnectionFailed(url, f"unreachable ({exc.strerror or exc})") from None
        except WebSocketException as exc:
            raise ConnectionFailed(url, f"WebSocket handshake failed ({exc})") from None
        return NativeSocket(connection)
