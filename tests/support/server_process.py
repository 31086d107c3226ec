"""The reference server as a real OS process, for tests that kill or restart it.

server = ServerProcess(["--static", "examples", "--static", "build/web"]).start()
server.url                      # "http://127.0.0.1:<port>"
server.ws_url("demo")           # "ws://127.0.0.1:<port>/agents/chat/demo"
server.kill()                   # SIGKILL, as a crash would
server.start("--ttl", "1")      # same port and arguments, plus these for this start
server.stop()

    async with running(servers):    # several at once, stopped (and woken if paused) at the end
        ...

``module`` runs another entry point with the same flags (tests.support.clocked_server).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    def __init__(
        self,
        args: list[str],
        *,
        port: int | None = None,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        module: str = "clienttools_server",
    ) -> None:
        self.args = args
        self.module = module
        self.port = port or free_port()
        self.log = log
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws_url(self, session: str) -> str:
        return f"ws://127.0.0.1:{self.port}/agents/chat/{session}"

    def start(self, *extra: str, timeout: float = 30.0) -> ServerProcess:
        """Start and wait until it accepts connections; `extra` arguments for this start only."""
        assert self.process is None, "already running"
        command = [sys.executable, "-m", self.module, "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--log-level", "warning", *self.args, *extra]
        with contextlib.ExitStack() as files:  # the child keeps its own descriptor
            output = (
                subprocess.DEVNULL if self.log is None else files.enter_context(self.log.open("ab"))
            )
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=output, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                code, self.process = self.process.returncode, None
                raise RuntimeError(f"the server exited with {code}{self._log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"the server did not listen within {timeout} s") from None
                time.sleep(0.05)

    def _log_tail(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return ":\n" + self.log.read_text(errors="replace")[-2000:]

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs, exactly like a crash."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process = None


@contextlib.asynccontextmanager
async def running(servers: list[ServerProcess]) -> AsyncIterator[list[ServerProcess]]:
    """Start ``servers`` one after the other (each starts beside the live ones); at the end
    wake any the test paused (SIGCONT) and stop them all."""
    try:
        for server in servers:
            await asyncio.to_thread(server.start)
        yield servers
    finally:
        for server in servers:
            if server.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server.process.pid, signal.SIGCONT)
        await asyncio.gather(*(asyncio.to_thread(server.stop) for server in servers))
