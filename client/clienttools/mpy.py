"""The MicroPython flavour of the client: `<script type="mpy">` pages whose tools are ready at once.

The protocol rules (C1-C13) are not here: `Session` is the shared core
(core.py), which both flavours run. What this module keeps is only what
MicroPython's asyncio and `js` need, and why:

- `Tool` (mpy_tools.py): MicroPython keeps no annotations or docstrings and has
  no pydantic, so a tool declares its JSON schemas (checked by input_schema.py)
  and description, where function_schema.py builds them from the signature;
- `ToolClient`: the adapter on `js.WebSocket`, `setTimeout` and `sessionStorage`.
  MicroPython's asyncio has no `call_at`, no done callbacks, no futures, and
  `asyncio.wait_for` fails under the page's top-level await, so the Pyodide
  adapter (client.py, connection.py, browser.py) cannot run here.

Everything else is imported, not copied: core.py (the session, its events, how a
call ends), rules.py (limits, codes, the call lifecycle, backoff, messages),
context.py (ToolContext, ToolError), errors.py (ConnectError and its kinds) and
input_schema.py. The chat client (C14) stays Pyodide-only.

    from clienttools.mpy import ToolClient, ToolError

    client = ToolClient("ws://127.0.0.1:8000/agents/chat/demo")

    @client.tool(
        description="Add two integers.",
        schema={"type": "object", "properties": {"a": {"type": "integer"},
                "b": {"type": "integer"}}, "required": ["a", "b"]},
    )
    def add(a, b):
        return a + b

    @client.tool(schema={"type": "object", "properties": {"steps": {"type": "integer"}}},
                 context=True, timeout=30)
    async def count_up(steps, ctx):
        for step in range(1, steps + 1):
            await ctx.progress(step, total=steps)
        return steps

    await client.connect()   # returns once the server acknowledged the tools

How it differs from `ToolClient` of the Pyodide flavour: a tool declares its
input schema (`schema=`, validated before the tool runs, strictly: nothing is
coerced) and optionally `output_schema=`; `description=` replaces the docstring;
`context=True` passes the ToolContext as the keyword argument `ctx` (MicroPython
cannot inspect a signature). An `async def` tool runs as a task and can be
cancelled; a sync tool runs inline. A generator function counts as async
(MicroPython cannot tell the two apart), so tools must not be generators.

What MicroPython 1.27 (PyScript build) lacks, found by running it, and what this
code does instead: no `typing`, `__future__`, `dataclasses`, `enum`, `uuid`
(plain classes, tuples, `crypto.randomUUID()`); no docstrings or annotations kept
(declared schemas and descriptions); `[*a, b]` and `{**d}` do not parse
(concatenation); `re` has no `{m,n}` (rules.is_tool_name); plain dicts keep no
order and OrderedDict scans linearly (clienttools.recent); no builtin `TimeoutError`; bool
is not an int; `json.dumps` writes NaN as `nan` and has no `allow_nan`
(context.json_problem); asyncio tasks have no done callbacks (each run reports its
own end) and `asyncio.wait_for` fails under the page's top-level await (a
`setTimeout` instead).

The core runs on CPython too (tests/unit/test_core.py runs its cases on both
interpreters; tests/unit/test_mpy_session.py compares these tools with tools.py's).
"""

import asyncio
import sys

from clienttools import portable, rules, supervisor
from clienttools.context import ToolContext, ToolError
from clienttools.core import (
    CancelTool,
    ChatFrameReceived,
    ReplaceConnection,
    RunTool,
    Session,
    ToolsAcknowledged,
)
from clienttools.errors import (
    ConnectError,
    ConnectionFailed,
    RegistrationTimeout,
    ToolsRejected,
)
from clienttools.jspump import DIRECT_FRAMES, PUMP_SOURCE, TURN_AFTER
from clienttools.mpy_tools import Tool, ToolTable
from clienttools.outbox import OutboxWriter, StorageOutbox
from clienttools.supervisor import ClientEvent, ClientStatus

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = [
    "ConnectError",
    "ConnectionFailed",
    "RegistrationTimeout",
    "Session",
    "Tool",
    "ToolClient",
    "ToolContext",
    "ToolError",
    "ToolTable",
    "ToolsRejected",
]

_OPEN = 1
#: Bytes allocated between two garbage collections, at least (see `_raise_gc_threshold`).
GC_THRESHOLD = 256 * 1024


def _raise_gc_threshold() -> None:
    """Collect after GC_THRESHOLD bytes, not the browser build's 16 KiB (never lowered).

    MicroPython's WebAssembly build sets the threshold to 16 KiB and collects when
    control returns to JavaScript; every collection marks the whole live heap
    (the modules' bytecode, C7's remembered results). An invoke allocates a few
    KiB, so at 16 KiB the collections took more time than the invokes did (under
    Node: 1,414 pipelined invokes/s at 16 KiB, 2,230 at 256 KiB). The cost is at
    most GC_THRESHOLD bytes more garbage between collections. A higher threshold,
    or collections disabled (-1), is kept; a page that wants a lower one sets it
    after creating the client.
    """
    try:
        import gc

        threshold = gc.threshold()  # type: ignore[attr-defined]  # MicroPython only
    except (ImportError, AttributeError):  # CPython (the unit tests): nothing to tune
        return
    if 0 < threshold < GC_THRESHOLD:
        gc.threshold(GC_THRESHOLD)  # type: ignore[attr-defined]


def _log(level: str, message: str) -> None:
    # MicroPython's logging is a stub without handlers; the console is where a page logs.
    if level == "debug":
        return  # a page's console is no place for these, and each line costs time
    try:
        import js

        getattr(js.console, level)("clienttools: " + message)
    except ImportError:  # CPython (the unit tests)
        pass


if sys.implementation.name == "micropython":  # on CPython the core logs through `logging`
    portable.log_to(_log)


# --- the browser adapter -------------------------------------------------------------------


_pump_factory: "Any" = None


def _js_pump(js: "Any") -> "Any":
    """jspump.py's handler factory, made once per page.

    Unlike the Pyodide flavour, this one needs no handlers in Python for a page whose
    Content-Security-Policy forbids making functions: PyScript itself does not start
    on such a page (it evaluates strings as JavaScript), so MicroPython never runs there.
    """
    global _pump_factory
    if _pump_factory is None:
        _pump_factory = js.Function.new(PUMP_SOURCE)()
    return _pump_factory


def _worker_storage(js: "Any") -> "Any":
    # Imported only in a worker: a page's main thread never loads the module.
    from clienttools.worker import outbox_storage

    return outbox_storage(js)


class _Connection:
    """One js.WebSocket, its handlers, and what happened to it."""

    def __init__(self, ws: "Any") -> None:
        self.ws = ws
        self.send = ws.send  # looked up once: through the proxy, a lookup is a call
        self.proxies: list[Any] = []
        self.opened = asyncio.Event()
        self.registered = asyncio.Event()
        self.ended = asyncio.Event()
        self.outcome: ToolsAcknowledged | str | None = None
        self.close_code: int | None = None
        self.release: Any = None  # drops jspump.py's handlers
        self.over = False


class ToolClient(ClientStatus):
    """Hosts MicroPython tools for a server-side agent over one WebSocket (protocol v1).

    Arguments as the Pyodide flavour's ToolClient: url, token, connect_timeout,
    ping_interval, reconnect, client_id, max_result_bytes; `storage` is where the
    outbox waits across reloads (default `sessionStorage`, in a PyScript worker the
    page's through PyScript's proxy: clienttools.worker; anything with
    getItem/setItem); `webmcp` and `webmcp_approval` as there too: the tools on
    `document.modelContext` as well (webmcp.py), and with no `url`, there only.
    """

    def __init__(
        self,
        url: "str | None" = None,
        *,
        token: "str | None" = None,
        connect_timeout: float = 10.0,
        ping_interval: float = rules.DEFAULT_PING_INTERVAL,
        reconnect: bool = True,
        client_id: "str | None" = None,
        max_result_bytes: int = rules.MAX_RESULT_BYTES,
        storage: "Any" = None,
        webmcp: bool = False,
        webmcp_approval: bool = False,
    ) -> None:
        import js

        url = supervisor.check_options(url, connect_timeout, webmcp)
        _raise_gc_threshold()
        self._js = js
        self._performance_now = js.performance.now  # read on every frame: looked up once
        self.url = url
        sep = "&" if "?" in url else "?"
        self._open_url = url if token is None else f"{url}{sep}token={js.encodeURIComponent(token)}"
        self.connect_timeout = connect_timeout
        self.reconnect = reconnect
        self.client_id = client_id or str(js.crypto.randomUUID()).replace("-", "")
        self._tools = ToolTable()  # the tools frame lists them in order
        self.session = Session(
            self._tools,
            client_id=self.client_id,
            ping_interval=ping_interval,
            max_result_bytes=max_result_bytes,
        )
        worker = hasattr(js, "WorkerGlobalScope")  # in a PyScript worker: clienttools.worker
        if storage is None:
            storage = _worker_storage(js) if worker else js.sessionStorage
        # The writer of the Pyodide flavour too (C11). On the main thread the page's end
        # saves it (_on_page_hide), so results are batched; a worker stores each one
        # before it is sent.
        self._outbox = OutboxWriter(
            self.session,
            StorageOutbox(url, storage),
            schedule=self._schedule_save,
            page_hide_saves=not worker,
        )
        super().__init__()
        self._connection: _Connection | None = None
        self._supervisor: Any = None
        self._runs: dict[str, Any] = {}
        self._started: set[str] = set()
        self._closing = False
        self._closed_event = asyncio.Event()
        self._save_callback: Callable[[], None] | None = None
        self._timer_id: Any = None
        self._timer_at: float | None = None
        self._pumping = False
        self.proxies_created = 0
        self.proxies_destroyed = 0
        # Two long-lived callbacks (the timer and the batched outbox save) for the
        # client's whole life: not per socket, so not counted with the socket's.
        self._timer_proxy = self._proxy_of(self._on_timer)
        self._save_proxy = self._proxy_of(self._on_save_timer)
        self._hide_proxy = self._proxy_of(self._on_page_hide)
        if not worker:  # a worker ends with its page: nothing to flush then
            js.window.addEventListener("pagehide", self._hide_proxy)
            js.document.addEventListener("visibilitychange", self._hide_proxy)
        self.webmcp: Any = None  # the tools on document.modelContext (webmcp.py)
        if webmcp:
            from clienttools.webmcp import ModelContextMirror, tool_runner

            self.webmcp = ModelContextMirror(
                lambda: [(tool.spec(), tool.read_only) for tool in self._tools],
                tool_runner(self._tools, max_result_bytes),
                approval=webmcp_approval,
            )

    @staticmethod
    def _proxy_of(fn: "Callable[..., Any]") -> "Any":
        from jsffi import create_proxy

        return create_proxy(fn)

    def _now(self) -> float:
        return float(self._performance_now()) / 1000

    # --- tools ---------------------------------------------------------------------------

    def tool(
        self,
        fn: "Callable[..., Any] | None" = None,
        *,
        schema: "dict[str, Any] | None" = None,
        name: "str | None" = None,
        description: str = "",
        output_schema: "dict[str, Any] | None" = None,
        timeout: "float | None" = None,
        needs_approval: bool = False,
        context: bool = False,
        read_only: bool = False,
    ) -> "Any":
        """Register a tool: `@client.tool` (no arguments) or `@client.tool(schema={...}, ...)`."""

        def register(function: "Callable[..., Any]") -> "Callable[..., Any]":
            tool = Tool(
                function,
                name=name,
                description=description,
                schema=schema,
                output_schema=output_schema,
                timeout=timeout,
                needs_approval=needs_approval,
                context=context,
                read_only=read_only,
            )
            self._tools.add(tool)
            self._tools_changed()
            return function

        return register if fn is None else register(fn)

    def remove_tool(self, name: str) -> None:
        self._tools.remove(name)
        self._tools_changed()

    def _tools_changed(self) -> None:
        self.session.registry_changed()
        self._pump()
        if self.webmcp is not None:
            self.webmcp.sync()

    @property
    def tools(self) -> "dict[str, Tool]":
        return self._tools.as_dict()

    # --- state ---------------------------------------------------------------------------

    # --- connect and close ---------------------------------------------------------------

    async def connect(self) -> None:
        """Open the connection; return once the server acknowledged the tools (C1)."""
        supervisor.check_connect(self._status, self.url)
        self._closing = False
        self._closed_event = asyncio.Event()
        self._outbox.restore()
        await self._connect_first()
        self._supervisor = asyncio.create_task(supervisor.supervise(self))

    async def close(self) -> None:
        """Close for good: no reconnect; running async tools are cancelled.

        With `webmcp=True`, every registration on `document.modelContext` is aborted.
        """
        if self.webmcp is not None:
            self.webmcp.close()
        if self._status in ("idle", "closed"):
            return
        await self._stop()

    async def _open(self, first: bool) -> None:
        started = self._now()
        connection = self._attach()
        if not await self._wait(connection.opened, self.connect_timeout):
            self._detach(connection)
            raise ConnectionFailed(
                self._open_url, f"no answer within {self.connect_timeout} s"
            ) from None
        if connection.over:
            self._detach(connection)
            code = connection.close_code
            detail = f" (close code {code})" if code not in (None, 1006) else ""
            raise ConnectionFailed(self._open_url, f"the server refused or is unreachable{detail}")
        self.session.connection_opened(self._now())
        self._pump()
        remaining = max(0.001, self.connect_timeout - (self._now() - started))
        if not await self._wait(connection.registered, remaining):
            self._detach(connection)
            raise RegistrationTimeout(
                self._open_url,
                f"connected, but the server did not acknowledge the tools within "
                f"{self.connect_timeout} s (is this a clienttools endpoint?)",
            ) from None
        error = supervisor.registration_error(self._open_url, connection.outcome or "", first)
        if error is not None:
            self._detach(connection)
            raise error
        self._step(ClientEvent.OPENED)

    async def _wait(self, event: "asyncio.Event", seconds: float) -> bool:
        """Wait for `event` at most `seconds`; False on timeout.

        Not asyncio.wait_for: under the page's top-level await (MicroPython's
        TopLevelCoro) it fails when the timeout cancels the waiter.
        """
        if event.is_set():
            return True
        timed_out = []

        def expire(*args: "Any") -> None:
            if not event.is_set():
                timed_out.append(True)
                event.set()

        proxy = self._proxy_of(expire)
        timer = self._js.setTimeout(proxy, max(1, int(seconds * 1000)))
        await event.wait()
        self._js.clearTimeout(timer)
        return not timed_out

    def _attach(self) -> "_Connection":
        ws = self._js.WebSocket.new(self._open_url)
        ws.binaryType = "arraybuffer"
        connection = _Connection(ws)
        self._connection = connection

        def on_open(event: "Any") -> None:
            connection.opened.set()

        def on_frame(data: "Any") -> None:
            self._on_frames(connection, (data,))

        def on_batch(frames: "Any") -> None:
            self._on_frames(connection, [frames[i] for i in range(frames.length)])

        def on_close(code: "Any", reason: "Any") -> None:
            try:
                connection.close_code = int(code)
            except Exception:
                connection.close_code = None
            self._end(connection, "the server closed the connection before acknowledging the tools")
            connection.opened.set()

        ws.onopen = self._connection_proxy(connection, on_open)
        # jspump.py's handlers: a frame straight to Python, a burst as one array.
        handlers = (on_frame, on_batch, on_close)
        proxies = [self._connection_proxy(connection, handler) for handler in handlers]
        connection.release = _js_pump(self._js)(ws, *proxies, DIRECT_FRAMES, TURN_AFTER)
        return connection

    def _connection_proxy(self, connection: "_Connection", handler: "Any") -> "Any":
        proxy = self._proxy_of(handler)
        connection.proxies.append(proxy)
        self.proxies_created += 1
        return proxy

    def _on_frames(self, connection: "_Connection", frames: "Any") -> None:
        # Runs inside the socket's onmessage (or the burst's task): an exception here
        # would be a page error. A burst's frames are all received, then carried out,
        # stored and sent in one pump.
        if connection is not self._connection:
            return
        try:
            receive, now = self.session.receive_frame, self._now()
            for data in frames:
                if connection.over:
                    break  # a frame of the burst replaced the connection
                receive(data if isinstance(data, str) else b"", now)
                self._pump(more=True)
            self._pump()
        except Exception as exc:
            _log("error", f"handling a frame failed: {exc!r}")

    def _end(self, connection: "_Connection", why: str) -> None:
        """Mark a connection as over (idempotent); the supervisor takes it from there."""
        if connection.over:
            return
        connection.over = True
        if connection.outcome is None:
            connection.outcome = why
        connection.registered.set()
        connection.ended.set()
        if self._connection is connection:
            self.session.connection_lost(self._now())

    def _detach(self, connection: "_Connection", code: int = 1000, reason: str = "") -> None:
        """Close the socket and drop its handlers, so nothing of it stays alive."""
        self._end(connection, "the client dropped the connection")
        if self._connection is connection:
            self._connection = None
        ws = connection.ws
        ws.onopen = None
        connection.release()
        try:
            if ws.readyState <= _OPEN:
                ws.close(code, reason)
        except Exception as exc:
            _log("info", f"closing the socket failed: {exc!r}")
        self.proxies_destroyed += len(connection.proxies)
        connection.proxies = []  # released: JS holds them no more, nor do we

    # What supervisor.supervise (C11's reconnect loop, shared with client.py) asks of us:

    async def _connection_over(self, connection: "_Connection") -> None:
        await connection.ended.wait()
        code = rules.CLOSE_CODE_SILENT if connection.close_code == rules.CLOSE_CODE_SILENT else 1000
        self._detach(connection, code)

    async def _close_after_loss(self) -> None:
        await self._stop()

    async def _stop(self) -> None:
        self._closing = True
        watcher, self._supervisor = self._supervisor, None
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
        connection = self._connection
        if connection is not None:
            self._detach(connection)
        self.session.shutdown()
        self._pump()
        for _ in range(100):  # cancelled async tools end at their next await
            if not self._runs:
                break
            await asyncio.sleep(0.02)
        if self._timer_id is not None:
            self._js.clearTimeout(self._timer_id)
            self._timer_id, self._timer_at = None, None
        self._outbox.cancel()
        self._outbox.save()
        self._step(ClientEvent.CLOSED)

    # --- carrying out what the session asks ----------------------------------------------

    def _pump(self, more: bool = False) -> None:
        """Carry out the session's events, save the outbox, send its frames, re-arm the timer.

        `more`: further frames of one burst follow at once; only the events are
        carried out, and the last frame's call stores and sends for the whole burst.
        """
        if self._pumping:
            return
        self._pumping = True
        try:
            events = self.session.events()
            while events:
                for event in events:
                    self._carry_out(event)
                events = self.session.events()
        finally:
            self._pumping = False
        if more:
            return
        self._outbox.save_soon()  # in a worker, a result is stored before it leaves (C11)
        frames = self.session.frames_to_send()
        connection = self._connection
        if frames and connection is not None:
            send = connection.send
            for text in frames:
                try:
                    send(text)
                except Exception as exc:
                    _log("info", f"send failed ({exc!r}); the connection is going away")
                    self._end(connection, f"sending failed: {exc!r}")
                    break
        self._rearm_timer()

    def _carry_out(self, event: "Any") -> None:
        if isinstance(event, RunTool):
            self._start_run(event)
        elif isinstance(event, CancelTool):
            self._cancel_run(event.request_id)
        elif isinstance(event, ToolsAcknowledged):
            connection = self._connection
            if connection is not None and connection.outcome is None:
                connection.outcome = event
                connection.registered.set()
            else:
                supervisor.warn_rejected(event.rejected)
        elif isinstance(event, ReplaceConnection):
            connection = self._connection
            if connection is not None:
                _log("warn", f"replacing a silent connection: {event.reason}")
                connection.close_code = rules.CLOSE_CODE_SILENT
                self._end(connection, event.reason)
        elif isinstance(event, ChatFrameReceived):
            pass  # no chat client in this flavour (the core drops chat frames before this)

    def _start_run(self, run: "RunTool") -> None:
        request_id, tool = run.request_id, run.tool
        context = None
        if tool.context:

            def report(progress: float, total: "float | None", message: "str | None") -> None:
                self.session.report_progress(request_id, progress, total, message)
                self._pump()

            context = run.context(report)
        try:
            result = tool.call(run.arguments, context)
        except Exception as exc:  # a sync tool raised
            self.session.tool_raised(request_id, exc)
            return
        if hasattr(result, "send") and hasattr(result, "throw"):  # a coroutine (or generator)
            self._runs[request_id] = asyncio.create_task(self._run(request_id, result))
        else:
            self.session.tool_returned(request_id, result)

    async def _run(self, request_id: str, coroutine: "Any") -> None:
        # MicroPython's tasks have no done callbacks: the task reports its own end.
        self._started.add(request_id)
        try:
            value = await coroutine
        except asyncio.CancelledError:
            self._run_ended(request_id)
            self.session.tool_cancelled(request_id)
        except Exception as exc:
            self._run_ended(request_id)
            self.session.tool_raised(request_id, exc)
        else:
            self._run_ended(request_id)
            self.session.tool_returned(request_id, value)
        self._pump()

    def _run_ended(self, request_id: str) -> None:
        self._runs.pop(request_id, None)
        self._started.discard(request_id)

    def _cancel_run(self, request_id: str) -> None:
        task = self._runs.get(request_id)
        if task is None:
            return
        task.cancel()
        if request_id not in self._started:
            # Cancelled before its first step: the task never runs, so it cannot report.
            self._run_ended(request_id)
            self.session.tool_cancelled(request_id)

    # --- the timer (one setTimeout, at the session's next deadline) ----------------------

    def _rearm_timer(self) -> None:
        deadline = self.session.next_deadline()
        # Every frame moves the liveness deadline later; an earlier timer just fires early.
        if deadline is not None and self._timer_at is not None and self._timer_at <= deadline:
            return
        if deadline == self._timer_at:
            return
        if self._timer_id is not None:
            self._js.clearTimeout(self._timer_id)
            self._timer_id = None
        self._timer_at = deadline
        if deadline is not None:
            delay_ms = max(0, int((deadline - self._now()) * 1000) + 1)
            self._timer_id = self._js.setTimeout(self._timer_proxy, delay_ms)

    def _on_timer(self, *args: "Any") -> None:
        deadline = self._timer_at
        self._timer_id, self._timer_at = None, None
        try:
            now = self._now()
            self.session.tick(now if deadline is None else max(now, deadline))
            self._pump()
        except Exception as exc:
            _log("error", f"the timer failed: {exc!r}")

    # --- the outbox's timer and the page's end -------------------------------------------

    def _schedule_save(self, delay: float, callback: "Callable[[], None]") -> "_Timeout":
        # One long-lived proxy for every batched write: not a proxy per timer.
        self._save_callback = callback
        return _Timeout(self._js, self._js.setTimeout(self._save_proxy, max(1, int(delay * 1000))))

    def _on_save_timer(self, *args: "Any") -> None:
        callback, self._save_callback = self._save_callback, None
        if callback is not None:
            callback()

    def _on_page_hide(self, event: "Any") -> None:
        if str(event.type) == "pagehide" or str(self._js.document.visibilityState) == "hidden":
            self._outbox.save()


class _Timeout:
    """A `setTimeout` as the outbox writer cancels it."""

    def __init__(self, js: "Any", timer: "Any") -> None:
        self._js = js
        self._timer = timer

    def cancel(self) -> None:
        self._js.clearTimeout(self._timer)
