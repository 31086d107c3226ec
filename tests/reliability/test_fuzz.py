"""Fuzzing with the frame strategies of tests/support/frames.py, seeded and reproducible.

- The client core (clienttools.session.Session, CPython): thousands of frames, valid
  and mutated; it never raises, and everything it sends is a valid client frame.
- A live server: hundreds of mutated client frames at one connection while another
  session runs ordinary calls through the real ToolClient. Every reply to the fuzzing
  connection is a valid server frame or a close with 1007/1008/1009; the server
  answers a probe after every case (no crash, nothing stuck); the other session's
  calls all complete with the right outputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from clienttools import protocol
from clienttools.session import (
    CancelTool,
    ChatFrameReceived,
    ReplaceConnection,
    RunTool,
    Session,
    ToolsAcknowledged,
)
from clienttools.tools import ToolRegistry
from clienttools_server.app import running_server
from clienttools_server.config import ServerConfig
from tests.reliability.harness import fuzz_beside_calls
from tests.reliability.results import Scenario
from tests.support.frames import (
    json_objects,
    mutated_frames,
    valid_client_frames,
    valid_server_frames,
)

pytestmark = pytest.mark.soak

# Closes a hostile frame may earn: invalid UTF-8 (1007), a flood (1008), over the limit (1009).
STRUCTURED_CLOSES = {1007, 1008, 1009}


def fuzz_settings(examples: int) -> settings:
    # Seeded (derandomize) and database-free: the same cases on every run and machine.
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


# --- the client core -----------------------------------------------------------------------


def _registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool
    def echo(value: Any = None) -> Any:
        """Return the value."""
        return value

    return registry


# Invokes of the one tool the page has, with any input: they reach validation and the run.
def _echo_invoke(rid: str, tool_input: dict[str, Any], timeout_ms: int | None) -> str:
    frame = protocol.InvokeFrame(
        request_id=rid, tool_call_id="c", tool_name="echo", input=tool_input,
        timeout_ms=timeout_ms, attempt=1,
    )  # fmt: skip
    return protocol.dump_frame(frame)


echo_invokes = st.builds(
    _echo_invoke,
    st.sampled_from(["r1", "r2", "r3"]),
    json_objects(),
    st.none() | st.integers(0, 5000),
)
server_wire = st.one_of(
    valid_server_frames(), mutated_frames(valid_server_frames()), echo_invokes, echo_invokes
)


KNOWN_EVENTS = (RunTool, CancelTool, ToolsAcknowledged, ChatFrameReceived, ReplaceConnection)


def test_client_core_survives_every_frame(scenario: Scenario, soak_factor: int) -> None:
    scenario.describe("fuzz", "client core (Session): valid and mutated server frames")
    kinds: Counter[str] = Counter()

    @fuzz_settings(600 * soak_factor)
    @given(st.lists(server_wire, min_size=1, max_size=12))
    def run(frames: list[str | bytes]) -> None:
        session = Session(_registry(), client_id="fuzz-page")
        session.connection_opened(0.0)
        sent = session.frames_to_send()
        now = 0.0
        for wire in frames:
            now += 0.5
            session.receive_frame(wire, now)  # C13: must never raise
            scenario.cases += 1
            for event in session.events():
                kinds[type(event).__name__] += 1
                assert isinstance(event, KNOWN_EVENTS)
                if isinstance(event, RunTool):
                    value = event.tool.call(event.arguments, event.context(None))
                    session.tool_returned(event.request_id, value)
            session.tick(now)
            sent += session.frames_to_send()
        for text in sent:
            frame = protocol.parse_client_frame(text)  # everything sent is a valid client frame
            kinds["sent " + frame.type] += 1

    run()
    scenario.iterations = 600 * soak_factor
    scenario.note(", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())))
    assert scenario.cases >= 2000


# --- a live server --------------------------------------------------------------------------


def draw_cases(count: int) -> list[str | bytes]:
    """`count` seeded cases of mutated client frames (hypothesis draws, no test run)."""
    cases: list[str | bytes] = []

    @fuzz_settings(count)
    @given(mutated_frames(valid_client_frames()))
    def collect(wire: str | bytes) -> None:
        cases.append(wire)

    collect()
    return cases


class FuzzPeer:
    """One hostile connection: sends a case, then a probe; checks every frame that comes back."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ws: ClientConnection | None = None
        self.closes: Counter[int | None] = Counter()
        self.replies: Counter[str] = Counter()
        self.bad: list[str] = []

    async def _connection(self) -> ClientConnection:
        if self.ws is None:
            self.ws = await connect(self.url, compression=None, max_size=None, open_timeout=10)
        return self.ws

    async def send_case(self, wire: str | bytes, index: int) -> None:
        ws = await self._connection()
        probe = f"probe-{index}"
        try:
            if isinstance(wire, bytes):
                await ws.send(wire)
            else:
                # A str may hold a lone surrogate; it goes out as the bytes a broken peer sends.
                await ws.send(wire.encode("utf-8", "surrogatepass"), text=True)
            await ws.send(
                json.dumps(
                    {"type": "resume", "requestId": probe, "id": f"nothing-{index}",
                     "headers": {}, "body": {}}
                )
            )  # fmt: skip
            async with asyncio.timeout(20):
                while True:
                    text = await ws.recv()
                    self._check(text)
                    frame = json.loads(text)
                    if frame.get("requestId") == probe and frame["type"] == "no-active":
                        return
        except ConnectionClosed:
            self.closes[ws.close_code] += 1
            if ws.close_code not in STRUCTURED_CLOSES:
                # Which case, and what it was: the server's log (warning and up) shows its side.
                kind = "binary" if isinstance(wire, bytes) else "text"
                self.bad.append(
                    f"case {index}: closed with {ws.close_code} after a {kind} frame of "
                    f"{len(wire)} characters: {wire[:120]!r}"
                )
            with contextlib.suppress(Exception):
                await ws.close()
            self.ws = None

    def _check(self, text: str | bytes) -> None:
        try:
            frame = protocol.parse_server_frame(text)
        except protocol.FrameError as exc:
            self.bad.append(f"unstructured reply {str(text)[:200]!r}: {exc.message}")
            return
        self.replies[frame.type] += 1

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


async def test_live_server_survives_mutated_frames(scenario: Scenario, soak_factor: int) -> None:
    scenario.describe("fuzz", "live server: mutated client frames, another session calling")
    count = 300 * soak_factor
    cases = await asyncio.to_thread(draw_cases, count)
    # Warnings and errors of the server (uvicorn's among them) show with a failure.
    config = ServerConfig(port=0, log_level="warning", tool_timeout=5.0)
    async with running_server(config) as server:
        fuzzer = FuzzPeer(server.ws_url("fuzz"))
        try:
            await fuzz_beside_calls(server, scenario, cases, fuzzer.send_case)
        finally:
            await fuzzer.close()
        scenario.iterations = len(cases)
        scenario.note(
            f"replies: {dict(fuzzer.replies)}; closes: "
            + ", ".join(f"{code}: {n}" for code, n in sorted(fuzzer.closes.items(), key=str))
        )
        assert not fuzzer.bad, fuzzer.bad[:5]
        assert scenario.cases == len(cases) >= count // 2
