"""Figure 5: the reference server under 100 concurrent fake pages, ledger on against ledger off.

"Ledger on" is `clienttools-server --db FILE`: the SQLite ledger, every step
committed (WAL, synchronous=NORMAL). "Ledger off" is the default without
`--db`: app.py still records steps, in SQLite's `:memory:`, so "off" means
no durable store, which is what a deployment without `--db` runs.

The server runs as a subprocess (`python -m clienttools_server`) and the load
as another (`python -m bench.fleet`), so neither shares an interpreter with the
other. Besides wall time per invoke, the server's own CPU time (from
/proc/PID/stat) is read, which a busy machine disturbs less.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import bounded

ROOT = Path(__file__).resolve().parent.parent
SERVER_START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, or None where /proc is not there."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # Fields 14 and 15 of stat(5), counted after the ")" that ends the command name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the server did not start listening in time")


def measure(
    ledger: bool, clients: int, invokes: int, server_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """One fleet run against a fresh server; the fleet's numbers plus the server's CPU.

    ``server_env`` adds to the server's environment (PYTHONPATH=... runs other code).
    """
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="clienttools-bench-") as tmp:
        command = [
            sys.executable,
            "-m",
            "clienttools_server",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        if ledger:
            command += ["--db", str(Path(tmp) / "ledger.sqlite3")]
        env = {**os.environ, **(server_env or {})}
        server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
        try:
            _wait_listening(port, server)
            cpu_before = _cpu_seconds(server.pid)
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.fleet",
                    f"ws://127.0.0.1:{port}/agents/chat",
                    "--clients",
                    str(clients),
                    "--invokes",
                    str(invokes),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=bounded.current().timeout(600),
            )
            cpu_after = _cpu_seconds(server.pid)
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    if done.returncode != 0:
        raise RuntimeError(f"the fleet failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if cpu_before is not None and cpu_after is not None:
        # Includes the server's idle work while clients connect; tiny next to the chats.
        result["server_cpu_per_invoke_ms"] = (cpu_after - cpu_before) / result["invokes"] * 1000
    return result
