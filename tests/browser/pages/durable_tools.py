# The page of tests/browser/test_durability.py: one gated tool, and the page's chat.
# What the tool saw (per requestId: the attempts it was started with, how often it
# finished) lives in sessionStorage, so it survives a reload of the tab, and is
# published into #state with the chat's state for the test to read.
import asyncio
import json
from urllib.parse import parse_qs

import js
from pyodide.ffi import create_proxy

from clienttools import ToolClient, ToolContext

params = {k: v[0] for k, v in parse_qs(str(js.location.search).lstrip("?")).items()}
scheme = "wss" if str(js.location.protocol) == "https:" else "ws"
session = params.get("session", "durable")
client = ToolClient(f"{scheme}://{js.location.host}/agents/chat/{session}")
store = js.sessionStorage
# Read before the first publish() overwrites it: was a response in flight when
# the previous load of this tab went away?
was_active = store.getItem("chat_active") == "1"
if "gate" in params:
    store.setItem("gate", params["gate"])
# The chat id outlives a reload (like a real app's conversation id), so the
# reloaded page can resume the response it was following.
chat_id = params.get("chat") or store.getItem("chat_id") or client.chat.state.chat_id
client.chat.state.chat_id = str(chat_id)
store.setItem("chat_id", str(chat_id))
# Per chat turn, the request ids that carried it (the send, then any resumes).
turns: list[list[str]] = []
statuses: list[str] = []
client_statuses: list[str] = []


def load(key: str, default: object) -> object:
    value = store.getItem(key)
    # A missing key is JS null, which arrives as pyodide.ffi.jsnull (falsy, not None).
    return json.loads(str(value)) if value else default


def publish(*_: object) -> None:
    chat = client.chat
    request_id = chat.state.request_id
    if request_id is not None and turns and request_id not in turns[-1]:
        turns[-1].append(request_id)
    if not statuses or statuses[-1] != chat.status:
        statuses.append(chat.status)
    if not client_statuses or client_statuses[-1] != client.status:
        client_statuses.append(client.status)
    store.setItem("chat_active", "1" if chat.state.active else "0")
    js.document.getElementById("state").textContent = json.dumps(
        {
            "client": client.status,
            "clientStatuses": client_statuses,
            "runs": load("runs", {}),
            "chat": {
                "id": chat.state.chat_id,
                "status": chat.status,
                "error": chat.error,
                "statuses": statuses,
                "turns": turns,
                "messages": [m.to_wire() for m in chat.messages],
            },
        }
    )


def record(request_id: str, key: str, value: object) -> None:
    runs = load("runs", {})
    assert isinstance(runs, dict)
    entry = runs.setdefault(request_id, {"attempts": [], "done": 0})
    if key == "attempt":
        entry["attempts"].append(value)
    else:
        entry["done"] += 1
    store.setItem("runs", json.dumps(runs))
    publish()


@client.tool
async def work(job: str, ctx: ToolContext) -> str:
    """Do a job; waits while sessionStorage.gate is "closed"."""
    record(ctx.request_id, "attempt", ctx.attempt)
    while store.getItem("gate") == "closed":
        await asyncio.sleep(0.05)
    record(ctx.request_id, "done", None)
    return f"done {job}"


def send_chat(text: str) -> None:
    turns.append([])
    task = asyncio.ensure_future(client.chat.send(text))
    task.add_done_callback(lambda t: t.cancelled() or t.exception() or None)
    publish()


def resume_chat() -> None:
    # A reloaded page has no response in flight: rejoin the chat's response from
    # its first chunk, as a stock app would after a reload.
    turns.append([])
    task = asyncio.ensure_future(client.chat.resume())
    task.add_done_callback(lambda t: t.cancelled() or t.exception() or None)
    publish()


client.chat.on_change(publish)
client.on_status(publish)
js.window.sendChat = create_proxy(send_chat)
publish()
await client.connect()  # noqa: F704 (top-level await: Pyodide runs this with runPythonAsync)
if params.get("resume") == "1" or was_active:
    resume_chat()
js.document.getElementById("status").textContent = "connected"
