"""The MicroPython flavour's tools: `Tool` (declared schemas) and `ToolTable` (the registry).

MicroPython keeps no annotations or docstrings and has no pydantic, so a tool
declares its JSON schemas (checked and compiled by input_schema.py) and its
description, where function_schema.py builds them from a signature for the
Pyodide flavour. `ToolTable` is what the core (core.py) asks of a registry: the
tools in registration order, by name, as wire specs. mpy.py's `ToolClient`
registers into one; both names are exported there too.

Plain Python that MicroPython 1.27 runs (no typing, no dataclasses: see mpy.py).
"""

from collections import OrderedDict

from clienttools import portable, rules
from clienttools.context import InvalidInput, InvalidOutput, ToolContext, json_problem
from clienttools.input_schema import compile_schema, is_number

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

__all__ = ["Tool", "ToolTable"]

_EMPTY_SCHEMA = {"type": "object", "properties": {}}


class Tool:
    """One registered tool: the function, its wire spec, how to call it."""

    def __init__(
        self,
        function: "Callable[..., Any]",
        *,
        name: "str | None" = None,
        description: str = "",
        schema: "dict[str, Any] | None" = None,
        output_schema: "dict[str, Any] | None" = None,
        timeout: "float | None" = None,
        needs_approval: bool = False,
        context: bool = False,
        read_only: bool = False,
    ) -> None:
        name = name or str(getattr(function, "__name__", ""))
        if not rules.is_tool_name(name):
            raise ValueError(f"tool name {name!r} must match {rules.TOOL_NAME_PATTERN}")
        schema = _EMPTY_SCHEMA if schema is None else schema
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise TypeError(f'the schema of tool {name!r} must be a dict with "type": "object"')
        if output_schema is not None and not isinstance(output_schema, dict):
            raise TypeError(f"the output_schema of tool {name!r} must be a dict")
        if timeout is not None and not (is_number(timeout) and timeout > 0):
            raise ValueError(f"the timeout of tool {name!r} must be a positive number")
        problem = json_problem(schema) or json_problem(output_schema)
        if problem is not None:
            raise TypeError(f"the schemas of tool {name!r} must be JSON: {problem}")
        self.function = function
        # Compiled once: an invoke runs the checker, it does not walk the schema.
        self.check_input = compile_schema(schema)
        self.check_output = None if output_schema is None else compile_schema(output_schema)
        self.name = name
        self.description = description
        self.schema = schema
        self.output_schema = output_schema
        self.timeout = timeout
        self.needs_approval = needs_approval
        self.context = context
        self.read_only = read_only  # WebMCP's readOnlyHint (webmcp.py), not in the wire spec

    def spec(self) -> "dict[str, Any]":
        """The ToolSpec of the tools frame."""
        spec: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.schema,
        }
        if self.output_schema is not None:
            spec["outputSchema"] = self.output_schema
        if self.needs_approval:
            spec["needsApproval"] = True
        if self.timeout is not None:
            spec["timeoutMs"] = max(1, int(self.timeout * 1000))
        return spec

    def call(self, arguments: "dict[str, Any]", context: "ToolContext | None") -> "Any":
        """Call the function; an async tool returns its coroutine, not yet started."""
        if self.context:
            return self.function(ctx=context, **arguments)
        return self.function(**arguments)

    @property
    def wire_spec(self) -> "dict[str, Any]":
        """The ToolSpec of the tools frame."""
        return self.spec()

    def validate_input(self, arguments: "dict[str, Any]") -> "dict[str, Any]":
        """C2: the arguments, when they pass the schema; else raises InvalidInput."""
        errors = self.check_input(arguments)
        if errors:
            rules.drop_missing_inputs(errors)
            raise InvalidInput(rules.invalid_input_message(self.name, errors), errors)
        return arguments

    def dump_output_json(self, value: object) -> str:
        """C5: the value as JSON text, checked against the output schema; else InvalidOutput."""
        problem = json_problem(value)
        if problem is None and self.check_output is not None:
            errors = self.check_output(value)
            if errors:
                where = "; ".join(_where(e) for e in errors[:3])
                problem = f"a value that does not match its output schema: {where}"
        if problem is None:
            return portable.dumps(value)
        js_value = _describe_js(value)
        if js_value is not None:
            raise InvalidOutput(
                f"tool {self.name!r} returned {js_value}, which cannot be serialized to JSON; "
                "copy out the fields you need"
            )
        raise InvalidOutput(f"tool {self.name!r} returned {problem}")

    def __repr__(self) -> str:
        return f"<Tool {self.name!r}>"


def _describe_js(value: object) -> "str | None":
    """`a JsProxy of a JavaScript HTMLBodyElement`, as the Pyodide flavour says it; else None."""
    if type(value).__name__ != "JsProxy":
        return None
    try:
        return f"a JsProxy of a JavaScript {value.constructor.name}"  # type: ignore[attr-defined]
    except Exception:
        return "a JsProxy"


def _where(error: "dict[str, Any]") -> str:
    place = ".".join(str(p) for p in error["loc"]) or "output"
    return place + ": " + str(error["msg"])


class ToolTable:
    """The registered tools, in registration order: what the core asks of a registry."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = OrderedDict()

    def get(self, name: str) -> "Tool | None":
        return self._tools.get(name)

    def wire_specs(self) -> "list[dict[str, Any]]":
        return [tool.spec() for tool in self._tools.values()]

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def remove(self, name: str) -> None:
        del self._tools[name]

    def as_dict(self) -> "dict[str, Tool]":
        return OrderedDict(self._tools)

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def __iter__(self) -> "Iterator[Tool]":
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)
