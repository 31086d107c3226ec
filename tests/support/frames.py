"""Hypothesis strategies for the wire frames of docs/protocol.md, valid and hostile.

Valid frames are built from the pydantic models in `clienttools.protocol` and
serialized with `dump_frame`, so they always parse. `mutated_frames(base)` turns
a valid frame into something a peer might really receive: wrong field types,
missing and extra fields, huge strings, deep nesting, broken JSON, non-objects,
binary, unknown types, unicode edge cases. Every strategy yields exactly what
goes on the wire: `str` (a text frame) or `bytes` (a binary frame).

    from hypothesis import given
    from tests.support.frames import mutated_frames, valid_server_frames

    @given(mutated_frames(valid_server_frames()))
    def test_client_survives(wire: str | bytes) -> None:
        client.feed(wire)            # must log and ignore, never raise (C13)

`mutated_frames(base, kinds=["binary", "deep_nesting"])` restricts the mutation
kinds (names in `MUTATIONS`). Huge strings (up to ~2 MB) are deliberately rare.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Iterable
from random import Random
from typing import Any, TypeVar, get_args

from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, SearchStrategy

from clienttools import protocol as p

#: A few frames no peer should send (not JSON, not an object, wrong types, binary): a
#: client survives each and sends nothing back (C13).
MALFORMED_FRAMES: tuple[str | bytes, ...] = (
    "not json",
    "[]",
    "{}",
    '{"type": 5}',
    '{"type": "cf_agent_nonsense"}',
    '{"type": "cf_agent_client_tool_invoke"}',
    '{"type": "cf_agent_client_tool_cancel", "requestId": 7}',
    '{"type": "cf_agent_ping"}',
    b"\x00\x01binary",
    '{"type": "cf_agent_client_tool_result_ack", "requestId": "x", "outcome": "weird"}',
)

# --- JSON building blocks ---------------------------------------------------------------

# JavaScript loses integer precision past 2**53, so "ordinary" ints stay inside it.
json_scalars: SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)


def json_values(max_leaves: int = 8) -> SearchStrategy[Any]:
    """Any JSON value, kept small so valid frames stay far below the 1 MiB limit."""
    return st.recursive(
        json_scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(st.text(max_size=10), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def json_objects(max_size: int = 4) -> SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.text(max_size=10), json_values(), max_size=max_size)


request_ids: SearchStrategy[str] = st.one_of(
    st.uuids().map(str),
    st.text(min_size=1, max_size=64),
    st.text(alphabet="ab", min_size=256, max_size=256),  # the longest allowed
)
short_ids: SearchStrategy[str] = st.text(min_size=1, max_size=40)
tool_names: SearchStrategy[str] = st.from_regex(p.TOOL_NAME_PATTERN, fullmatch=True)
finite_floats: SearchStrategy[float] = st.floats(allow_nan=False, allow_infinity=False)


def _optional(strategy: SearchStrategy[Any]) -> SearchStrategy[Any]:
    return st.none() | strategy


json_schemas: SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({"type": "object"}),
    st.builds(
        lambda props, required: {
            "type": "object",
            "properties": {k: {"type": t} for k, t in props.items()},
            "required": [k for k in props if k in required],
        },
        st.dictionaries(
            st.text(min_size=1, max_size=8),
            st.sampled_from(["string", "integer", "number", "boolean", "array", "object", "null"]),
            max_size=4,
        ),
        st.sets(st.text(min_size=1, max_size=8), max_size=3),
    ),
    json_objects(),  # inputSchema is any object on the wire; the server judges it
)

ui_messages: SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {
        "id": short_ids,
        "role": st.sampled_from(["user", "assistant", "system"]),
        "parts": st.lists(
            st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=40)}),
            max_size=3,
        ),
    }
)


def _chunk(kind: str, **fields: SearchStrategy[Any]) -> SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"type": st.just(kind), **fields})


ui_message_chunks: SearchStrategy[dict[str, Any]] = st.one_of(
    _chunk("start", messageId=short_ids),
    _chunk("start-step"),
    _chunk("text-start", id=short_ids),
    _chunk("text-delta", id=short_ids, delta=st.text(max_size=40)),
    _chunk("text-end", id=short_ids),
    _chunk("tool-input-start", toolCallId=short_ids, toolName=tool_names),
    _chunk("tool-input-available", toolCallId=short_ids, toolName=tool_names, input=json_objects()),
    _chunk("tool-approval-request", approvalId=short_ids, toolCallId=short_ids),
    _chunk("tool-output-available", toolCallId=short_ids, output=json_values()),
    _chunk("tool-output-error", toolCallId=short_ids, errorText=st.text(max_size=40)),
    _chunk("tool-output-denied", toolCallId=short_ids),
    _chunk("finish-step"),
    _chunk("finish"),
    _chunk("error", errorText=st.text(max_size=40)),
    _chunk("abort"),
)

# --- models -----------------------------------------------------------------------------

M = TypeVar("M", bound=p.WireModel)


def _model(cls: type[M], **fields: SearchStrategy[Any]) -> SearchStrategy[M]:
    """`cls(**drawn fields)` by Python field name.

    Not st.builds: pydantic's synthesized signature names parameters by their
    camelCase alias, so builds would infer (and prefer) its own values for them.
    """
    return st.fixed_dictionaries(fields).map(lambda kwargs: cls(**kwargs))


tool_specs: SearchStrategy[p.ToolSpec] = _model(
    p.ToolSpec,
    name=tool_names,
    description=st.text(max_size=60),
    input_schema=json_schemas,
    output_schema=_optional(json_schemas),
    needs_approval=_optional(st.booleans()),
    timeout_ms=_optional(st.integers(1, 10**7)),
)
tool_errors: SearchStrategy[p.ToolErrorInfo] = _model(
    p.ToolErrorInfo,
    code=st.sampled_from(get_args(p.ErrorCode)),
    message=st.text(max_size=60),
    data=json_values(),
)


def valid_client_models() -> SearchStrategy[p.WireModel]:
    """Every client-to-server frame type, as a model instance."""
    return st.one_of(
        _model(
            p.ClientToolsFrame,
            client_id=short_ids,
            tools=st.lists(tool_specs, max_size=4),
        ),
        # Exactly one of output (null included) or error.
        _model(p.ToolResultFrame, request_id=request_ids, output=json_values()),
        _model(p.ToolResultFrame, request_id=request_ids, error=tool_errors),
        _model(
            p.ToolProgressFrame,
            request_id=request_ids,
            progress=finite_floats,
            total=_optional(finite_floats),
            message=_optional(st.text(max_size=40)),
        ),
        _model(
            p.ToolApprovalFrame,
            tool_call_id=short_ids,
            approved=st.booleans(),
            reason=_optional(st.text(max_size=40)),
        ),
        _model(p.PongFrame, t=finite_floats),
        _model(
            p.SendFrame,
            request_id=request_ids,
            id=short_ids,
            trigger=st.sampled_from(get_args(p.ChatTrigger)),
            message_id=_optional(short_ids),
            messages=st.lists(ui_messages, max_size=3),
            headers=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=3),
            body=json_objects(),
            metadata=json_values(),
        ),
        _model(
            p.ResumeFrame,
            request_id=request_ids,
            id=short_ids,
            last_sequence=_optional(st.integers(0, 10**6)),
            headers=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=3),
            body=json_objects(),
            metadata=json_values(),
        ),
        _model(p.AbortFrame, request_id=request_ids),
    )


def valid_server_models() -> SearchStrategy[p.WireModel]:
    """Every server-to-client frame type, as a model instance."""
    return st.one_of(
        _model(
            p.ToolsAckFrame,
            accepted=st.lists(tool_names, max_size=4),
            rejected=st.lists(
                _model(p.RejectedTool, name=st.text(max_size=70), reason=st.text(max_size=40)),
                max_size=3,
            ),
        ),
        _model(
            p.InvokeFrame,
            request_id=request_ids,
            tool_call_id=short_ids,
            tool_name=tool_names,
            input=json_objects(),
            timeout_ms=_optional(st.integers(0, 10**7)),
            attempt=st.integers(1, 100),
        ),
        _model(
            p.CancelFrame,
            request_id=request_ids,
            reason=st.sampled_from(get_args(p.CancelReason)),
        ),
        _model(
            p.ResultAckFrame,
            request_id=request_ids,
            outcome=st.sampled_from(get_args(p.AckOutcome)),
            message=_optional(st.text(max_size=40)),
        ),
        _model(p.PingFrame, t=finite_floats),
        _model(
            p.ProtocolErrorFrame,
            message=st.text(max_size=60),
            request_id=_optional(request_ids),
        ),
        _model(p.StartFrame, request_id=request_ids),
        _model(
            p.ChunkFrame,
            request_id=request_ids,
            sequence=st.integers(0, 10**6),
            chunk=ui_message_chunks,
        ),
        _model(p.EndFrame, request_id=request_ids),
        _model(p.ErrorFrame, request_id=request_ids, error_text=_optional(st.text(max_size=40))),
        _model(p.NoActiveFrame, request_id=request_ids),
    )


def valid_client_frames() -> SearchStrategy[str]:
    """Wire text of a valid client-to-server frame (parse_client_frame accepts it)."""
    return valid_client_models().map(p.dump_frame)


def valid_server_frames() -> SearchStrategy[str]:
    """Wire text of a valid server-to-client frame (parse_server_frame accepts it)."""
    return valid_server_models().map(p.dump_frame)


# --- mutations --------------------------------------------------------------------------

Path = tuple[str | int, ...]
Wire = str | bytes

# Spliced into dumped JSON in place of a raw snippet that json.dumps cannot produce.
_SLOT = "__clienttools_mutation_slot_5c1e__"
_SLOT_JSON = json.dumps(_SLOT)

_SAMPLE_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**64,
    -(2**63) - 1,
    1.5,
    -0.0,
    1e308,
    "",
    "x",
    "1",
    "true",
    [],
    [1, "a"],
    {},
    {"a": 1},
]


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _paths(value: Any, prefix: Path = (), depth: int = 0) -> list[Path]:
    """Paths to every value down to depth 4 (the first 5 items of each list)."""
    if depth >= 4:
        return []
    out: list[Path] = []
    items: Iterable[tuple[str | int, Any]]
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value[:5])
    else:
        return out
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key), depth + 1))
    return out


def _get(obj: Any, path: Path) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _set(obj: Any, path: Path, value: Any) -> None:
    _get(obj, path[:-1])[path[-1]] = value


def _draw_path(rnd: Random, obj: dict[str, Any], *, top_bias: bool = True) -> Path | None:
    paths = _paths(obj)
    if not paths:
        return None
    # Half the time a top-level field: those are what parsers dispatch on.
    if top_bias and rnd.random() < 0.5:
        top = [pth for pth in paths if len(pth) == 1]
        if top:
            return rnd.choice(top)
    return rnd.choice(paths)


def _splice(obj: Any, path: Path | None, raw_json: str) -> str:
    """Dump `obj` with the value at `path` (or a new top-level key) replaced by raw JSON text."""
    if path is None or not path:
        if isinstance(obj, dict):
            obj["x"] = _SLOT
        else:
            return raw_json
    else:
        _set(obj, path, _SLOT)
    return json.dumps(obj).replace(_SLOT_JSON, raw_json, 1)


def _wrong_type(draw: DrawFn, rnd: Random, obj: dict[str, Any]) -> Wire:
    for _ in range(rnd.randint(1, 3)):  # sometimes several fields at once
        path = _draw_path(rnd, obj)
        if path is None:
            break
        current = _get(obj, path)
        choices = [v for v in _SAMPLE_VALUES if _json_kind(v) != _json_kind(current)]
        # A copy: the shared sample must not be mutated, nor end up inside itself.
        _set(obj, path, copy.deepcopy(rnd.choice(choices)))
    return json.dumps(obj)


def _missing_field(draw: DrawFn, rnd: Random, obj: dict[str, Any]) -> Wire:
    for _ in range(rnd.randint(1, 2)):
        path = _draw_path(rnd, obj)
        if path is None:
            break
        parent = _get(obj, path[:-1])
        del parent[path[-1]]
    return json.dumps(obj)


_EXTRA_KEYS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["requestID", "request_id", "__proto__", "constructor", "Type", "type "]),
)


def _extra_field(draw: DrawFn, rnd: Random, obj: dict[str, Any]) -> Wire:
    dicts: list[Path] = [()]
    dicts += [pth for pth in _paths(obj) if isinstance(_get(obj, pth), dict)]
    for _ in range(rnd.randint(1, 3)):
        target = _get(obj, rnd.choice(dicts))
        target.setdefault(draw(_EXTRA_KEYS), draw(json_values(4)))
    return json.dumps(obj)


def _huge_string(draw: DrawFn, rnd: Random, obj: dict[str, Any]) -> Wire:
    # Byte sizes around the 1 MiB frame limit; multi-byte characters make chars != bytes.
    size = rnd.choice([70_000, 500_000, 1_048_000, 1_048_577, 2_000_000])
    char = rnd.choice(["a", "\u00e9", "\U0001f600", "\\"])
    # Size on the wire: "\\" is escaped to two bytes, the others travel raw (ensure_ascii=False).
    wire_bytes = len(json.dumps(char, ensure_ascii=False).encode("utf-8")) - 2
    count = max(1, size // wire_bytes)
    path = _draw_path(rnd, obj)
    if path is None or rnd.random() < 0.5:
        obj[rnd.choice(["x", "message", "requestId", "type"])] = char * count
    else:
        _set(obj, path, char * count)
    return json.dumps(obj, ensure_ascii=False)


def _deep_nesting(draw: DrawFn, rnd: Random, obj: dict[str, Any]) -> Wire:
    depth = rnd.choice([100, 999, 1000, 3000, 10_000, rnd.randint(2, 5000)])
    if rnd.random() < 0.5:
        nested = "[" * depth + "1" + "]" * depth
    else:
        nested = '{"a":' * depth + "1" + "}" * depth
    if rnd.randint(0, 9) == 0:
        return nested  # the whole frame
    return _splice(obj, _draw_path(rnd, obj), nested)


_INVALID_JSON = [
    "truncate",
    "garble",
    "trailing_comma",
    "single_quotes",
    "nan",
    "comment",
    "empty",
    "bom",
    "two_objects",
    "bare_word",
    "unterminated_string",
    "bad_escape",
]
_BARE_WORDS = ["undefined", "None", "01", "+1", ".5", "0x10"]
_BAD_ESCAPES = ['"\\x41"', '"\\u12"', '"\\q"', '"a\nb"']


def _invalid_json(draw: DrawFn, rnd: Random, obj: dict[str, Any]) -> Wire:
    text = json.dumps(obj)
    how = rnd.choice(_INVALID_JSON)
    if how == "truncate":
        return text[: rnd.randint(0, max(0, len(text) - 1))]
    if how == "garble":
        i = rnd.randint(0, max(0, len(text) - 1))
        return text[:i] + rnd.choice(list('{}[],:"\\')) + text[i + 1 :]
    if how == "trailing_comma":
        return text[:-1] + ",}"
    if how == "single_quotes":
        return text.replace('"', "'")
    if how == "nan":
        # Not JSON by RFC 8259, yet Python's json accepts these tokens.
        return _splice(obj, _draw_path(rnd, obj), rnd.choice(["NaN", "Infinity", "-Infinity"]))
    if how == "comment":
        return "// frame\n" + text
    if how == "empty":
        return rnd.choice(["", " ", "\n", "\t\r\n"])
    if how == "bom":
        return "\ufeff" + text
    if how == "two_objects":
        return text + text
    if how == "bare_word":
        return _splice(obj, _draw_path(rnd, obj), rnd.choice(_BARE_WORDS))
    if how == "unterminated_string":
        return text[:-2] + '"abc'
    return _splice(obj, _draw_path(rnd, obj), rnd.choice(_BAD_ESCAPES))


def _non_object(draw: DrawFn, rnd: Random, obj: dict[str, Any]) -> Wire:
    values: list[Any] = [None, True, 0, 1.5, "send", [], [obj], list(obj.values()), json.dumps(obj)]
    return json.dumps(rnd.choice(values))


def _binary(draw: DrawFn, rnd: Random, obj: dict[str, Any]) -> Wire:
    text = json.dumps(obj)
    how = rnd.randint(0, 3)
    if how == 0:
        return text.encode("utf-8")  # a valid frame, but sent as binary
    if how == 1:
        return text.encode("utf-16")
    if how == 2:
        return b""
    return draw(st.binary(max_size=64))


_ALL_TYPES = sorted(p.CLIENT_FRAME_TYPES | p.SERVER_FRAME_TYPES)


def _unknown_type(draw: DrawFn, rnd: Random, obj: dict[str, Any]) -> Wire:
    current = str(obj.get("type", ""))
    how = rnd.randint(0, 2)
    if how == 0:
        obj["type"] = draw(st.text(max_size=20))
    elif how == 1:
        # The other direction's types are unknown here; this direction's are known.
        mine = p.CLIENT_FRAME_TYPES if current in p.CLIENT_FRAME_TYPES else p.SERVER_FRAME_TYPES
        obj["type"] = rnd.choice([t for t in _ALL_TYPES if t not in mine])
    else:
        near = [current.upper(), current + " ", " " + current, current[:-1], "x" * 100_000]
        obj["type"] = rnd.choice(near)
    return json.dumps(obj)


# Raw JSON string literals: the escapes a JSON parser must decode and a UTF-8 encoder may choke on.
_UNICODE_LITERALS = [
    '"\\ud800"',
    '"\\udfff"',
    '"a\\udc00\\ud800b"',
    '"\\ud83d"',  # half an emoji
    '"\\u0000"',
    '"nul\\u0000inside"',
    '"\\uffff\\ufffe"',
    '"\\ufeff"',
    '"\\u202eevil"',
    '"\\u2028\\u2029"',
    '"e\\u0301"',
]
# Raw (unescaped) characters in the Python str; a lone surrogate can travel only this way in a str.
_UNICODE_RAW = ["\ud800", "\x00", "\U0001f600", "\u0085", "\u00a0", "\U0010ffff"]


def _unicode(draw: DrawFn, rnd: Random, obj: dict[str, Any]) -> Wire:
    if rnd.random() < 0.5:
        literal = rnd.choice(_UNICODE_LITERALS)
    else:
        literal = json.dumps(rnd.choice(_UNICODE_RAW), ensure_ascii=False)
    if rnd.randint(0, 3) == 0:
        # A weird key rather than a weird value.
        return json.dumps(obj)[:-1] + ("," if obj else "") + literal + ':"v"}'
    return _splice(obj, _draw_path(rnd, obj), literal)


_MUTATORS: dict[str, Callable[[DrawFn, Random, dict[str, Any]], Wire]] = {
    "wrong_type": _wrong_type,
    "missing_field": _missing_field,
    "extra_field": _extra_field,
    "huge_string": _huge_string,
    "deep_nesting": _deep_nesting,
    "invalid_json": _invalid_json,
    "non_object": _non_object,
    "binary": _binary,
    "unknown_type": _unknown_type,
    "unicode": _unicode,
}
MUTATIONS: tuple[str, ...] = tuple(_MUTATORS)
# How often each kind is drawn relative to the others: huge strings cost megabytes, keep them rare.
_WEIGHTS = {kind: 4 for kind in MUTATIONS} | {"huge_string": 1}


def mutated_frames(
    base: SearchStrategy[str] | str, *, kinds: Iterable[str] | None = None
) -> SearchStrategy[Wire]:
    """A valid frame (from `base`) after one mutation kind: what a hostile or buggy peer sends."""
    chosen = list(MUTATIONS if kinds is None else kinds)
    unknown = set(chosen) - set(MUTATIONS)
    if unknown or not chosen:
        raise ValueError(f"unknown mutation kinds {sorted(unknown)}; use {list(MUTATIONS)}")
    pool_kinds = sorted(set(chosen))
    pool_weights = [_WEIGHTS[kind] for kind in pool_kinds]
    base_strategy = st.just(base) if isinstance(base, str) else base

    @st.composite
    def mutate(draw: DrawFn) -> Wire:
        text = draw(base_strategy)
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            obj = {"type": "cf_agent_ping", "t": 0}
        # Choices come from a Random seeded by the base frame and a drawn salt, not from
        # sampled_from or st.randoms: Hypothesis favours first options and zero seeds,
        # which made most mutations the same kind and hit the same field ("type").
        salt = draw(st.integers(0, 2**32))
        digest = hashlib.blake2b(f"{salt}:{text}".encode("utf-8", "surrogatepass")).digest()
        rnd = Random(int.from_bytes(digest[:8], "big"))
        return _MUTATORS[rnd.choices(pool_kinds, pool_weights)[0]](draw, rnd, obj)

    return mutate()
