# The clienttools demo page (PyScript). Python in the page registers tools that a
# server-side agent calls over one WebSocket; the chat shows the model's single
# response stream, and a card per tool call shows its live state.
#
# Everything the model or a tool produces is put on the page with textContent or
# createTextNode, never as HTML.
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Literal
from urllib.parse import parse_qs

import js  # type: ignore[import-not-found]
from pyodide.ffi import create_proxy, jsnull  # type: ignore[import-not-found]

from clienttools import Chat, ConnectError, ToolClient, ToolContext, ToolError, UIMessage
from clienttools.chat import ChatError, ToolPart

document = js.document
NOTES_KEY = "clienttools-demo-notes"
THEME_KEY = "clienttools-demo-theme"
SESSION_KEY = "clienttools-demo-session"
MAX_SHOWN_CHARS = 4000


def stored(storage: Any, key: str) -> str | None:
    """storage.getItem(key) as a str, or None. (Pyodide turns a JS null into jsnull, not None.)"""
    value = storage.getItem(key)
    return None if value is None or value is jsnull else str(value)


def el(id_: str) -> Any:
    return document.getElementById(id_)


def make(tag: str, cls: str | None = None, text: str | None = None) -> Any:
    node = document.createElement(tag)
    if cls:
        node.className = cls
    if text is not None:
        node.textContent = text
    return node


def shorten(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    return (
        text
        if len(text) <= limit
        else text[:limit] + f"\n... ({len(text) - limit} more characters)"
    )


# --------------------------------------------------------------------------- session


def session_id() -> str:
    """?session=NAME wins; else the one kept in sessionStorage (a reload keeps it)."""
    query = parse_qs(str(js.location.search).lstrip("?"))
    wanted = (query.get("session") or [""])[0].strip()
    if not wanted:
        wanted = stored(js.sessionStorage, SESSION_KEY) or f"demo-{uuid.uuid4().hex[:12]}"
    js.sessionStorage.setItem(SESSION_KEY, wanted)
    return wanted


SESSION = session_id()
WS_URL = (
    ("wss://" if str(js.location.protocol) == "https:" else "ws://")
    + str(js.location.host)
    + "/agents/chat/"
    + js.encodeURIComponent(SESSION)
)
client = ToolClient(WS_URL)
chat: Chat = client.chat

# Progress the page's own tools report, by tool call id: the server does not
# stream it back to us, and it does not need to: the tool runs right here.
progress_by_call: dict[str, tuple[float, float | None, str | None]] = {}


# --------------------------------------------------------------------------- page state


def load_notes() -> list[dict[str, Any]]:
    raw = stored(js.localStorage, NOTES_KEY)
    try:
        notes = json.loads(str(raw)) if raw else []
    except ValueError:
        notes = []
    return notes if isinstance(notes, list) else []


def save_notes(notes: list[dict[str, Any]]) -> None:
    js.localStorage.setItem(NOTES_KEY, json.dumps(notes))
    render_notes()


def render_notes() -> None:
    notes = load_notes()
    listing = el("notes")
    listing.replaceChildren()
    if not notes:
        listing.appendChild(make("li", "none", 'No notes yet. Try: call add_note {"text": "..."}'))
    for note in notes[-6:]:
        listing.appendChild(make("li", None, str(note.get("text", ""))))
    if len(notes) > 6:
        listing.appendChild(make("li", "none", f"... and {len(notes) - 6} older"))
    el("notes-count").textContent = str(len(notes))


def apply_theme(theme: str) -> str:
    root = document.documentElement
    previous = str(root.getAttribute("data-theme") or "light")
    root.setAttribute("data-theme", theme)
    js.localStorage.setItem(THEME_KEY, theme)
    return previous


# --------------------------------------------------------------------------- the tools
# Each of these runs in this page, with the page's DOM and browser APIs at hand:
# things a server cannot see (the form as the user filled it, their timezone)
# or cannot do (change the page, keep data on this device).


@client.tool
def read_form() -> dict[str, str | bool]:
    """Read the fields of the profile form on the page, as the user filled them in."""
    fields: dict[str, str | bool] = {}
    for field in document.querySelectorAll("#profile-form [name]"):
        name = str(field.name)
        if str(field.type) == "checkbox":
            fields[name] = bool(field.checked)
        else:
            fields[name] = str(field.value)
    return fields


@client.tool
def get_element_text(selector: str) -> str:
    """Read the text of the first element on the page that matches a CSS selector.

    Args:
        selector: A CSS selector, for example "h2" or "#notes".
    """
    try:
        element = document.querySelector(selector)
    except Exception as exc:  # a JS SyntaxError for a malformed selector
        raise ToolError(f"invalid selector {selector!r}: {exc}") from None
    if element is None or element is jsnull:
        raise ToolError(f"no element matches {selector!r}", data={"selector": selector})
    return str(element.textContent).strip()[:2000]


@client.tool
def set_theme(theme: Literal["light", "dark"]) -> dict[str, str]:
    """Switch the page between its light and dark theme.

    Args:
        theme: "light" or "dark".
    """
    previous = apply_theme(theme)
    return {"theme": theme, "previous": previous}


@client.tool
def get_timezone() -> dict[str, Any]:
    """The user's timezone, locale and local time, as the browser reports them (Intl)."""
    options = js.Intl.DateTimeFormat.new().resolvedOptions()
    now = js.Date.new()
    offset = -int(now.getTimezoneOffset())
    sign = "+" if offset >= 0 else "-"
    return {
        "timeZone": str(options.timeZone),
        "locale": str(options.locale),
        "calendar": str(options.calendar),
        "numberingSystem": str(options.numberingSystem),
        "utcOffset": f"{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}",
        "localTime": str(now.toLocaleString()),
        "languages": [str(language) for language in js.navigator.languages],
    }


@client.tool
def add_note(text: str) -> dict[str, int]:
    """Keep a note on this device (the page's localStorage).

    Args:
        text: The note.
    """
    notes = load_notes()
    notes.append({"text": text, "at": time.time()})
    save_notes(notes)
    return {"count": len(notes)}


@client.tool
def list_notes() -> list[str]:
    """The notes kept on this device, oldest first."""
    return [str(note.get("text", "")) for note in load_notes()]


@client.tool(needs_approval=True)
def clear_notes() -> dict[str, int]:
    """Delete every note kept on this device. The user must approve it first."""
    deleted = len(load_notes())
    save_notes([])
    return {"deleted": deleted}


@client.tool(timeout=120.0)
async def long_task(ctx: ToolContext, steps: int = 10, step_ms: int = 300) -> dict[str, Any]:
    """A long job in the page that reports its progress step by step (simulated work).

    Args:
        steps: How many steps to run (1 to 100).
        step_ms: How long each step takes, in milliseconds (10 to 5000).
    """
    if not 1 <= steps <= 100:
        raise ToolError("steps must be between 1 and 100")
    if not 10 <= step_ms <= 5000:
        raise ToolError("step_ms must be between 10 and 5000")
    started = time.monotonic()
    call_id = ctx.tool_call_id
    try:
        for step in range(1, steps + 1):
            await asyncio.sleep(step_ms / 1000)
            message = f"step {step} of {steps}"
            progress_by_call[call_id] = (step, steps, message)
            render_cards()
            await ctx.progress(step, steps, message)
    finally:
        render_cards()
    return {"steps": steps, "elapsedMs": round((time.monotonic() - started) * 1000)}


# --------------------------------------------------------------------------- tool cards

PAGE_TOOLS = {tool.name for tool in client.registry}

STATE_VIEW: dict[str, tuple[str, str]] = {
    # state -> (label, tone)
    "input-streaming": ("Preparing", "run"),
    "input-available": ("Running", "run"),
    "approval-requested": ("Waiting for approval", "wait"),
    "approval-responded": ("Approved, running", "run"),
    "output-available": ("Done", "ok"),
    "output-error": ("Error", "err"),
    "output-denied": ("Denied", "deny"),
}


def view_of(part: ToolPart) -> tuple[str, str]:
    label, tone = STATE_VIEW.get(part.state, (part.state, "run"))
    if (
        part.state == "approval-responded"
        and part.approval is not None
        and part.approval.approved is False
    ):
        return "Denied", "deny"
    if part.state == "input-available" and part.name not in PAGE_TOOLS:
        return "Running on the server", tone
    return label, tone


def wire_field(part: ToolPart, key: str) -> tuple[bool, Any]:
    data = part.model_dump(mode="json", by_alias=True)
    return (key in data), data.get(key)


def pretty(value: Any) -> str:
    return shorten(json.dumps(value, indent=2, ensure_ascii=False))


class Card:
    """The DOM of one tool call. Built once; update() touches only what changed."""

    def __init__(self, part: ToolPart) -> None:
        self.call_id = part.tool_call_id
        self.first_seen = time.monotonic()
        self.finished: float | None = None
        self.signature: tuple[Any, ...] | None = None
        self.root = make("article", "card")
        self.root.setAttribute("data-call-id", part.tool_call_id)
        self.root.setAttribute("data-tool", part.name)
        head = make("div", "card-head")
        head.appendChild(make("span", "card-name", part.name))
        head.appendChild(make("span", "where", "page" if part.name in PAGE_TOOLS else "server"))
        self.time = make("span", "muted small")
        head.appendChild(self.time)
        self.badge = make("span", "badge")
        head.appendChild(self.badge)
        self.root.appendChild(head)

        # Input and result side by side with their labels: compact cards.
        io = make("div", "card-io")
        io.appendChild(make("div", "label", "Input"))
        self.input_pre = make("pre", "card-input")
        io.appendChild(self.input_pre)
        self.result_label = make("div", "label")
        self.result_pre = make("pre", "card-output")
        io.appendChild(self.result_label)
        io.appendChild(self.result_pre)
        self.root.appendChild(io)

        self.progress = make("div", "progress")
        track = make("div", "progress-track")
        self.bar = make("div", "progress-bar")
        track.appendChild(self.bar)
        self.progress.appendChild(track)
        self.progress_text = make("div", "progress-text")
        self.progress.appendChild(self.progress_text)
        self.root.appendChild(self.progress)

        self.approval = make("div", "card-approval")
        self.approval.appendChild(
            make("p", None, f"{part.name} wants to run in this page. Allow it?")
        )
        self.approve = make("button", "button approve", "Approve")
        self.approve.type = "button"
        self.approve.setAttribute("data-action", "approve")
        self.approve.setAttribute("data-call-id", part.tool_call_id)
        self.deny = make("button", "button deny", "Deny")
        self.deny.type = "button"
        self.deny.setAttribute("data-action", "deny")
        self.deny.setAttribute("data-call-id", part.tool_call_id)
        self.approval.appendChild(self.approve)
        self.approval.appendChild(self.deny)
        self.root.appendChild(self.approval)

    def update(self, part: ToolPart) -> None:
        progress = progress_by_call.get(part.tool_call_id)
        approved = None if part.approval is None else part.approval.approved
        signature = (part.state, approved, progress, part.error_text)
        if signature == self.signature:
            return
        self.signature = signature
        label, tone = view_of(part)
        terminal = part.state in ("output-available", "output-error", "output-denied")
        if terminal and self.finished is None:
            self.finished = time.monotonic()
        self.root.setAttribute("data-state", part.state)
        self.root.setAttribute("data-tone", tone)
        self.badge.textContent = label

        has_input, tool_input = wire_field(part, "input")
        self.input_pre.textContent = (
            json.dumps(tool_input, ensure_ascii=False) if has_input else "(streaming)"
        )

        running = tone == "run" and not terminal
        self.progress.hidden = not running
        if running:
            if progress is None:
                self.progress.setAttribute("data-indeterminate", "true")
                self.bar.style.width = ""
                self.progress_text.textContent = (
                    "running in this page" if part.name in PAGE_TOOLS else "running on the server"
                )
                self.root.setAttribute("data-progress", "")
            else:
                done, total, message = progress
                percent = round(100 * done / total) if total else 0
                self.progress.setAttribute("data-indeterminate", "false")
                self.bar.style.width = f"{percent}%"
                self.progress_text.textContent = f"{percent}% \u00b7 {message or ''}".rstrip(
                    " \u00b7"
                )
                self.root.setAttribute("data-progress", str(percent))

        waiting = part.state == "approval-requested"
        self.approval.hidden = not waiting
        self.approve.disabled = not waiting
        self.deny.disabled = not waiting

        self.result_label.hidden = not terminal
        self.result_pre.hidden = not terminal
        self.result_pre.classList.toggle("error-text", part.state == "output-error")
        self.result_pre.classList.toggle("denied-text", part.state == "output-denied")
        if part.state == "output-available":
            _, output = wire_field(part, "output")
            self.result_label.textContent = "Output"
            self.result_pre.textContent = pretty(output)
        elif part.state == "output-error":
            self.result_label.textContent = "Error"
            self.result_pre.textContent = shorten(part.error_text or "the tool failed")
        elif part.state == "output-denied":
            self.result_label.textContent = "Denied"
            self.result_pre.textContent = "The user refused this call; the tool did not run."
        if self.finished is not None:
            took = self.finished - self.first_seen
            self.time.textContent = f"{took * 1000:.0f} ms" if took < 1 else f"{took:.1f} s"


cards: dict[str, Card] = {}


def all_tool_parts() -> list[ToolPart]:
    return [p for m in chat.messages if m.role == "assistant" for p in m.tool_parts]


def render_cards() -> None:
    container = el("cards")
    parts = all_tool_parts()
    shown = {part.tool_call_id for part in parts}
    for call_id in [c for c in cards if c not in shown]:
        cards.pop(call_id).root.remove()
    for part in parts:
        card = cards.get(part.tool_call_id)
        if card is None:
            card = cards[part.tool_call_id] = Card(part)
            container.insertBefore(card.root, container.firstChild)  # newest first
            container.scrollTop = 0
        card.update(part)
    ids = [part.tool_call_id for part in parts]
    if ids != list(cards):
        # Older calls came after a newer one (the history arrived after a reload
        # mid-answer): put every card back in place, newest first.
        for call_id in ids:
            cards[call_id] = cards.pop(call_id)
            container.insertBefore(cards[call_id].root, container.firstChild)
    el("cards-empty").hidden = bool(cards)
    running = sum(
        1 for p in parts if p.state not in ("output-available", "output-error", "output-denied")
    )
    count = f"{len(parts)} call{'s' if len(parts) != 1 else ''}"
    el("activity-count").textContent = count + (f" \u00b7 {running} in progress" if running else "")


# --------------------------------------------------------------------------- chat view


class MessageView:
    def __init__(self, message: UIMessage) -> None:
        self.root = make("div", f"msg msg-{message.role}")
        self.root.setAttribute("data-message-id", message.id)
        self.root.appendChild(make("div", "msg-role", "You" if message.role == "user" else "Agent"))
        self.body = make("div", "msg-body")
        self.root.appendChild(self.body)
        self.nodes: list[tuple[str, Any, Any]] = []  # (key, node, last value)

    def update(self, message: UIMessage) -> None:
        wanted: list[tuple[str, str, str]] = []  # (key, kind, text)
        for part in message.parts:
            if part.type == "text":
                if part.text:
                    wanted.append((f"text{len(wanted)}", "text", part.text))
            elif isinstance(part, ToolPart):
                label, tone = view_of(part)
                wanted.append((part.tool_call_id, "tool:" + tone, f"{part.name}\n{label}"))
        for index, (key, kind, text) in enumerate(wanted):
            if index < len(self.nodes) and self.nodes[index][0] == key:
                _, node, last = self.nodes[index]
            else:
                node = self._make(kind)
                if index < len(self.nodes):
                    self.body.replaceChild(node, self.nodes[index][1])
                    self.nodes[index] = (key, node, None)
                else:
                    self.body.appendChild(node)
                    self.nodes.append((key, node, None))
                last = None
            if (kind, text) != last:
                self._fill(node, kind, text)
                self.nodes[index] = (key, node, (kind, text))
        while len(self.nodes) > len(wanted):
            _, node, _ = self.nodes.pop()
            node.remove()

    @staticmethod
    def _make(kind: str) -> Any:
        if kind == "text":
            return make("div", "msg-text")
        node = make("div", "toolref")
        node.appendChild(make("span", "name"))
        node.appendChild(make("span", "state"))
        return node

    @staticmethod
    def _fill(node: Any, kind: str, text: str) -> None:
        if kind == "text":
            node.textContent = text
            return
        name, label = text.split("\n", 1)
        node.setAttribute("data-tone", kind.split(":", 1)[1])
        node.firstChild.textContent = name
        node.lastChild.textContent = label


message_views: dict[str, MessageView] = {}
typing_node = make("div", "typing")
for _ in range(3):
    typing_node.appendChild(make("span"))
error_node = make("div", "msg-error")

CHAT_STATUS_TEXT = {
    "ready": "Ready",
    "submitted": "Sending",
    "streaming": "Streaming",
    "error": "Error",
}


def render_chat() -> None:
    box = el("messages")
    stick = box.scrollHeight - box.scrollTop - box.clientHeight < 120
    el("welcome").hidden = bool(chat.messages)
    # The server's stored conversation may drop messages (cleared in another window).
    shown = {message.id for message in chat.messages}
    for message_id in [m for m in message_views if m not in shown]:
        message_views.pop(message_id).root.remove()
    for message in chat.messages:
        view = message_views.get(message.id)
        if view is None:
            view = message_views[message.id] = MessageView(message)
            box.appendChild(view.root)
        view.update(message)
    ids = [message.id for message in chat.messages]
    if ids != list(message_views):
        # Older messages came after a newer one (the stored history arrived after a
        # reload mid-answer had drawn the answer): put every view back in order.
        for message_id in ids:
            message_views[message_id] = message_views.pop(message_id)
            box.appendChild(message_views[message_id].root)
    # The typing dots sit after the last message while the answer has not started.
    waiting = chat.status == "submitted"
    if waiting:
        box.appendChild(typing_node)
    elif typing_node.parentNode:
        typing_node.remove()
    if chat.status == "error":
        error_node.textContent = f"The response failed: {chat.error or 'unknown error'}"
        box.appendChild(error_node)
    elif error_node.parentNode:
        error_node.remove()
    if stick:
        box.scrollTop = box.scrollHeight

    status = el("chat-status")
    status.setAttribute("data-state", chat.status)
    status.textContent = CHAT_STATUS_TEXT.get(chat.status, chat.status)
    busy = chat.state.active
    el("send").disabled = busy or not client.connected
    el("stop").hidden = not busy


# --------------------------------------------------------------------------- chat log (tests)

log_node = el("chat-log")
last_logged: list[str] = [""]


def log_change() -> None:
    """Append {status, tools: {toolCallId: state}} as one JSON line, when it changed."""
    entry = json.dumps(
        {"status": chat.status, "tools": {p.tool_call_id: p.state for p in all_tool_parts()}},
        separators=(",", ":"),
    )
    if entry != last_logged[0]:
        last_logged[0] = entry
        log_node.appendChild(document.createTextNode(entry + "\n"))


def on_chat_change(_: Chat) -> None:
    log_change()
    render_chat()
    render_cards()


chat.on_change(on_chat_change)


def messages_json(*_: Any) -> str:
    """The conversation as the page holds it, for the tests and the driver (AI SDK JSON)."""
    return json.dumps([message.to_wire() for message in chat.messages])


_messages_proxy = create_proxy(messages_json)
js.window.demoMessages = _messages_proxy


# --------------------------------------------------------------------------- connection

CONN_TEXT = {
    "idle": "Starting",
    "connecting": "Connecting",
    "open": "Connected",
    "reconnecting": "Reconnecting",
    "closed": "Disconnected",
}


def show_connection(state: str, text: str | None = None) -> None:
    pill = el("conn")
    pill.setAttribute("data-state", state)
    el("conn-text").textContent = text or CONN_TEXT.get(state, state)
    pill.title = f"WebSocket {WS_URL}: {state}"
    render_chat()  # the Send button follows the connection


client.on_status(lambda status: show_connection(status))


async def connect() -> None:
    delay = 1.0
    while True:
        show_connection("connecting")
        try:
            await client.connect()
            return
        except ConnectError as exc:
            js.console.warn(f"clienttools demo: {exc}")
            show_connection("failed", "Server unreachable")
            document.body.setAttribute("data-app", "offline")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 15.0)


# --------------------------------------------------------------------------- user input

tasks: set[asyncio.Task[Any]] = set()


def spawn(coroutine: Any) -> None:
    task = asyncio.ensure_future(coroutine)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def submit() -> None:
    prompt = el("prompt")
    text = str(prompt.value).strip()
    if not text or chat.state.active or not client.connected:
        return
    prompt.value = ""
    try:
        await chat.send(text)
    except ChatError:
        pass  # the status turns "error" and render_chat shows chat.error
    except Exception as exc:  # the socket went away as we sent: shown the same way
        js.console.warn(f"clienttools demo: send failed: {exc}")
        render_chat()


async def answer(call_id: str, approved: bool) -> None:
    try:
        await chat.respond(call_id, approved, None if approved else "denied in the demo page")
    except Exception as exc:
        js.console.warn(f"clienttools demo: approval not sent: {exc}")


def on_form_submit(event: Any) -> None:
    event.preventDefault()
    spawn(submit())


def on_prompt_key(event: Any) -> None:
    if event.key == "Enter" and not event.shiftKey and not event.isComposing:
        event.preventDefault()
        spawn(submit())


def on_chip(event: Any) -> None:
    chip = event.target.closest("[data-prompt]")
    if chip is None or chip is jsnull:
        return
    prompt = el("prompt")
    prompt.value = chip.getAttribute("data-prompt")
    prompt.focus()


def on_card_click(event: Any) -> None:
    button = event.target.closest("button[data-action]")
    if button is None or button is jsnull or button.disabled:
        return
    button.disabled = True
    approved = str(button.getAttribute("data-action")) == "approve"
    spawn(answer(str(button.getAttribute("data-call-id")), approved))


def on_stop(_: Any) -> None:
    spawn(chat.stop())


def on_theme_toggle(_: Any) -> None:
    current = str(document.documentElement.getAttribute("data-theme") or "light")
    apply_theme("light" if current == "dark" else "dark")


_listeners = [
    (el("composer-form"), "submit", on_form_submit),
    (el("prompt"), "keydown", on_prompt_key),
    (el("chips"), "click", on_chip),
    (el("cards"), "click", on_card_click),
    (el("stop"), "click", on_stop),
    (el("theme-toggle"), "click", on_theme_toggle),
]
_proxies = []
for target, event_name, handler in _listeners:
    proxy = create_proxy(handler)
    _proxies.append(proxy)
    target.addEventListener(event_name, proxy)


# --------------------------------------------------------------------------- start


async def show_model() -> None:
    """Say which model answers (the server's ``/agents/info``)."""
    try:
        response = await js.fetch("/agents/info")
        info = (await response.json()).to_py()
    except Exception:  # an older server without the route: keep what the page says
        return
    name = str(info.get("model", "scripted"))
    el("model-name").textContent = name
    if name != "scripted":
        el("model-note").textContent = ""


el("session-id").textContent = SESSION
await show_model()  # noqa: F704
el("boot-step").textContent = "Connecting to the agent"
el("boot-bar").style.width = "95%"
render_notes()
render_chat()
await connect()  # noqa: F704 (PyScript runs this file with top-level await)
document.body.setAttribute("data-app", "ready")


async def follow_answer() -> None:
    """After a reload mid-answer: follow the answer the server is still streaming.

    The conversation itself comes from the server (the chat subscribes by
    itself); this only rejoins a response in flight (``None`` if none is).
    """
    try:
        await chat.resume()
    except Exception as exc:  # an answer that failed is shown by render_chat
        js.console.warn(f"clienttools demo: resume: {exc}")


spawn(follow_answer())
el("prompt").focus()
