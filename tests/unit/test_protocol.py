"""Wire models: what parses, what is refused, and that dumping gives camelCase JSON back."""

from __future__ import annotations

import json
import subprocess
import sys
import typing

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from clienttools import frames
from clienttools import protocol as p


def test_result_with_null_output_keeps_the_output_key() -> None:
    frame = p.parse_client_frame(
        '{"type":"cf_agent_client_tool_result","requestId":"r","output":null}'
    )
    assert isinstance(frame, p.ToolResultFrame)
    assert json.loads(p.dump_frame(frame)) == {
        "type": "cf_agent_client_tool_result",
        "requestId": "r",
        "output": None,
    }


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"type":"cf_agent_client_tool_result","requestId":"r"}', "exactly one of"),
        (
            '{"type":"cf_agent_client_tool_result","requestId":"r","output":1,'
            '"error":{"code":"timeout","message":"x"}}',
            "exactly one of",
        ),
        ('{"type":"cf_agent_pong","t":NaN}', "NaN is not a JSON value"),
        ('{"type":"cf_agent_pong","t":Infinity}', "Infinity is not a JSON value"),
        (
            '{"type":"cf_agent_client_tool_result","requestId":"r","output":"\\ud800"}',
            "lone UTF-16 surrogate",
        ),
        (
            '{"type":"cf_agent_client_tool_result","requestId":"r","output":{"\\udfff":1}}',
            "surrogate",
        ),
        ('{"type":"who_knows"}', "unknown frame type 'who_knows'"),
        ("[1, 2]", "must be a JSON object"),
        ("{", "not valid JSON"),
        ('{"type":"cf_agent_pong","t":"soon"}', "t: Input should be a valid number"),
    ],
)
def test_refused_frames_say_why(text: str, reason: str) -> None:
    with pytest.raises(p.FrameError, match=reason):
        p.parse_client_frame(text)


def test_escaped_surrogate_pairs_are_fine() -> None:
    frame = p.parse_client_frame(
        '{"type":"cf_agent_client_tool_result","requestId":"r","output":"\\ud83d\\ude00"}'
    )
    assert isinstance(frame, p.ToolResultFrame)
    assert frame.output == "\N{GRINNING FACE}"


def test_malformed_invoke_keeps_its_request_id() -> None:
    with pytest.raises(p.FrameError) as caught:
        p.parse_server_frame('{"type":"cf_agent_client_tool_invoke","requestId":"abc","input":[]}')
    assert caught.value.request_id == "abc"
    assert caught.value.frame_type == "cf_agent_client_tool_invoke"


def test_binary_and_oversize_frames_are_refused() -> None:
    with pytest.raises(p.FrameError, match="binary"):
        p.parse_server_frame(b"{}")
    with pytest.raises(p.FrameError, match="over the 100-byte limit"):
        p.parse_server_frame(
            '{"type":"cf_agent_ping","t":1,"pad":"' + "x" * 100 + '"}', max_bytes=100
        )


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    frame = p.parse_server_frame('{"type":"cf_agent_ping","t":3,"future":true}')
    assert frame == p.PingFrame(t=3)


@given(
    value=st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.lists(st.integers())
    )
)
@example(value=10**5000)  # longer than int's string limit: both refuse it
@example(value="lone \ud800 surrogate")
def test_plain_json_is_dump_json(value: object) -> None:
    try:
        expected = p.dump_json(value)
    except ValueError:
        with pytest.raises(ValueError):
            p.plain_json(value)
    else:
        assert p.plain_json(value) == expected


def test_wire_names_are_pydantics_camel_case() -> None:
    from pydantic.alias_generators import to_camel

    models = [
        m for m in vars(frames).values() if isinstance(m, type) and issubclass(m, p.WireModel)
    ]
    names = {name for m in models for name in m.model_fields}
    assert len(models) > 20 and "tool_call_id" in names
    for name in names:
        assert p.wire_name(name) == to_camel(name), name


def _union_types(union: object) -> frozenset[str]:
    members = typing.get_args(typing.get_args(union)[0])
    return frozenset(m.model_fields["type"].default for m in members)


def test_frame_types_are_the_unions_types() -> None:
    # Spelled out in protocol so that a frame of an unknown type is refused without the models.
    assert _union_types(p.ClientFrame) == p.CLIENT_FRAME_TYPES
    assert _union_types(p.ServerFrame) == p.SERVER_FRAME_TYPES


def test_protocol_hands_out_the_frame_models() -> None:
    assert p.InvokeFrame is frames.InvokeFrame
    assert set(frames.__all__) == p._FRAME_NAMES
    with pytest.raises(AttributeError, match="no attribute 'NoSuchFrame'"):
        p.NoSuchFrame  # noqa: B018


# A page sends the tools frame before any other: what that needs is start-up time (the
# SDK's share of cold start). Importing the SDK, registering a tool of plain parameters and
# writing the frame make no frame model and import no pydantic TypeAdapter; nor does the
# first tool frame parsed (the core reads it as a dict). In a fresh interpreter,
# since this one has them all.
START_UP = """
import sys
import pydantic
before = set(sys.modules)
import clienttools
client = clienttools.ToolClient("ws://127.0.0.1:1/agents/chat/profile")
@client.tool
def add(a: int, b: int) -> int:
    \"\"\"Add two integers.\"\"\"
    return a + b
client.session.connection_opened(0.0)
frame = client.session.frames_to_send()[0]
print(sorted(m for m in ("clienttools.frames", "pydantic.type_adapter") if m in sys.modules))
client.session.receive_frame('{"type":"cf_agent_ping","t":1}', 0.0)
print(sorted(m for m in ("clienttools.frames", "pydantic.type_adapter") if m in sys.modules))
print(frame)
"""


def test_the_tools_frame_needs_no_frame_model() -> None:
    done = subprocess.run(
        [sys.executable, "-c", START_UP], capture_output=True, text=True, check=True, timeout=60
    )
    before, after, frame = done.stdout.splitlines()
    assert before == "[]"
    assert after == "[]"  # the tool frames are parsed by the core, without the models
    assert json.loads(frame)["type"] == "cf_agent_client_tools"
