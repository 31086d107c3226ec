"""The reference server as a real OS process, for tests that kill or restart it.

server = ServerProcess(["--static", "examples", "--static", "build/web"]).start()
server.url                      # "http://127.0.0.1:<port>"
server.ws_url("demo")           # "ws://127.0.0.1:<port>/agents/chat/demo"
server.kill()                   # SIGKILL, as a crash would
server.start()                  # same port, same arguments (same --db)
server.stop()
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    def __init__(
        self, args: list[str], *, port: int | None = None, log: Path | None = None
    ) -> None:
        self.args = args
        self.port = port or free_port()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws_url(self, session: str) -> str:
        return f"ws://127.0.0.1:{self.port}/agents/chat/{session}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        command = [sys.executable, "-m", "clienttools_server", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--log-level", "warning", *self.args]
        if self.log is None:
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        else:
            with self.log.open("ab") as output:  # the child keeps its own descriptor
                self.process = subprocess.Popen(
                    command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT
                )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: {command}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"the server did not listen on {self.port} within {timeout} s")

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
