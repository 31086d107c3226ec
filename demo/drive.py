"""Drive the running demo through a scripted conversation in headless Chromium.

    python -m demo.drive                          # against http://127.0.0.1:8000
    python -m demo.drive --url http://127.0.0.1:8123 --out build/demo

Start the demo first (`make demo`). Each step waits on DOM state with a
timeout, never a fixed sleep. Screenshots and the page's chat log land in
--out (default build/demo/):

    loading.png    the loading screen while Pyodide boots (when it can be caught)
    ready.png      connected, before the first prompt
    progress.png   long_task running, its progress bar part way
    approval.png   clear_notes waiting for approval next to two finished calls
    finished.png   the whole conversation, light theme
    dark.png       after the model called set_theme {"theme": "dark"}
    reloaded.png   the page reloaded while long_task ran: the whole conversation, the answer done
    second-window.png  a second window of the same chat, the next turn arrived live
    chat-log.jsonl every chat.status / tool part state change the page recorded

Exit status 0 when every step passed; 1 (and the failing step's name, plus
failed.png) otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import runpy
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from playwright.sync_api import ConsoleMessage, Error, Page, ViewportSize, sync_playwright

from clienttools.chat import TOOL_STATE_ORDER

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_OUT = ROOT / "build" / "demo"
SCREENSHOTS = (
    "loading.png",
    "ready.png",
    "progress.png",
    "approval.png",
    "finished.png",
    "dark.png",
    "reloaded.png",
    "second-window.png",
)
VIEWPORT: ViewportSize = {"width": 1280, "height": 860}

#: Tool part states in the order they may move (C14); the three outputs share the last rank.
STATE_RANK: dict[str, int] = dict(TOOL_STATE_ORDER)
FINAL_RANK = max(STATE_RANK.values())
#: What the text in the page may show as long as no HTML is interpreted.
XSS_NAME = '<img src=x onerror="window.__demoXss=(window.__demoXss||0)+1">'
XSS_NOTE = "<b>bold?</b> notes stay text"


# playwright.config.py is not an importable module name (the dot), so run it as a file.
CONFIG: Any = SimpleNamespace(**runpy.run_path(str(ROOT / "playwright.config.py")))


class StepFailed(Exception):
    pass


def check_chat_log(entries: Sequence[dict[str, Any]]) -> list[str]:
    """Problems in a chat log: a tool part state that moved backwards, or a
    `ready` in the middle of a response (anything but `submitted` after it)."""
    problems: list[str] = []
    last_state: dict[str, str] = {}
    previous_status: str | None = None
    for index, entry in enumerate(entries):
        status = entry["status"]
        if previous_status in ("ready", "error") and status not in ("ready", "error", "submitted"):
            problems.append(f"entry {index}: status {previous_status} -> {status} (flicker)")
        if previous_status is None and status == "streaming":
            problems.append(f"entry {index}: the log starts mid-response")
        previous_status = status
        for call_id, state in entry["tools"].items():
            before = last_state.get(call_id)
            if state not in STATE_RANK:
                problems.append(f"entry {index}: {call_id} has unknown state {state!r}")
            elif before is not None and (
                STATE_RANK[state] < STATE_RANK[before]
                or (STATE_RANK[before] == FINAL_RANK and state != before)
            ):
                problems.append(f"entry {index}: {call_id} moved back {before} -> {state}")
            last_state[call_id] = state
        for call_id in last_state:
            if call_id not in entry["tools"]:
                problems.append(f"entry {index}: tool part {call_id} disappeared")
    return problems


class Demo:
    """The page, with helpers that wait on DOM state."""

    def __init__(self, page: Page, out: Path) -> None:
        self.page = page
        self.out = out
        self.timeout = CONFIG.ACTION_TIMEOUT_MS
        self.page.set_default_timeout(self.timeout)

    def shot(self, name: str) -> None:
        # "disabled" fast-forwards finite CSS animations and transitions (a card fading in).
        self.page.screenshot(path=str(self.out / name), animations="disabled")

    def wait(self, expression: str, arg: Any = None, timeout: float | None = None) -> Any:
        return self.page.wait_for_function(
            expression, arg=arg, timeout=self.timeout if timeout is None else timeout
        )

    def assistant_count(self) -> int:
        return int(self.page.locator("#messages .msg-assistant").count())

    def send(self, prompt: str) -> int:
        """Type a prompt and send it; return how many agent messages there were before."""
        before = self.assistant_count()
        self.wait("!document.getElementById('send').disabled")
        self.page.fill("#prompt", prompt)
        self.page.click("#send")
        return before

    def wait_reply(self, before: int, *expected: str, timeout: float | None = None) -> str:
        """Wait until the response is over and its message holds every expected text."""
        try:
            self.wait(
                """([before, expected]) => {
                    const messages = document.querySelectorAll('#messages .msg-assistant');
                    if (messages.length <= before) return false;
                    const status = document.getElementById('chat-status').dataset.state;
                    if (status !== 'ready') return false;
                    const text = messages[messages.length - 1].textContent;
                    return expected.every((e) => text.includes(e));
                }""",
                [before, list(expected)],
                timeout,
            )
        except Error as exc:
            raise StepFailed(
                f"no finished reply containing {list(expected)!r}; chat status "
                f"{self.page.get_attribute('#chat-status', 'data-state')!r}, last agent message "
                f"{self.last_reply()!r}"
            ) from exc
        return self.last_reply()

    def last_reply(self) -> str:
        messages = self.page.locator("#messages .msg-assistant")
        count = messages.count()
        return "" if count == 0 else str(messages.nth(count - 1).text_content())

    def card(self, tool: str) -> str:
        """Selector of the newest card of a tool (cards are newest first)."""
        return f"#cards .card[data-tool='{tool}'] >> nth=0"

    def wait_card(self, tool: str, state: str) -> None:
        try:
            self.page.wait_for_selector(f"#cards .card[data-tool='{tool}'][data-state='{state}']")
        except Error as exc:
            shown = self.page.get_attribute(self.card(tool), "data-state", timeout=1000)
            raise StepFailed(f"no {tool} card in state {state} (newest card: {shown})") from exc


# ---------------------------------------------------------------------------- steps


def step_open(demo: Demo, url: str) -> None:
    page = demo.page
    page.goto(url, wait_until="commit")
    # Catch the loading screen once its bar moved on a bit, if Pyodide is not faster than us.
    try:
        demo.wait(
            "parseFloat(document.getElementById('boot-bar')?.style.width || '0') >= 20"
            " || (document.body && document.body.dataset.app !== 'booting')",
            timeout=20_000,
        )
        if page.evaluate("document.body.dataset.app") == "booting":
            demo.shot("loading.png")
    except Error:
        pass  # not catchable: the screenshot is optional


def step_ready(demo: Demo) -> None:
    try:
        demo.wait(
            "document.body.dataset.app === 'ready'"
            " && document.getElementById('conn').dataset.state === 'open'",
            timeout=CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
    except Error as exc:
        app = demo.page.evaluate("document.body.dataset.app")
        conn = demo.page.text_content("#conn-text")
        step = demo.page.text_content("#boot-step")
        raise StepFailed(f"page not ready: app={app!r} connection={conn!r} boot={step!r}") from exc
    # The loading screen fades out; wait for it to be gone from the picture.
    demo.wait("getComputedStyle(document.getElementById('boot')).opacity === '0'")
    demo.shot("ready.png")


def step_chip_and_timezone(demo: Demo) -> None:
    demo.page.click("#chips .chip:has-text('Timezone')")
    value = demo.page.input_value("#prompt")
    if value != "call get_timezone {}":
        raise StepFailed(f"the chip filled the input with {value!r}")
    before = demo.assistant_count()
    demo.page.click("#send")
    reply = demo.wait_reply(before, "get_timezone -> ", '"timeZone"')
    demo.wait_card("get_timezone", "output-available")
    if "locale" not in reply:
        raise StepFailed(f"unexpected reply {reply!r}")


def step_parallel_and_text_only(demo: Demo) -> None:
    page = demo.page
    page.fill("#f-name", XSS_NAME)
    before = demo.send(f"call read_form {{}}\ncall add_note {json.dumps({'text': XSS_NOTE})}")
    reply = demo.wait_reply(before, "read_form -> ", "add_note -> ")
    demo.wait_card("read_form", "output-available")
    demo.wait_card("add_note", "output-available")
    escaped = XSS_NAME.replace('"', '\\"')  # as it looks inside a JSON string
    if escaped not in reply:
        raise StepFailed(f"the form's text is not shown literally in the reply: {reply!r}")
    output = page.text_content(demo.card("read_form") + " >> .card-output") or ""
    if escaped not in output:
        raise StepFailed(f"the form's text is not shown literally in the card: {output!r}")
    injected = page.evaluate(
        "document.querySelectorAll("
        "'#messages img, #cards img, #notes img, #messages b, #cards b, #notes b').length"
    )
    if injected or page.evaluate("window.__demoXss") is not None:
        raise StepFailed("text from a tool was interpreted as HTML")
    if XSS_NOTE not in (page.text_content("#notes") or ""):
        raise StepFailed("the note is not in the page's notes list")
    page.fill("#f-name", "Ada Lovelace")


def step_long_task(demo: Demo) -> None:
    before = demo.send('call long_task {"steps": 12, "step_ms": 300}')
    try:
        demo.wait(
            """() => {
                const card = document.querySelector("#cards .card[data-tool='long_task']");
                const p = card && Number(card.dataset.progress || 0);
                return p >= 30 && p < 100;
            }"""
        )
    except Error as exc:
        raise StepFailed("long_task never showed progress part way") from exc
    demo.shot("progress.png")
    demo.wait_reply(before, "long_task -> {", '"steps":12', timeout=30_000)
    demo.wait_card("long_task", "output-available")


def step_approval_approve(demo: Demo) -> None:
    """One response: two page tools and one that needs approval (the log test reads this)."""
    page = demo.page
    before = demo.send("call get_timezone {}\ncall list_notes {}\ncall clear_notes {}")
    demo.wait_card("clear_notes", "approval-requested")
    button = demo.card("clear_notes") + " >> button[data-action='approve']"
    page.wait_for_selector(button, state="visible")
    # A nicer picture: the two other calls finished while the approval waits (not required).
    with contextlib.suppress(Error):
        demo.wait(
            "document.querySelectorAll("
            "\"#cards .card[data-state='output-available']\").length >= 6",
            timeout=5_000,
        )
    if page.get_attribute("#chat-status", "data-state") != "streaming":
        raise StepFailed("the chat is not streaming while the approval waits")
    demo.shot("approval.png")
    page.click(button)
    demo.wait_reply(before, "get_timezone -> ", 'list_notes -> ["', 'clear_notes -> {"deleted":1}')
    demo.wait_card("clear_notes", "output-available")
    demo.wait("document.getElementById('notes-count').textContent === '0'")


def step_approval_deny(demo: Demo) -> None:
    page = demo.page
    before = demo.send("call clear_notes {}")
    demo.wait_card("clear_notes", "approval-requested")
    page.click(demo.card("clear_notes") + " >> button[data-action='deny']")
    demo.wait_reply(before, "clear_notes failed: denied")
    demo.wait_card("clear_notes", "output-denied")


def step_server_tool(demo: Demo) -> None:
    before = demo.send("call server_time {}")
    demo.wait_reply(before, "server_time -> ", '"iso"')
    demo.wait_card("server_time", "output-available")


def step_tool_error(demo: Demo) -> None:
    before = demo.send('call get_element_text {"selector": "#does-not-exist"}')
    demo.wait_reply(before, "get_element_text failed: tool_error: no element matches")
    demo.wait_card("get_element_text", "output-error")


def step_plain_text(demo: Demo) -> None:
    demo.page.click("#chips .chip:has-text('What can you do?')")
    before = demo.assistant_count()
    demo.page.press("#prompt", "Enter")  # Enter sends, like the Send button
    demo.wait_reply(before, "I can call these tools", "long_task", "server_time")
    demo.shot("finished.png")


def step_dark_theme(demo: Demo) -> None:
    demo.page.click("#chips .chip:has-text('Dark theme')")
    before = demo.assistant_count()
    demo.page.click("#send")
    demo.wait_reply(before, "set_theme -> ", '"theme":"dark"')
    demo.wait("document.documentElement.dataset.theme === 'dark'")
    # Let the colour transition settle before the picture: wait on the computed colour.
    demo.wait("getComputedStyle(document.body).backgroundColor === 'rgb(13, 17, 23)'")
    demo.shot("dark.png")


def step_chat_log(demo: Demo) -> None:
    text = demo.page.text_content("#chat-log") or ""
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    (demo.out / "chat-log.jsonl").write_text(text)
    if not entries:
        raise StepFailed("the page recorded no chat log")
    problems = check_chat_log(entries)
    if problems:
        raise StepFailed("; ".join(problems[:10]))


def messages(page: Page) -> list[dict[str, Any]]:
    """The conversation the page holds (its ``window.demoMessages()``)."""
    held: list[dict[str, Any]] = json.loads(page.evaluate("window.demoMessages()"))
    return held


def wait_messages(demo: Demo, page: Page, count: int, text: str) -> list[dict[str, Any]]:
    """Wait until ``page``'s chat is ready with ``count`` messages, the last holding ``text``."""
    try:
        page.wait_for_function(
            """([count, text]) => {
                if (document.getElementById('chat-status').dataset.state !== 'ready') return false;
                const messages = JSON.parse(window.demoMessages());
                const last = messages[messages.length - 1];
                return messages.length === count && last.role === 'assistant'
                    && last.parts.some((p) => p.type === 'text' && p.text.includes(text));
            }""",
            arg=[count, text],
            timeout=60_000,
        )
    except Error as exc:
        held = [(m["role"], len(m["parts"])) for m in messages(page)]
        raise StepFailed(
            f"expected {count} messages ending in {text!r}, the page has {held}"
        ) from exc
    return messages(page)


def step_reload_mid_answer(demo: Demo) -> None:
    """Reload while a page tool runs: the server's stored conversation comes back whole,
    the answer goes on (the call is delivered again to the reloaded page)."""
    page = demo.page
    before = messages(page)
    # The long task of an earlier step keeps its card (and its progress): wait for this one's.
    earlier = page.evaluate(
        "[...document.querySelectorAll('#cards > .card')].map(e => e.dataset.callId)"
    )
    demo.send('call long_task {"steps": 10, "step_ms": 300}')
    demo.wait(
        "(earlier) => [...document.querySelectorAll(\"#cards .card[data-tool='long_task']"
        '[data-progress]")].some((e) => !earlier.includes(e.dataset.callId))',
        earlier,
    )
    page.reload(wait_until="commit")
    step_ready_again(demo)
    after = wait_messages(demo, page, len(before) + 2, "long_task -> {")
    if after[: len(before)] != before:
        raise StepFailed("the conversation before the reload is not the same after it")
    if len({m["id"] for m in after}) != len(after):
        raise StepFailed("a message is shown twice after the reload")
    demo.wait_card("long_task", "output-available")
    check_shown_in_order(page, after)
    demo.shot("reloaded.png")


def check_shown_in_order(page: Page, held: list[dict[str, Any]]) -> None:
    """The chat shows the messages in their order, the tool cards newest first.

    After a reload mid-answer the answer can be drawn before the stored history
    that precedes it arrives; it must still end up below it, and its card on top.
    """
    shown = page.evaluate(
        "[...document.querySelectorAll('#messages [data-message-id]')]"
        ".map(e => e.dataset.messageId)"
    )
    if shown != [m["id"] for m in held]:
        raise StepFailed(f"the chat shows the messages out of order: {shown}")
    calls = [
        p["toolCallId"]
        for m in held
        if m["role"] == "assistant"
        for p in m["parts"]
        if "toolCallId" in p
    ]
    cards = page.evaluate(
        "[...document.querySelectorAll('#cards > .card')].map(e => e.dataset.callId)"
    )
    if cards != calls[::-1]:
        raise StepFailed(f"the tool cards are not newest first: {cards}")


def step_reload_after_answer(demo: Demo) -> None:
    page = demo.page
    before = messages(page)
    page.reload(wait_until="commit")
    step_ready_again(demo)
    demo.wait("([n]) => JSON.parse(window.demoMessages()).length === n", [len(before)])
    if messages(page) != before:
        raise StepFailed("the conversation changed across a reload")


def step_second_window(demo: Demo, url: str) -> None:
    """A second window of the same chat: the same conversation, and the next turn live."""
    page = demo.page
    second = page.context.new_page()
    try:
        second.set_default_timeout(demo.timeout)
        second.goto(url, wait_until="commit")
        second.wait_for_function(
            "document.body.dataset.app === 'ready'", timeout=CONFIG.PAGE_LOAD_TIMEOUT_MS
        )
        held = messages(page)
        second.wait_for_function(
            "([n]) => JSON.parse(window.demoMessages()).length === n", arg=[len(held)]
        )
        if messages(second) != held:
            raise StepFailed("the second window shows another conversation")
        demo.send("call server_time {}")
        first = wait_messages(demo, page, len(held) + 2, "server_time -> ")
        if wait_messages(demo, second, len(held) + 2, "server_time -> ") != first:
            raise StepFailed("the second window did not get the same turn")
        second.screenshot(path=str(demo.out / "second-window.png"), animations="disabled")
    finally:
        second.close()


def step_ready_again(demo: Demo) -> None:
    try:
        demo.wait(
            "document.body.dataset.app === 'ready'"
            " && document.getElementById('conn').dataset.state === 'open'",
            timeout=CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
    except Error as exc:
        raise StepFailed("the reloaded page did not connect") from exc


# ---------------------------------------------------------------------------- main


def run(url: str, out: Path) -> tuple[bool, list[str]]:
    """Run every step; return (passed, report lines)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*SCREENSHOTS, "failed.png", "chat-log.jsonl"]:
        (out / stale).unlink(missing_ok=True)
    session = f"drive-{secrets.token_hex(6)}"
    page_url = f"{url.rstrip('/')}/?session={session}"
    report: list[str] = []
    problems: list[str] = []

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(**CONFIG.launch_options())
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))

        def on_console(message: ConsoleMessage) -> None:
            if message.type == "error":
                problems.append(f"console error: {message.text}")

        page.on("console", on_console)
        demo = Demo(page, out)
        steps: list[tuple[str, Callable[[], None]]] = [
            ("open the page", lambda: step_open(demo, page_url)),
            ("wait until connected", lambda: step_ready(demo)),
            ("chip fills the input; get_timezone", lambda: step_chip_and_timezone(demo)),
            (
                "two tools in parallel; output shown as text",
                lambda: step_parallel_and_text_only(demo),
            ),
            ("long task with progress", lambda: step_long_task(demo)),
            ("two tools and an approval, approved", lambda: step_approval_approve(demo)),
            ("an approval, denied", lambda: step_approval_deny(demo)),
            ("server tool", lambda: step_server_tool(demo)),
            ("tool error", lambda: step_tool_error(demo)),
            ("plain text prompt", lambda: step_plain_text(demo)),
            ("dark theme from a tool", lambda: step_dark_theme(demo)),
            ("chat log: no state moves back, no flicker", lambda: step_chat_log(demo)),
            ("reload mid-answer: the conversation is whole", lambda: step_reload_mid_answer(demo)),
            ("reload after the answer: the same", lambda: step_reload_after_answer(demo)),
            ("a second window shows the chat live", lambda: step_second_window(demo, page_url)),
        ]
        passed = True
        try:
            for number, (name, action) in enumerate(steps, 1):
                started = time.monotonic()
                try:
                    action()
                    if problems:
                        raise StepFailed("; ".join(problems))
                except (StepFailed, Error, AssertionError) as exc:
                    report.append(f"FAILED step {number} ({name}): {exc}")
                    with contextlib.suppress(Error):
                        demo.shot("failed.png")
                    passed = False
                    break
                report.append(f"ok   step {number:2d} ({time.monotonic() - started:5.1f} s) {name}")
        finally:
            context.close()
            browser.close()
    if passed:
        shots = [name for name in SCREENSHOTS if (out / name).exists()]
        report.append(f"screenshots in {out}: {', '.join(shots)}")
    return passed, report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m demo.drive", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--url", default=DEFAULT_URL, help="the running demo (default: %(default)s)"
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="where screenshots go (default: build/demo)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    passed, report = run(args.url, args.out)
    for line in report:
        print(line, flush=True)
    print(f"{'passed' if passed else 'FAILED'} in {time.monotonic() - started:.1f} s", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
