"""bench/transports.py at its smallest: both transports carry every turn to its end."""

from __future__ import annotations

from bench.transports import compare


async def test_both_transports_complete_their_turns() -> None:
    result = await compare(lanes=2, turns=3, blocks=1, warmup=1)
    for kind in ("websocket", "http"):
        assert result[kind]["turns"] == 6
        assert result[kind]["server_cpu_per_turn_ms"] > 0
    assert result["ratio_http_to_websocket"]["turn_p50"] > 0
