# Page (a) of the peer benchmark: clienttools, its Chat, the three tools in Python (RPC).
import asyncio

import js
from pyodide.ffi import create_proxy

import clienttools
from clienttools import Chat
from clienttools.chat import ChatResponseError

TURN_TIMEOUT_S = 60.0
RESET_WAIT_S = 1.0
peer = js.window.__peer
client = clienttools.ToolClient(str(peer.wsUrl()))


@client.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@client.tool
def upper(text: str) -> str:
    """The text in upper case."""
    return text.upper()


@client.tool
def lookup(key: str) -> dict[str, object]:
    """A record for the key."""
    return {"key": key, "length": len(key)}


async def turn(text: str, expected: str) -> object:
    chat = client.chat
    # Every turn is the same work: a conversation that grew over hundreds of turns would
    # make later requests heavier (page (b) empties chat.messages the same way). The
    # reset is not the turn: page (b) resets in memory, so the turn starts once the
    # server's empty conversation is here (or after RESET_WAIT_S, if it never comes).
    version = chat.state.version
    chat.clear()
    waited = 0.0
    while chat.state.version == version and waited < RESET_WAIT_S:
        await asyncio.sleep(0.002)
        waited += 0.002
    record = peer.newTurn(chat.status)

    def changed(c: Chat) -> None:
        record.status(c.status)
        message = c.state.response_message
        if message is not None:
            for part in message.tool_parts:
                record.part(part.tool_call_id, part.state)

    unsubscribe = chat.on_change(changed)
    try:
        message = await asyncio.wait_for(chat.send(text), TURN_TIMEOUT_S)
    except ChatResponseError as exc:
        return record.result("error", str(exc), "")
    except TimeoutError:
        return record.result("unclassified", "no end within the turn timeout", "")
    finally:
        unsubscribe()
    answer = message.text
    if answer == expected:
        return record.result("answered", None, answer)
    if not answer:
        return record.result("no-answer", "the response ended without text", answer)
    return record.result("unclassified", "text other than the expected answer", answer)


await client.connect()  # type: ignore[top-level-await]  # noqa: F704 (runPythonAsync allows it)
peer.turn = create_proxy(turn)
peer.status = "ready"
