"""The tests' load balancer (tests/support/cluster.py) on real sockets, with echo backends."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator

from tests.support.cluster import Backend, Balancer, at_random, by_path
from tests.support.server_process import free_port


class Echo:
    """A backend that answers each line with its own name and the line."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self, port: int = 0) -> Backend:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        return Backend(self.name, self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while line := await reader.readline():
                writer.write(self.name.encode() + b" " + line)
                await writer.drain()
        except OSError:
            pass
        finally:
            self.writers.discard(writer)
            writer.close()

    async def crash(self) -> None:
        """Stop listening and drop every connection, as a killed process does."""
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        await self.server.wait_closed()


@contextlib.asynccontextmanager
async def backends(*names: str) -> AsyncIterator[tuple[list[Echo], list[Backend]]]:
    echoes = [Echo(name) for name in names]
    started = [await echo.start() for echo in echoes]
    try:
        yield echoes, started
    finally:
        for echo in echoes:
            if echo.server is not None and echo.server.is_serving():
                await echo.crash()


Connection = tuple[str, asyncio.StreamReader, asyncio.StreamWriter]


async def ask(balancer: Balancer, path: str) -> Connection:
    """Open a connection whose first line is an HTTP request line; the backend that answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", balancer.port)
    writer.write(f"GET {path} HTTP/1.1\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.readline(), 5.0)
    name, _, line = answer.decode().partition(" ")
    assert line == f"GET {path} HTTP/1.1\r\n"  # the bytes pass unchanged
    return name, reader, writer


async def dropped(reader: asyncio.StreamReader) -> bool:
    """True once the connection ends (EOF or reset) without another byte."""
    try:
        return await asyncio.wait_for(reader.read(), 5.0) == b""
    except ConnectionResetError:
        return True


async def test_connections_spread_at_random_and_skip_a_backend_that_refuses() -> None:
    dead = Backend("dead", free_port())  # nobody listens there: connects are refused
    async with (
        backends("a", "b", "c") as (_, started),
        Balancer([*started, dead], at_random(random.Random(3))) as balancer,
    ):
        answered: Counter[str] = Counter()
        for i in range(60):
            name, _, writer = await ask(balancer, f"/agents/chat/s{i}")
            answered[name] += 1
            writer.close()
        assert not balancer.errors, balancer.errors
    assert set(answered) == {"a", "b", "c"} and sum(answered.values()) == 60
    assert balancer.refused["dead"] > 0 and balancer.turned_away == 0
    assert all(name != "dead" for _, name in balancer.placed)


async def test_a_placement_holds_while_its_backend_lives_and_its_clients_drop_with_it() -> None:
    async with (
        backends("a", "b") as (echoes, started),
        Balancer(started, by_path({"/agents/chat/x": "b"})) as balancer,
    ):
        names = []
        for _ in range(5):
            name, _, writer = await ask(balancer, "/agents/chat/x")
            names.append(name)
            writer.close()
        name, reader, writer = await ask(balancer, "/agents/chat/x")
        held = balancer.holding("/agents/chat/x")
        await echoes[1].crash()
        # The client's connection drops with its backend; a new one lands elsewhere.
        gone = await dropped(reader)
        writer.close()
        again, _, writer = await ask(balancer, "/agents/chat/x")
        writer.close()
        assert not balancer.errors, balancer.errors
    assert names == ["b"] * 5 and name == "b"
    assert "b" in held and gone and again == "a"
    assert balancer.refused["b"] == 1
