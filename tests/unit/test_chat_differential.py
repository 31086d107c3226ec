"""The Python builder against the real ``ai`` package, stream by stream (rule C14).

Every stream in ``tests/chat_streams/`` goes through ``readUIMessageStream``
(``tests/node/read_ui_message_stream.mjs``, one Node process for the whole
corpus) and through ``MessageBuilder`` / ``ChatState``. The two final messages
must be equal as JSON with no normalization at all: ``UIMessage.to_wire()``
is meant to be exactly what ``JSON.stringify`` gives in the browser (absent
fields omitted, ``null`` kept where it is data), so any difference is a bug
on one side. Comparison is of parsed JSON, so key order does not matter.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import MISSING

from clienttools import protocol
from clienttools.chat import ChatState, MessageBuilder, UIMessage
from clienttools.partial_json import parse_partial_json

pytestmark = pytest.mark.node

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "node" / "read_ui_message_stream.mjs"
CORPUS = sorted((ROOT / "tests" / "chat_streams").glob("*.json"))
NODE = shutil.which("node")

if NODE is None:
    pytest.skip("node is not on PATH: cannot run the ai package", allow_module_level=True)


def _node(args: list[str], payload: Any) -> Any:
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(SCRIPT), *args],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        cwd=ROOT,  # resolves `ai` from /work/main/node_modules
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _load(path: Path) -> dict[str, Any]:
    stream: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return stream


@pytest.fixture(scope="module")
def node_results() -> dict[str, dict[str, Any]]:
    streams = [_load(path) for path in CORPUS]
    results = _node(["--batch"], streams)
    return {result["name"]: result for result in results}


def _first_message_id(chunks: list[dict[str, Any]]) -> str:
    # readUIMessageStream starts from id "" and takes the first start.messageId.
    for chunk in chunks:
        if chunk.get("type") == "start" and isinstance(chunk.get("messageId"), str):
            return str(chunk["messageId"])
    return ""


def test_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 12


def test_corpus_names_match_files() -> None:
    for path in CORPUS:
        assert _load(path)["name"] == path.stem


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_every_chunk_passes_the_ai_schema(
    path: Path, node_results: dict[str, dict[str, Any]]
) -> None:
    assert node_results[path.stem]["invalidChunks"] == []


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_builder_matches_read_ui_message_stream(
    path: Path, node_results: dict[str, dict[str, Any]]
) -> None:
    chunks = _load(path)["chunks"]
    builder = MessageBuilder(_first_message_id(chunks))
    for chunk in chunks:
        builder.apply(chunk)
    assert builder.message.to_wire() == node_results[path.stem]["message"]
    assert builder.ignored == 0 and builder.refused == 0


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_chat_state_matches_read_ui_message_stream(
    path: Path, node_results: dict[str, dict[str, Any]]
) -> None:
    """The same, through the frames: start, chunk 0..n, end."""
    chunks = _load(path)["chunks"]
    state = ChatState(chat_id="chat", id_factory=lambda: _first_message_id(chunks))
    state.begin_request("req", "hi")
    state.receive(protocol.StartFrame(request_id="req"))
    for sequence, chunk in enumerate(chunks):
        state.receive(protocol.ChunkFrame(request_id="req", sequence=sequence, chunk=chunk))
        assert state.status == "streaming"
    state.receive(protocol.EndFrame(request_id="req"))
    message = state.response_message
    assert message is not None
    assert message.to_wire() == node_results[path.stem]["message"]
    errors = node_results[path.stem]["errors"]
    assert state.status == ("error" if errors else "ready")
    assert state.error == (errors[-1] if errors else None)


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_node_message_round_trips_through_the_models(
    path: Path, node_results: dict[str, dict[str, Any]]
) -> None:
    wire = node_results[path.stem]["message"]
    assert UIMessage.model_validate(wire).to_wire() == wire


PARTIAL_DOCUMENTS = [
    '{"query": "caf\\u00e9 near", "tags": [true, false, null], "n": -12.5e3}',
    '[{"a": {"b": [1, 2, {"c": "x\\"y"}]}}, "tail", 0]',
    '{"empty": {}, "list": [], "t": true, "f": false, "z": null, "s": "\\n\\\\"}',
    '"just a string"',
    "-0.25",
]


def test_partial_json_matches_the_ai_package() -> None:
    prefixes = [doc[:i] for doc in PARTIAL_DOCUMENTS for i in range(len(doc) + 1)]
    expected = _node(["--partial-json"], prefixes)
    for text, want in zip(prefixes, expected, strict=True):
        got = parse_partial_json(text)
        if "value" in want:
            assert got == want["value"], text
        else:
            assert got is MISSING, text
