"""Comparing UI message streams of two runs of the same chat.

A run draws its own ids (the message id, the tool call ids), so two runs of one
chat differ only there; ``normalized`` replaces them with placeholders numbered
by first sight, so transcripts compare equal exactly when everything else is.

    assert normalized(resumed.chunks) == normalized(undisturbed.chunks)
"""

from __future__ import annotations

from typing import Any


def normalized(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chunks with the ids a run draws (message, tool calls) numbered by first sight."""
    ids: dict[str, str] = {}
    out = []
    for chunk in chunks:
        chunk = dict(chunk)
        if "messageId" in chunk:
            chunk["messageId"] = "message"
        if "toolCallId" in chunk:
            chunk["toolCallId"] = ids.setdefault(chunk["toolCallId"], f"call-{len(ids)}")
        out.append(chunk)
    return out
