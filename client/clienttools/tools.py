"""Tools from plain functions: schema, input validation, output serialization.

A `ToolRegistry` turns annotated functions into `Tool`s. Everything a tool needs
at call time (the input model, the output adapter, the JSON schemas, the wire
`ToolSpec`) is built once, at registration, so an invoke costs one pydantic
validation, the call and one serialization.

    >>> registry = ToolRegistry()
    >>> @registry.tool
    ... def add(a: int, b: int = 1) -> int:
    ...     '''Add two integers.
    ...
    ...     Args:
    ...         a: The first addend.
    ...         b: The second addend.
    ...     '''
    ...     return a + b
    >>> tool = registry.get("add")
    >>> tool.spec.description, tool.spec.input_schema["required"]
    ('Add two integers.', ['a'])
    >>> kwargs = tool.validate_input({"a": 2})
    >>> tool.dump_output(tool.call(kwargs, context=None))  # no ToolContext parameter
    3

How a function becomes a tool is in function_schema.py (what a signature may
hold, how its docstring is read, which return values are validated); the name is
`name=` or the function's `__name__` and must match the protocol's
`TOOL_NAME_PATTERN`.

Running tools: `Tool.call` calls the function inline and returns its result,
or, for an `async def` tool, the coroutine for the caller to run. Pyodide's
main thread has no thread pool, so a sync tool blocks the page's event loop
until it returns and cannot be cancelled or timed out while it runs; only async
tools can be cancelled (asyncio cancellation at their next `await`). Long work
belongs in an `async def` that awaits now and then, e.g. `ctx.progress(...)`.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import types
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar, overload

from pydantic import (
    BaseModel,
    JsonValue,
    ValidationError,
)
from pydantic_core import PydanticSerializationError

from clienttools import protocol
from clienttools.context import InvalidInput, InvalidOutput, ToolContext, ToolError
from clienttools.function_schema import function_schema
from clienttools.observers import Observers
from clienttools.rules import drop_missing_inputs, invalid_input_message

if TYPE_CHECKING:
    # Imported where an adapter is made: pydantic imports this module on first use, and a
    # page whose tools have plain signatures needs none before the first invoke.
    from pydantic import TypeAdapter

__all__ = [
    "InvalidInput",
    "InvalidOutput",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "error_info",
]

F = TypeVar("F", bound=Callable[..., Any])

_NAME_RE: Final = re.compile(protocol.TOOL_NAME_PATTERN)


# --- errors -------------------------------------------------------------------------


class _Unserializable(Exception):
    """Raised by the serializer fallback so the error can name the offending type."""

    def __init__(self, value: object) -> None:
        self.type_name = type(value).__name__
        # Pyodide wraps JS values in JsProxy subclasses; the JS constructor's name
        # ("HTMLBodyElement") tells the developer far more than the proxy class.
        self.is_js = any(cls.__name__ == "JsProxy" for cls in type(value).__mro__)
        self.js_constructor: str | None = None
        if self.is_js:
            try:
                self.js_constructor = str(value.constructor.name)  # type: ignore[attr-defined]
            except Exception:
                self.js_constructor = None
        super().__init__(self.describe())

    def describe(self) -> str:
        if not self.is_js:
            return f"an object of type {self.type_name!r}"
        of = f" of a JavaScript {self.js_constructor}" if self.js_constructor else ""
        return f"a JsProxy{of} (type {self.type_name!r})"


def _is_js_null(value: object) -> bool:
    # Pyodide gives JS `null` as `pyodide.ffi.jsnull` (type JsNull), not None; a tool
    # that returns `localStorage.getItem(...)` for a missing key means JSON null.
    return type(value).__name__ == "JsNull"


def _refuse_unknown(value: Any) -> Any:
    # Pydantic calls this only for types it cannot serialize by itself (JS proxies,
    # DOM nodes, sockets, ...); its own message does not say what to do instead.
    if _is_js_null(value):
        return None
    raise _Unserializable(value)


def error_info(exc: BaseException) -> protocol.ToolErrorInfo:
    """The wire error for an exception raised by validating, running or dumping a tool.

    `ToolError` keeps its message and data; `InvalidInput` sends its errors as
    `data`; any other exception becomes `tool_error` with `data.exception` naming
    its type (C6).
    """
    if isinstance(exc, ToolError):
        return protocol.ToolErrorInfo(code="tool_error", message=exc.message, data=exc.data)
    if isinstance(exc, InvalidInput):
        errors: list[JsonValue] = list(exc.errors)
        return protocol.ToolErrorInfo(code="invalid_input", message=exc.message, data=errors)
    if isinstance(exc, InvalidOutput):
        return protocol.ToolErrorInfo(code="invalid_output", message=exc.message)
    name = type(exc).__name__
    return protocol.ToolErrorInfo(
        code="tool_error", message=str(exc) or name, data={"exception": name}
    )


# --- tools --------------------------------------------------------------------------


class Tool:
    """One function as a tool: its `spec` for the wire, and validate / call / dump.

    Build tools with `ToolRegistry.add` or the `ToolRegistry.tool` decorator;
    constructing a `Tool` directly does the same checks without registering it.
    """

    __slots__ = (
        "_context_param",
        "_fields",
        "_input_model",
        "_make_input_model",
        "_make_output",
        "_output",
        "_plain_outputs",
        "_spec",
        "_validate_output",
        "description",
        "function",
        "is_async",
        "name",
        "needs_approval",
        "read_only",
        "timeout",
        "wire_spec",
    )

    name: str
    description: str
    function: Callable[..., Any]
    is_async: bool
    timeout: float | None
    needs_approval: bool
    #: Reads and changes nothing: `readOnlyHint` on document.modelContext (webmcp.py).
    read_only: bool
    #: The spec as the tools frame carries it (camelCase keys, absent fields left out).
    wire_spec: dict[str, Any]

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        needs_approval: bool = False,
        read_only: bool = False,
    ) -> None:
        if isinstance(fn, type) or not callable(fn):
            raise TypeError(
                f"a tool must be a function (def or async def), got {type(fn).__name__} {fn!r}"
            )
        if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
            raise TypeError(
                f"a tool must be a function (def or async def), got {type(fn).__name__}; "
                f"wrap it in an annotated def"
            )
        tool_name = fn.__name__ if name is None else name
        if not _NAME_RE.match(tool_name):
            raise ValueError(
                f"tool name {tool_name!r} is invalid: it must match {protocol.TOOL_NAME_PATTERN} "
                f"(a letter or '_', then up to 63 letters, digits, '_' or '-'); "
                f"pass a valid name, e.g. name='my_tool'"
            )
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"tool {tool_name!r}: generator functions are not supported; "
                f"return a list instead of yielding items"
            )
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(
                f"tool {tool_name!r}: timeout must be a positive number of seconds, got {timeout!r}"
            )

        schema = function_schema(fn, tool_name)
        self.name = tool_name
        self.description = schema.description if description is None else description
        self.function = fn
        self.is_async = schema.is_async
        self.timeout = timeout
        self.needs_approval = needs_approval
        self.read_only = read_only
        self._context_param = schema.context_parameter
        self._input_model = schema.input_model
        self._make_input_model = schema.make_input_model
        self._fields = schema.fields
        self._output = schema.output_adapter
        self._make_output = schema.make_output_adapter
        self._validate_output = schema.validate_output
        self._plain_outputs = schema.plain_outputs
        timeout_ms = None if timeout is None else max(1, round(timeout * 1000))
        self._spec: protocol.ToolSpec | None = None
        if isinstance(self.description, str) and type(needs_approval) is bool:
            # What ToolSpec would dump, written directly: building the ToolSpec model
            # (its validator and serializer) was a tenth of a page's start-up, and the
            # tools frame needs only this (`spec` builds the model on first use).
            wire: dict[str, Any] = {
                "name": tool_name,
                "description": self.description,
                "inputSchema": schema.input_schema,
            }
            if schema.output_schema is not None:
                wire["outputSchema"] = schema.output_schema
            wire["needsApproval"] = needs_approval
            if timeout_ms is not None:
                wire["timeoutMs"] = timeout_ms
            self.wire_spec = wire
        else:  # a value ToolSpec refuses: let it say so, as it always did
            self._spec = protocol.ToolSpec(
                name=tool_name,
                description=self.description,
                input_schema=schema.input_schema,
                output_schema=schema.output_schema,
                needs_approval=needs_approval,
                timeout_ms=timeout_ms,
            )
            self.wire_spec = self._spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        size = protocol.json_size(self.wire_spec)
        if size > protocol.MAX_TOOL_SPEC_BYTES:
            raise ValueError(
                f"tool {tool_name!r}: its spec is {size} bytes, over the "
                f"{protocol.MAX_TOOL_SPEC_BYTES}-byte limit servers accept; shorten the "
                f"docstring or simplify the parameter types"
            )

    @property
    def spec(self) -> protocol.ToolSpec:
        """The tool's `ToolSpec` (the wire model of `wire_spec`), built on first use."""
        if self._spec is None:
            self._spec = protocol.ToolSpec.model_validate(self.wire_spec, by_alias=True)
        return self._spec

    @property
    def input_model(self) -> type[BaseModel]:
        """The generated pydantic model of the input (fields aliased by parameter name).

        For a signature of plain parameters it is built on first use (the first
        invoke), not at registration: see `function_schema._plain_input_schema`.
        """
        if self._input_model is None:
            self._input_model = self._make_input_model()
        return self._input_model

    @property
    def output_adapter(self) -> TypeAdapter[Any]:
        """The adapter that validates (when the return is annotated) and dumps the output.

        Made on first use for a return that is unannotated or of a plain type: a value
        of exactly that type never needs it (`function_schema._PLAIN_TYPES`).
        """
        if self._output is None:
            self._output = self._make_output()
        return self._output

    @property
    def context_parameter(self) -> str | None:
        """The name of the parameter that receives the ToolContext, if any."""
        return self._context_param

    def validate_input(self, input: Mapping[str, Any]) -> dict[str, Any]:
        """Validate the model's JSON input; return keyword arguments (without the context).

        Raises InvalidInput with pydantic's errors: missing, wrong-typed or unknown
        arguments.
        """
        # Lax python-mode validation of the already-parsed JSON. For values that
        # came out of `json.loads` (str, int, float, bool, None, list, dict) lax
        # python mode accepts and coerces exactly what lax JSON mode would
        # ("3" -> 3, "2024-01-01" -> date, list -> tuple, "red" -> Color.RED), and
        # it skips re-dumping the input to text per call. Strict python mode is not
        # an option: it refuses a str for a date or a dict for a dataclass.
        input_model = self._input_model or self.input_model
        try:
            model = input_model.model_validate(input)
        except ValidationError as exc:
            raise self._invalid_input(exc) from None
        values = model.__dict__
        return {pname: values[internal] for internal, pname in self._fields}

    def _invalid_input(self, exc: ValidationError) -> InvalidInput:
        # Through JSON text: `ctx` may hold exception objects, `input` any python
        # value, even NaN/Infinity (python's json.loads accepts them in frames);
        # those come back as the strings "NaN"/"Infinity" so the errors stay JSON.
        errors: list[dict[str, JsonValue]] = json.loads(
            exc.json(include_url=False), parse_constant=str
        )
        drop_missing_inputs(errors)
        return InvalidInput(invalid_input_message(self.name, errors), errors)

    def call(self, arguments: dict[str, Any], context: ToolContext | None) -> Any:
        """Call the function with validated `arguments`, injecting `context` where declared.

        Returns the value, or for an async tool the coroutine (not yet started).
        Exceptions raised by a sync tool propagate.
        """
        if self._context_param is None:
            return self.function(**arguments)
        return self.function(**arguments, **{self._context_param: context})

    def dump_output(self, value: Any) -> JsonValue:
        """The return value as JSON-ready python data; raises InvalidOutput.

        Validates against the return annotation when there is one. The result is
        guaranteed to pass `json.dumps(..., allow_nan=False)`.
        """
        return self._dump_output(value)[0]

    def dump_output_json(self, value: Any) -> str:
        """The return value as the compact JSON text a result frame carries; raises InvalidOutput.

        The same checks as `dump_output`, and the text comes from the check itself, so
        a result is encoded once.
        """
        return self._dump_output(value)[1]

    def _dump_output(self, value: Any) -> tuple[JsonValue, str]:
        if type(value) in self._plain_outputs:
            return value, self._dump_json(value, protocol.plain_json)
        if _is_js_null(value):
            value = None
        if isinstance(value, (Iterator, types.CoroutineType, types.AsyncGeneratorType)):
            if isinstance(value, types.CoroutineType):
                value.close()  # never awaited; closing avoids a RuntimeWarning at GC
            raise InvalidOutput(
                f"tool {self.name!r} returned a {type(value).__name__} object, which is "
                f"not JSON; return the data itself (e.g. a list, not an iterator)"
            )
        output = self._output
        if output is None:
            output = self.output_adapter
        if self._validate_output:
            try:
                value = output.validate_python(value)
            except ValidationError as exc:
                where = protocol.describe_validation_error(exc)
                raise InvalidOutput(
                    f"tool {self.name!r} returned a value that does not match its return "
                    f"annotation: {where}"
                ) from None
        try:
            out: JsonValue = output.dump_python(
                value, mode="json", fallback=_refuse_unknown, warnings="error"
            )
        except _Unserializable as exc:
            fix = (
                "convert it with .to_py() or copy out the fields you need"
                if exc.is_js
                else "return plain data (str, int, float, bool, None, list, dict) or a "
                "pydantic model or dataclass of them"
            )
            raise InvalidOutput(
                f"tool {self.name!r} returned {exc.describe()}, which cannot be serialized "
                f"to JSON; {fix}"
            ) from None
        except (PydanticSerializationError, ValueError, RecursionError) as exc:
            raise InvalidOutput(
                f"tool {self.name!r} returned a value that cannot be serialized to JSON: {exc}"
            ) from None
        return out, self._dump_json(out)

    def _dump_json(self, out: JsonValue, dump: Callable[[Any], str] = protocol.dump_json) -> str:
        try:
            return dump(out)
        except ValueError:
            raise InvalidOutput(
                f"tool {self.name!r} returned NaN or Infinity, which JSON cannot represent; "
                f"return None or a string instead"
            ) from None

    def __repr__(self) -> str:
        kind = "async " if self.is_async else ""
        return f"<Tool {self.name!r}: {kind}{getattr(self.function, '__qualname__', '?')}>"


# --- registry -----------------------------------------------------------------------


class ToolRegistry:
    """The tools of one client, by name, in registration order.

    >>> registry = ToolRegistry()
    >>> unsubscribe = registry.on_change(lambda: print("changed:", len(registry)))
    >>> registry.add(lambda: None, name="noop")
    changed: 1
    <Tool 'noop': <lambda>>
    >>> registry.remove("noop")
    changed: 0
    """

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._observers: Observers[[]] = Observers("registry on_change")

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        needs_approval: bool = False,
        read_only: bool = False,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        needs_approval: bool = False,
        read_only: bool = False,
    ) -> F | Callable[[F], F]:
        """Register a function as a tool: `@registry.tool` or `@registry.tool(name=...)`.

        Returns the function unchanged, so it stays callable and testable as is.
        """

        def register(f: F) -> F:
            self.add(
                f,
                name=name,
                description=description,
                timeout=timeout,
                needs_approval=needs_approval,
                read_only=read_only,
            )
            return f

        return register if fn is None else register(fn)

    def add(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        needs_approval: bool = False,
        read_only: bool = False,
    ) -> Tool:
        """Register `fn` and return its Tool.

        `read_only=True` says the tool changes nothing; it is the `readOnlyHint` a
        browser's agent sees on `document.modelContext` (not part of the wire spec).

        Raises ValueError for a bad or duplicate name (or a full registry) and
        TypeError for a signature that cannot be a tool.
        """
        tool_name = getattr(fn, "__name__", "") if name is None else name
        if tool_name in self._tools:
            raise ValueError(
                f"a tool named {tool_name!r} is already registered; pass another name, "
                f"e.g. name='{tool_name}_2', or remove the old one first"
            )
        if len(self._tools) >= protocol.MAX_TOOLS_PER_CONNECTION:
            raise ValueError(
                f"cannot register {tool_name!r}: servers accept at most "
                f"{protocol.MAX_TOOLS_PER_CONNECTION} tools per connection"
            )
        tool = Tool(
            fn,
            name=name,
            description=description,
            timeout=timeout,
            needs_approval=needs_approval,
            read_only=read_only,
        )
        self._tools[tool.name] = tool
        self._changed()
        return tool

    def remove(self, name: str) -> None:
        """Unregister a tool. Raises KeyError if there is none of that name."""
        if name not in self._tools:
            raise KeyError(f"no tool named {name!r}")
        del self._tools[name]
        self._changed()

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> list[protocol.ToolSpec]:
        """The specs of every tool, in registration order (the `tools` of the frame)."""
        return [tool.spec for tool in self._tools.values()]

    def wire_specs(self) -> list[dict[str, Any]]:
        """`specs()` as the tools frame carries them, without building the models."""
        return [tool.wire_spec for tool in self._tools.values()]

    def on_change(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback()` after every add and remove; returns an unsubscribe function.

        Callbacks run in subscription order; one that raises is logged and the
        rest still run (the change itself has happened).
        """
        return self._observers.subscribe(callback)

    def _changed(self) -> None:
        self._observers.notify()
