"""Several server processes on one PostgreSQL, behind a load balancer with no sticky sessions.

    async with Cluster(postgres.fresh_url(), tmp_path, 3, lease=3.0) as cluster:
        a, b, c = cluster.names                              # "a", "b", "c"
        cluster.balancer.pick = by_path({"/agents/chat/s1": "b"})
        page = await CountingPage.open(cluster.ws_url("s1"))  # through the balancer: lands on b
        chat = await ChatPeer.open(cluster.direct_url("a", "s1"))  # straight to one process
        cluster.balancer.holding("/agents/chat/s1")         # ["b"]: where its sockets are now
        await cluster.kill("b")                              # SIGKILL: the page goes elsewhere
        async with cluster.reader() as ledger: ...           # read the shared rows

Each process is ``python -m clienttools_server --db URL --lease L --agent ...``
on a port of its own (tests/support/server_process.py). The balancer is an
asyncio TCP proxy in the test's process, as any real one would be: each new
connection goes to a backend that ``pick`` chooses (at random by default)
among those that did not refuse it; a refused connect (a dead process) moves
on to the next. It reads the request line only to hand ``pick`` the path (a
test's placement); the bytes pass through unchanged. Sockets of a process
that dies drop, and their peers' reconnects land on another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import struct
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from clienttools.client import ToolClient
from clienttools.native import NativeConnector
from clienttools_server.agent.runs import RunRequest
from clienttools_server.ledger import Execution, Step
from clienttools_server.ledger.postgres import PostgresLedger
from tests.support.server_process import ServerProcess
from tests.support.wait import wait_until

#: The scripted model, counting its requests in a file the processes share.
COUNTED = "tests.server.lease_agents:counted"
NAMES = "abcdefgh"
HOST = "127.0.0.1"
CONNECT_TIMEOUT = 5.0
REQUEST_LINE_TIMEOUT = 10.0
CHUNK = 65536

#: Chooses the backend of a new connection: (request path, backends that may take it).
Pick = Callable[[str, Sequence["Backend"]], "Backend"]


@dataclass(frozen=True)
class Backend:
    name: str
    port: int


def at_random(rng: random.Random | None = None) -> Pick:
    """No stickiness at all: any backend, each connection drawn anew."""
    chooser = rng or random.Random()

    def pick(path: str, candidates: Sequence[Backend]) -> Backend:
        return chooser.choice(list(candidates))

    return pick


def by_path(placement: Mapping[str, str], rng: random.Random | None = None) -> Pick:
    """The named backend for these paths while it takes connections; any other else."""
    fallback = at_random(rng)

    def pick(path: str, candidates: Sequence[Backend]) -> Backend:
        wanted = placement.get(path)
        for backend in candidates:
            if backend.name == wanted:
                return backend
        return fallback(path, candidates)

    return pick


@dataclass(eq=False)
class Link:
    """One client connection and the backend connection it was piped to."""

    path: str
    backend: Backend
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter

    def abort(self) -> None:
        """RST on both sides, like a network failure."""
        for writer in (self.client, self.upstream):
            if writer.transport.is_closing():
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()


class Balancer:
    """A TCP load balancer in front of the backends; see the module docstring."""

    def __init__(self, backends: Sequence[Backend], pick: Pick | None = None) -> None:
        self.backends = list(backends)
        self.pick: Pick = pick or at_random()
        self.links: set[Link] = set()
        #: (path, backend name) of every connection placed, in order.
        self.placed: list[tuple[str, str]] = []
        #: connects a backend refused, by backend name
        self.refused: Counter[str] = Counter()
        #: connections no backend took
        self.turned_away = 0
        #: anything but a network failure: a test asserts it is empty
        self.errors: list[str] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> Balancer:
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> Balancer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def url(self, path: str) -> str:
        return f"ws://{HOST}:{self.port}{path}"

    def holding(self, path: str) -> list[str]:
        """The backends that hold an open connection for this path, by name."""
        return sorted(link.backend.name for link in self.links if link.path == path)

    def cut(self, backend: str | None = None) -> int:
        """Abort every open connection (to that backend): their peers reconnect."""
        doomed = [link for link in self.links if backend in (None, link.backend.name)]
        for link in doomed:
            link.abort()
        return len(doomed)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link: Link | None = None
        try:
            line = await asyncio.wait_for(reader.readline(), REQUEST_LINE_TIMEOUT)
            parts = line.split()
            path = parts[1].decode("latin-1") if len(parts) >= 2 else ""
            upstream = await self._connect(path)
            if upstream is None:
                self.turned_away += 1
                return
            backend, up_reader, up_writer = upstream
            link = Link(path, backend, writer, up_writer)
            self.links.add(link)
            self.placed.append((path, backend.name))
            up_writer.write(line)
            await up_writer.drain()
            # Either direction ending ends the connection: a WebSocket has no use for
            # half a socket, and a dead backend must drop its client at once.
            directions = [
                asyncio.create_task(_pipe(reader, up_writer)),
                asyncio.create_task(_pipe(up_reader, writer)),
            ]
            try:
                await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for direction in directions:
                    direction.cancel()
                await asyncio.gather(*directions, return_exceptions=True)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported to the test, never swallowed
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            if link is not None:
                self.links.discard(link)
                for side in (link.upstream, link.client):
                    side.close()
            else:
                writer.close()

    async def _connect(
        self, path: str
    ) -> tuple[Backend, asyncio.StreamReader, asyncio.StreamWriter] | None:
        candidates = list(self.backends)
        while candidates:
            backend = self.pick(path, candidates)
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(HOST, backend.port), CONNECT_TIMEOUT
                )
            except (OSError, TimeoutError):
                self.refused[backend.name] += 1
                candidates.remove(backend)
                continue
            return backend, up_reader, up_writer
        return None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()


class Cluster:
    """N server processes on one PostgreSQL schema, each on its own port, behind a Balancer."""

    def __init__(
        self,
        url: str,
        directory: Path,
        count: int = 3,
        *,
        lease: float = 10.0,
        agent: str = COUNTED,
        args: Sequence[str] = (),
        pick: Pick | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.db_url = url
        self.directory = directory
        self.lease = lease
        self.requests_file = directory / "requests.jsonl"
        self.names = list(NAMES[:count])
        environment = {"LEASE_AGENT_REQUESTS": str(self.requests_file), **(env or {})}
        command = ["--db", url, "--agent", agent, "--lease", f"{lease:g}", *args]
        self.processes = {
            name: ServerProcess(
                [*command, "--log-level", "info"],
                log=directory / f"server-{name}.log",
                env=environment,
            )
            for name in self.names
        }
        self.balancer = Balancer(
            [Backend(name, server.port) for name, server in self.processes.items()], pick
        )

    async def __aenter__(self) -> Cluster:
        try:
            # At once: the schema is created under an advisory lock, so they may race.
            await asyncio.gather(
                *(asyncio.to_thread(server.start) for server in self.processes.values())
            )
            await self.balancer.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        for name in self.names:
            self.resume(name)  # a paused process cannot stop
        await self.balancer.stop()
        await asyncio.gather(
            *(asyncio.to_thread(server.stop) for server in self.processes.values())
        )

    # -- addresses ---------------------------------------------------------------------

    def ws_url(self, session: str) -> str:
        """A session's socket URL through the balancer."""
        return self.balancer.url(f"/agents/chat/{session}")

    def direct_url(self, name: str, session: str) -> str:
        """A session's socket URL on one process, bypassing the balancer."""
        return self.processes[name].ws_url(session)

    # -- faults ------------------------------------------------------------------------

    def pid(self, name: str) -> int:
        process = self.processes[name].process
        assert process is not None, f"process {name} is not running"
        return process.pid

    async def kill(self, name: str) -> None:
        """SIGKILL, as a crash: its sockets drop, new connections skip it (refused)."""
        await asyncio.to_thread(self.processes[name].kill)

    def pause(self, name: str) -> None:
        os.kill(self.pid(name), signal.SIGSTOP)

    def resume(self, name: str) -> None:
        process = self.processes[name].process
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)

    def alive(self) -> list[str]:
        return [name for name, server in self.processes.items() if server.process is not None]

    def log(self, name: str) -> str:
        return (self.directory / f"server-{name}.log").read_text(errors="replace")

    # -- what was recorded -------------------------------------------------------------

    def reader(self) -> contextlib.AbstractAsyncContextManager[PostgresLedger]:
        """A ledger on the processes' database that only reads (see `reader`)."""
        return reader(self.db_url)

    def model_requests(self) -> Counter[tuple[str, int]]:
        """(first line of the prompt, model answers before) of every model request so far."""
        if not self.requests_file.exists():
            return Counter()
        lines = self.requests_file.read_text().splitlines()
        return Counter((str(a), int(b)) for a, b in map(json.loads, lines))


@contextlib.asynccontextmanager
async def reader(url: str) -> AsyncIterator[PostgresLedger]:
    """A ledger that only reads: it holds no lease, so it fences nothing and takes nothing."""
    async with await PostgresLedger.connect(url) as ledger:
        yield ledger


async def all_completed(ledger: PostgresLedger) -> bool:
    """Whether every execution in the ledger completed (a predicate for `wait_until`)."""
    return all(e.status == "completed" for e in await ledger.executions())


async def runs_by_chat(ledger: PostgresLedger) -> dict[str, Execution]:
    """Every execution by its chat id (chat ids are unique across a test's sessions)."""
    return {RunRequest.from_json(e.request_json).chat_id: e for e in await ledger.executions()}


def final_text(steps: list[Step]) -> str:
    """The text of a run's last model answer, as recorded."""
    events = [s for s in steps if s.kind == "model"][-1].result()
    assert isinstance(events, dict)
    return "".join(e.get("text", "") for e in events["events"])


def tool_outcomes(steps: list[Step]) -> list[object]:
    return [s.result() if s.state == "applied" else s.state for s in steps if s.kind == "tool"]


@dataclass(eq=False)
class CountingPage:
    """A page (the real ToolClient, native adapter) whose `work` tool counts its runs.

    `work(n, tag)` returns ``{"n": n, "sq": n * n}``, once ``gate`` (if given) is
    open. Its count is by (tag, n): a test gives each chat its own tag.
    """

    client: ToolClient
    gate: asyncio.Event | None = None
    executions: Counter[tuple[str, int]] = field(default_factory=Counter)
    running: set[tuple[str, int]] = field(default_factory=set)
    cancelled: set[tuple[str, int]] = field(default_factory=set)

    @classmethod
    async def open(
        cls, url: str, gate: asyncio.Event | None = None, **options: Any
    ) -> CountingPage:
        client = ToolClient(
            url, connector=NativeConnector(compression=None), connect_timeout=10.0, **options
        )
        page = cls(client, gate)

        @client.tool(name="work")
        async def work(n: int, tag: str = "") -> dict[str, int]:
            """Count this run, wait for the gate, return n and its square."""
            key = (tag, n)
            page.executions[key] += 1
            page.running.add(key)
            try:
                if page.gate is not None:
                    await page.gate.wait()
            except asyncio.CancelledError:
                page.cancelled.add(key)
                raise
            finally:
                page.running.discard(key)
            return {"n": n, "sq": n * n}

        await client.connect()
        return page

    def outbox_empty(self) -> bool:
        return not self.client.session.outbox()

    async def settle(self, timeout: float = 30.0) -> None:
        """Until every result of this page was acknowledged (nothing left to resend)."""
        await wait_until(self.outbox_empty, timeout, "the page's outbox to empty")

    async def close(self) -> None:
        await self.client.close()
