"""The page's tools for the browser's own agent too: `document.modelContext` (WebMCP).

WebMCP (the W3C webmachinelearning/webmcp draft) lets a page offer tools to the
agent built into the browser or an extension: `document.modelContext.registerTool(
{name, description, inputSchema, execute, annotations}, {signal})`, unregistered by
aborting the signal. With `ToolClient(url, webmcp=True)` every tool of the client is
registered there as well, and the browser's agent calls the very same Python
function, through the same input validation, output serialization, size limit and
error mapping as a call from the server (both flavours):

    client = ToolClient("ws://127.0.0.1:8000/agents/chat/demo", webmcp=True)

    @client.tool(read_only=True)          # annotations.readOnlyHint
    def page_title() -> str:
        '''The title of this page.'''
        return js.document.title

    client = ToolClient(webmcp=True)      # no server at all: the browser's agent only

What `execute` gives the browser's agent: an MCP `CallToolResult`, the shape the
draft's examples return and the polyfill's consumers (the MCP-B bridges) pass on
as is; a plain value would reach them wrapped with `isError: false`, and a thrown
error as the polyfill's own "Tool was executed but the invocation failed" text:

    {"content": [{"type": "text", "text": "5"}], "isError": false}
    {"content": [{"type": "text", "text": "{\\"answer\\": 42}"}],
     "structuredContent": {"answer": 42}, "isError": false}
    {"content": [{"type": "text", "text": "{\\"code\\": \\"invalid_input\\", ...}"}],
     "structuredContent": {"error": {"code": "invalid_input", ...}}, "isError": true}

The text of a result is the output's JSON (a string output: the string itself);
an object output is also `structuredContent`. An error is the protocol's
ToolError (`code`, `message`, `data`) as JSON text and as
`structuredContent.error`: `execute` never rejects, so nothing of it is lost.

What differs from a call by the server: a `ToolContext` has a `request_id` of
its own (`webmcp-1`, `webmcp-2`, ...) and `attempt` 1; `ctx.progress()` checks
its values as always but sends nothing (no server waits for it, and the draft
has no progress yet). A tool's `timeout=` is enforced (code `timeout`). Calls
are not kept in the outbox: the browser's agent awaits its promise, and a
reload ends it. Tools with `needs_approval=True` are not offered unless the
client says `webmcp_approval=True`: clienttools cannot ask the user on behalf of
the browser's agent, which has approvals of its own (or none).

`document.modelContext` is native in browsers that ship WebMCP; elsewhere a page
asks for the polyfill (npm `@mcp-b/webmcp-polyfill`, served from build/web):
`<script type="module" src="/webmcp/polyfill.mjs"></script>`. It fires
`clienttools:modelcontext` when the context is there, so the order in which it
and the page's Python start does not matter. The context exists only on a page's
main thread: in a worker `webmcp=True` raises `WebMCPUnavailable`.

This module runs on CPython, Pyodide and MicroPython 1.27 alike (the rules of
rules.py: no `typing`, `dataclasses`, `enum` or `from __future__`). The part
without I/O is the functions `model_context_tool`, `plan`, `output_result` and
`error_result`; `ModelContextMirror` is the adapter on `js`, and
`tool_runner` runs a call in either flavour, by the core's code.
"""

import asyncio
import json
import sys

from clienttools.rules import (
    MAX_RESULT_BYTES,
    cut_message,
    timeout_message,
    unknown_tool_message,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping, Sequence
    from typing import Any, TypeAlias

    #: How a call ended: (output JSON text, None) or (None, (code, message, data)).
    Outcome: TypeAlias = "tuple[str | None, tuple[str, str, Any] | None]"
    #: Runs one call: an Outcome at once (a sync tool), or a coroutine that gives one.
    Runner: TypeAlias = "Callable[[str, Any, str], Outcome | Coroutine[Any, Any, Outcome]]"

__all__ = [
    "READY_EVENT",
    "ModelContextMirror",
    "WebMCPUnavailable",
    "error_result",
    "model_context_tool",
    "output_result",
    "plan",
    "tool_runner",
]

#: Fired on the document by build/web/webmcp/polyfill.mjs once document.modelContext exists.
READY_EVENT = "clienttools:modelcontext"


class WebMCPUnavailable(Exception):
    """`webmcp=True` where no page's `document` exists: a worker, or CPython."""


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


# --- without I/O -------------------------------------------------------------------------


def model_context_tool(spec: "Mapping[str, Any]", read_only: bool) -> "dict[str, Any]":
    """The `registerTool` descriptor of a tool, without `execute`, from its wire ToolSpec.

    WebMCP refuses an empty description, so a tool without one is described by its
    name. `outputSchema` stays out: the draft has none, and MCP wants an object there.

        >>> model_context_tool({"name": "add", "description": "", "inputSchema": {}}, True)
        {'name': 'add', 'description': 'add', 'inputSchema': {}, 'annotations': {'readOnlyHint': True}}
    """  # noqa: E501
    return {
        "name": spec["name"],
        "description": spec["description"] or spec["name"],
        "inputSchema": spec["inputSchema"],
        "annotations": {"readOnlyHint": bool(read_only)},
    }


def plan(
    registered: "Mapping[str, str]", wanted: "Sequence[tuple[str, str]]"
) -> "tuple[list[str], list[str]]":
    """What to abort and what to register so `registered` becomes `wanted`.

    Both map a tool's name to its fingerprint (the descriptor's JSON): a tool whose
    fingerprint changed is aborted and registered again, in that order.

        >>> plan({"a": "1", "b": "1"}, [("b", "2"), ("c", "1")])
        (['a', 'b'], ['b', 'c'])
    """
    names = {}
    for name, fingerprint in wanted:
        names[name] = fingerprint
    aborts = [name for name in registered if names.get(name) != registered[name]]
    registers = [name for name, fingerprint in wanted if registered.get(name) != fingerprint]
    return aborts, registers


def output_result(output_json: str) -> str:
    """The CallToolResult (JSON text) of a tool's output, given as its JSON text.

    >>> output_result('"hi"')
    '{"content":[{"type":"text","text":"hi"}],"isError":false}'
    >>> output_result('{"a":1}')
    '{"content":[{"type":"text","text":"{\\\\"a\\\\":1}"}],"structuredContent":{"a":1},"isError":false}'
    """
    text = json.loads(output_json) if output_json.startswith('"') else output_json
    head = '{"content":[{"type":"text","text":' + _dumps(text) + "}]"
    if output_json.startswith("{"):  # MCP's structuredContent is an object
        head = head + ',"structuredContent":' + output_json
    return head + ',"isError":false}'


def error_result(code: str, message: str, data: "Any" = None) -> str:
    """The CallToolResult (JSON text) of a ToolError: `isError`, the error as text and data.

    Too much error data for a result is dropped, as it is from a result frame.

        >>> error_result("tool_error", "boom")
        '{"content":[{"type":"text","text":"{\\\\"code\\\\":\\\\"tool_error\\\\",\\\\"message\\\\":\\\\"boom\\\\"}"}],"structuredContent":{"error":{"code":"tool_error","message":"boom"}},"isError":true}'
    """
    error: dict[str, Any] = {"code": code, "message": cut_message(message)}
    if data is not None:
        error["data"] = data
    text = _dumps(error)
    if len(text) > MAX_RESULT_BYTES // 2:  # it goes out twice
        error = {"code": code, "message": error["message"] + " (error data too large)"}
        text = _dumps(error)
    return (
        '{"content":[{"type":"text","text":'
        + _dumps(text)
        + '}],"structuredContent":{"error":'
        + text
        + '},"isError":true}'
    )


def result_of(outcome: "Outcome") -> str:
    """The CallToolResult text of an Outcome."""
    output_json, error = outcome
    if error is not None:
        return error_result(error[0], error[1], error[2])
    return output_result(output_json or "null")


# --- running a call, in each flavour ----------------------------------------------------


def _ignore_progress(progress: float, total: "float | None", message: "str | None") -> None:
    pass  # no server waits for the progress of a call by the browser's agent


async def _awaited(
    coroutine: "Any",
    timeout: "float | None",
    name: str,
    finish: "Callable[[Any], Outcome]",
    raised: "Callable[[BaseException], tuple[str, Any]]",
) -> "Outcome":
    try:
        if timeout is None:
            value = await coroutine
        else:
            value = await asyncio.wait_for(coroutine, timeout)
    except asyncio.TimeoutError:
        return None, ("timeout", timeout_message(name), None)
    except asyncio.CancelledError:  # the mirror closed while it ran
        return None, ("tool_error", "the tool was cancelled", {"exception": "CancelledError"})
    except Exception as exc:
        message, data = raised(exc)
        return None, ("tool_error", message, data)
    return finish(value)


def tool_runner(registry: "Any", max_result_bytes: int) -> "Runner":
    """Runs a call of either flavour by the core's code (core.py), as a call from a server.

    `registry` is what the core's Session takes: a `ToolRegistry` (tools.py), the
    MicroPython flavour's table, or any mapping of name to tool.
    """
    from clienttools.context import ToolContext
    from clienttools.outcomes import input_outcome, raised_error, returned_outcome

    def run(name: str, arguments: "Any", call_id: str) -> "Any":
        tool = registry.get(name)
        if tool is None:
            return None, ("unknown_tool", unknown_tool_message(name), None)
        kwargs, error = input_outcome(tool, arguments)
        if error is not None:
            return None, error
        context = ToolContext(
            request_id=call_id,
            tool_call_id=call_id,
            tool_name=name,
            attempt=1,
            report_progress=_ignore_progress,
        )
        try:
            result = tool.call(kwargs, context)  # a tool that takes no context ignores it
        except Exception as exc:
            message, data = raised_error(exc)
            return None, ("tool_error", message, data)

        def finish(value: "Any") -> "Outcome":
            return returned_outcome(registry.get(name), name, value, max_result_bytes)

        if _is_coroutine(result):
            return _awaited(result, tool.timeout, name, finish, raised_error)
        return finish(result)

    return run


def _is_coroutine(value: object) -> bool:
    # MicroPython's coroutines are generators (it cannot tell the two apart); CPython's
    # generators are values, which the output check refuses with a clear message.
    if not (hasattr(value, "send") and hasattr(value, "throw")):
        return False
    return sys.implementation.name == "micropython" or type(value).__name__ == "coroutine"


# --- the adapter on js -------------------------------------------------------------------


def _create_proxy() -> "tuple[Callable[[Any], Any], bool]":
    """The flavour's `create_proxy`, and whether it is Pyodide's."""
    try:
        from pyodide.ffi import create_proxy
    except ImportError:  # MicroPython
        from jsffi import create_proxy

        return create_proxy, False
    return create_proxy, True


def _present(value: object) -> bool:
    # JS undefined and null arrive as None, or as Pyodide's JsNull.
    return value is not None and type(value).__name__ not in ("JsNull", "JsUndefined")


def main_thread_document(js: "Any") -> "Any":
    """The page's `document`; raises WebMCPUnavailable in a worker (or outside a browser)."""
    try:
        document = js.document
    except AttributeError:
        document = None
    if not _present(document):
        raise WebMCPUnavailable(
            "webmcp=True needs a page's main thread: document.modelContext exists only "
            "there, not in a worker. Register the tools for the browser's agent in a "
            "client on the main thread, or leave webmcp off here"
        )
    return document


class _Registration:
    __slots__ = ("controller", "execute", "fingerprint")

    def __init__(self, fingerprint: str, controller: "Any", execute: "Any") -> None:
        self.fingerprint = fingerprint
        self.controller = controller
        self.execute = execute


class ModelContextMirror:
    """Keeps a client's tools registered on `document.modelContext`; `close()` aborts them all.

    `specs()` lists the tools as (wire ToolSpec, read_only) pairs; `run` runs a call
    (`tool_runner`). Call `sync()` after every change of the tools.
    Every JS proxy made here is destroyed: a registration's `execute` when it is
    aborted, the handlers of its promise when that settles (MicroPython; Pyodide's
    promises release Python handlers themselves), the listener for the polyfill
    when it fires or at close (`proxies_created`, `proxies_destroyed`).
    """

    def __init__(
        self,
        specs: "Callable[[], Sequence[tuple[Mapping[str, Any], bool]]]",
        run: "Runner",
        *,
        approval: bool = False,
        js: "Any" = None,
    ) -> None:
        if js is None:
            try:
                import js as page_js
            except ImportError:
                raise WebMCPUnavailable(
                    "webmcp=True needs a browser page: there is no document.modelContext here"
                ) from None
            js = page_js
        self._js = js
        self._document = main_thread_document(js)
        self._create_proxy, self._pyodide = _create_proxy()
        self._specs = specs
        self._run = run
        self.approval = approval
        self._registrations: dict[str, _Registration] = {}
        self._tasks: dict[str, Any] = {}  # the running async calls, by call id
        self._calls = 0
        self._recent: list[Any] = []  # see _js_result
        self._waiting: Any = None  # the proxy listening for the polyfill, while it waits
        self._closed = False
        self.proxies_created = 0
        self.proxies_destroyed = 0
        self.sync()

    @property
    def available(self) -> bool:
        """True once `document.modelContext` exists (native, or the polyfill)."""
        return self._context() is not None

    @property
    def registered(self) -> "list[str]":
        """The names registered on `document.modelContext` now."""
        return list(self._registrations)

    def _context(self) -> "Any":
        try:
            context = self._document.modelContext
        except AttributeError:
            return None
        return context if _present(context) else None

    def _proxy(self, function: "Callable[..., Any]") -> "Any":
        self.proxies_created += 1
        return self._create_proxy(function)

    def _destroy(self, proxy: "Any") -> None:
        self.proxies_destroyed += 1
        destroy = getattr(proxy, "destroy", None)
        if destroy is not None:  # MicroPython's proxies have none: released once JS drops them
            destroy()

    def sync(self) -> None:
        """Register what is new or changed, abort what went or changed."""
        if self._closed:
            return
        context = self._context()
        if context is None:
            self._wait_for_context()
            return
        descriptors = {}
        wanted = []
        for spec, read_only in self._specs():
            if spec.get("needsApproval") and not self.approval:
                continue
            descriptor = _dumps(model_context_tool(spec, read_only))
            descriptors[spec["name"]] = descriptor
            wanted.append((spec["name"], descriptor))
        current = {name: r.fingerprint for name, r in self._registrations.items()}
        aborts, registers = plan(current, wanted)
        for name in aborts:
            self._abort(name)
        for name in registers:
            self._register(context, name, descriptors[name])

    def close(self) -> None:
        """Abort every registration and cancel the calls still running; for good."""
        if self._closed:
            return
        self._closed = True
        for name in list(self._registrations):
            self._abort(name)
        if self._waiting is not None:
            self._document.removeEventListener(READY_EVENT, self._waiting)
            self._destroy(self._waiting)
            self._waiting = None
        for task in list(self._tasks.values()):
            task.cancel()

    # --- registrations ---------------------------------------------------------------

    def _wait_for_context(self) -> None:
        if self._waiting is not None:
            return

        def ready(event: "Any" = None) -> None:
            waiting, self._waiting = self._waiting, None
            if waiting is not None:
                self._document.removeEventListener(READY_EVENT, waiting)
                self._destroy(waiting)
            self.sync()

        self._waiting = self._proxy(ready)
        self._document.addEventListener(READY_EVENT, self._waiting)

    def _register(self, context: "Any", name: str, descriptor: str) -> None:
        js = self._js
        tool = js.JSON.parse(descriptor)

        def execute(input: "Any" = None) -> "Any":
            return self._execute(name, input)

        proxy = self._proxy(execute)
        tool.execute = proxy
        controller = js.AbortController.new()
        options = js.Object.new()
        options.signal = controller.signal
        registration = _Registration(descriptor, controller, proxy)
        self._registrations[name] = registration
        try:
            promise = context.registerTool(tool, options)
        except Exception as exc:  # a context that throws instead of rejecting
            self._failed(name, registration, exc)
            return
        self._watch(name, registration, promise)

    def _watch(self, name: str, registration: "_Registration", promise: "Any") -> None:
        """Handle the registration's promise: a rejection is logged, never unhandled."""

        def rejected(reason: "Any" = None) -> None:
            if str(getattr(reason, "name", "")) != "AbortError":  # our own abort: expected
                self._failed(name, registration, reason)

        if self._pyodide:
            # Pyodide's promises take Python callables and release them once settled.
            promise.then(None, rejected)
            return
        handlers: list[Any] = []

        def settled() -> None:
            for handler in handlers:
                self._destroy(handler)
            handlers.clear()

        def on_fulfilled(value: "Any" = None) -> None:
            settled()

        def on_rejected(reason: "Any" = None) -> None:
            settled()
            rejected(reason)

        handlers.append(self._proxy(on_fulfilled))
        handlers.append(self._proxy(on_rejected))
        promise.then(handlers[0], handlers[1])

    def _failed(self, name: str, registration: "_Registration", reason: "Any") -> None:
        # Only this registration is forgotten: the tool may have been registered anew since.
        if self._registrations.get(name) is registration:
            self._abort(name)
        detail = getattr(reason, "message", None) or reason
        self._js.console.warn(
            f"clienttools: tool {name!r} was not registered on document.modelContext: {detail}"
        )

    def _abort(self, name: str) -> None:
        registration = self._registrations.pop(name, None)
        if registration is None:
            return
        registration.controller.abort()
        self._destroy(registration.execute)

    # --- calls -----------------------------------------------------------------------

    def _execute(self, name: str, input: "Any") -> "Any":
        """The `execute` of a registration: a CallToolResult, or a promise of one; never throws."""
        self._calls += 1
        call_id = "webmcp-" + str(self._calls)
        try:
            text = self._js.JSON.stringify(input) if _present(input) else None
            arguments = json.loads(text) if isinstance(text, str) else {}
            outcome = self._run(name, arguments, call_id)
        except Exception as exc:
            outcome = (None, ("tool_error", f"{type(exc).__name__}: {exc}", None))
        if isinstance(outcome, tuple):
            return self._js_result(result_of(outcome))
        return self._promise_of(outcome, call_id)

    def _js_result(self, text: str) -> "Any":
        """The CallToolResult as a JS object, kept referenced here for a while.

        MicroPython 1.27 sometimes hands JS `undefined` for a JS object that a callback
        returns, or passes on, once nothing on the Python side references it (1 call
        in 30 lost its result so): the last few results and promises stay referenced.
        """
        return self._keep(self._js.JSON.parse(text))

    def _keep(self, value: "Any") -> "Any":
        self._recent.append(value)
        if len(self._recent) > 16:
            self._recent.pop(0)
        return value

    def _promise_of(self, coroutine: "Any", call_id: str) -> "Any":
        resolvers: list[Any] = []

        def executor(resolve: "Any", reject: "Any" = None) -> None:
            resolvers.append(resolve)

        proxy = self._proxy(executor)
        try:
            promise = self._js.Promise.new(proxy)  # the executor runs inside, at once
        finally:
            self._destroy(proxy)
        self._tasks[call_id] = asyncio.create_task(self._settle(coroutine, resolvers[0], call_id))
        self._keep(promise)
        return promise

    async def _settle(self, coroutine: "Any", resolve: "Any", call_id: str) -> None:
        # MicroPython's tasks have no done callbacks: the task resolves and forgets itself.
        try:
            outcome = await coroutine
            text = result_of(outcome)
        except BaseException as exc:  # cancelled by close() before the tool's own handling
            text = error_result("tool_error", f"{type(exc).__name__}: {exc}")
        finally:
            self._tasks.pop(call_id, None)
        resolve(self._js_result(text))
