"""Conversations stored on the server: each chat's UIMessages in the ledger (rules H1-H5).

The stored history is the truth. A ``send`` is merged into it (:func:`next_history`,
:func:`kept_prefix`: H1); the response's assistant message is built from its
chunks by the client's own :class:`~clienttools.message_builder.MessageBuilder`
and stored as its tool parts settle and once more in its final state, however
the response ends (:class:`ResponseRecorder`: H2). Every stored change goes to
the connections that subscribed to the chat (H3): this process's directly, the
other processes' through a ``chat`` notification on the bus that carries the
chat id only (each reads the row itself), and only to the processes the ledger
records as subscribed (:meth:`Ledger.subscribe_chat`), sent by the save itself:
a chat that only tabs on its own process follow costs no notification. A chat
belongs to the session that used it first (H5); ``cf_agent_chat_clear`` is
refused while a response streams (H4, the hub decides that).

    conversations = Conversations(ledger, clock, bus=None)
    prepared = await conversations.prepare("session-1", ...)           # H1, H5, size
    async with ledger.batch():                                         # the run and its history
        execution = await ledger.start_execution(...)
        await conversations.store_request(prepared, execution.id)
    await conversations.announce(prepared.chat_id)
    recorder = conversations.recorder("session-1", execution.id, request, replayed=False)
    emit = recorder.through(log.append)                                # the run's chunks
    await recorder.close(final=True)                                   # H2: the final state

A run's start commits with the history it answers, and its end with its message's
final state (:meth:`ResponseRecorder.store_final`): two transactions a chat fewer,
and, unless that save fails (then it is stored again after the end), no moment
in which a finished run's chat still shows its answer unfinished.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, cast

from pydantic import JsonValue

from clienttools.message_builder import MessageBuilder
from clienttools.protocol import (
    ChatClearFrame,
    ChatMessagesFrame,
    ChatSubscribeFrame,
    ChatTrigger,
    ProtocolErrorFrame,
)
from clienttools.uimessage import ToolPart, UIMessage

from ..canonical import canonical_json
from ..clock import Clock, Timer
from ..ledger import (
    CHAT_CHANGED,
    ChatOfOtherSession,
    ChatSummary,
    Ledger,
    LedgerClosed,
    LedgerUnavailable,
    StoredChat,
)

if TYPE_CHECKING:
    from ..calls.pages import Client
    from ..cluster.bus import Bus
    from .chunk_log import Chunk
    from .runs import RunRequest

logger = logging.getLogger(__name__)

#: A chat past either limit refuses the next ``send``; what it holds stays.
#: 5,000 messages or 10 MB of canonical JSON: far past a conversation a model's
#: context can take, well under what one ``GET /chats/{id}`` should carry.
MAX_CHAT_MESSAGES: Final = 5_000
MAX_CHAT_BYTES: Final = 10 * 1024 * 1024

# The chunks after which the assistant message is stored: a tool part settled
# or is waiting for a human. Text deltas are not: the final save has them, and a
# page that reloads mid-answer gets the rest from ``resume``.
_SAVE_AFTER: Final = frozenset(
    {
        "tool-approval-request",
        "tool-output-available",
        "tool-output-error",
        "tool-output-denied",
        "tool-input-error",
    }
)

# Seconds a save along the way waits for what else it can store with it: the
# outputs of parallel calls that settle together are one save, and a run that ends
# sooner stores its message once, with its end. Well under what a reload takes.
SAVE_DELAY: Final = 0.1

# What a refused chat frame says (H5): the same whether the chat exists or not.
OTHER_SESSION: Final = "this chat id cannot be used from this session"


def next_history(
    messages: Sequence[dict[str, JsonValue]],
    trigger: ChatTrigger,
    message_id: str | None,
    stored_last: dict[str, JsonValue] | None = None,
) -> list[dict[str, JsonValue]]:
    """H1: the history a ``send`` asks for.

    ``submit-message``: its messages. ``regenerate-message``: without the
    message it names (``messageId``; else the last stored message, if it is
    the assistant's) and all after it; a named user message stays, with what
    follows it dropped (as the ``ai`` package's ``Chat.regenerate`` slices).
    That client has sliced its messages already, so they do not hold the
    message; what the stored history still has after them goes by
    :func:`kept_prefix`. Only a client that did not slice is trimmed here.

    >>> u = {"id": "u1", "role": "user"}
    >>> a = {"id": "a1", "role": "assistant"}
    >>> [m["id"] for m in next_history([u, a], "regenerate-message", None, stored_last=a)]
    ['u1']
    >>> [m["id"] for m in next_history([u], "regenerate-message", None, stored_last=a)]
    ['u1']
    """
    history = list(messages)
    if trigger != "regenerate-message":
        return history
    target = message_id
    if target is None:
        last = stored_last if stored_last is not None else (history[-1] if history else None)
        if last is None or last.get("role") != "assistant":
            return history  # nothing answered last (an error, say): nothing to drop
        target = cast(str, last.get("id"))
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if message.get("id") == target:
            return history[: index if message.get("role") == "assistant" else index + 1]
    return history


def kept_prefix(stored: Sequence[str], history: Sequence[str]) -> int:
    """H1: how many stored messages stay: those up to the first that differs.

    Both are canonical JSON texts, so equal messages are equal strings. What
    follows in ``history`` replaces the rest (an edit), or is appended.

    >>> kept_prefix(["a", "b", "c"], ["a", "b", "c", "d"]), kept_prefix(["a", "b"], ["a", "x"])
    (3, 1)
    """
    kept = 0
    for old, new in zip(stored, history, strict=False):
        if old != new:
            break
        kept += 1
    return kept


@dataclass(frozen=True, slots=True)
class Prepared:
    """A ``send`` merged into the stored history, ready to be stored once its run starts."""

    session: str
    chat_id: str
    history: list[dict[str, JsonValue]]
    texts: list[str]
    kept: int
    # The chat was not stored when the send was merged: its first save makes it.
    new: bool


@dataclass(frozen=True, slots=True)
class Refusal:
    """A ``send`` the chat refuses: ``protocol`` (H5) or shown as the response's error."""

    message: str
    protocol: bool


class Conversations:
    """The stored chats of one server process and the connections subscribed to them."""

    def __init__(
        self,
        ledger: Ledger,
        clock: Clock,
        *,
        bus: Bus | None = None,
        max_messages: int = MAX_CHAT_MESSAGES,
        max_bytes: int = MAX_CHAT_BYTES,
    ) -> None:
        self.ledger = ledger
        self.clock = clock
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        # chat id -> connection id -> the connection: who gets the chat's changes (H3)
        self.subscribers: dict[str, dict[str, Client]] = {}
        # chat id -> the version last pushed to its subscribers: a notification read
        # after a later save finds that one already sent, and sends nothing again.
        self._pushed: dict[str, int] = {}
        # A chat's subscriptions change one at a time: the ledger's record of this
        # process as subscribed goes only once its last subscriber here has.
        self._changing = _PerChatLock()
        if bus is not None:
            bus.on(CHAT_CHANGED, self._on_changed)
            bus.on_reconnect(self._on_reconnect)

    # -- reading (the HTTP routes too)

    async def get(self, chat_id: str) -> StoredChat | None:
        return await self.ledger.get_chat(chat_id)

    async def listing(
        self,
        session: str | None,
        limit: int,
        before: str | None,
        sessions: Collection[str] | None = None,
    ) -> list[ChatSummary] | None:
        """Newest first, only of ``sessions`` if given; None if the ``before``
        cursor names no chat (or one of a session not in ``sessions``)."""
        cursor: tuple[float, str] | None = None
        if before is not None:
            found = await self.ledger.get_chat(before)
            if found is None or (sessions is not None and found.session not in sessions):
                return None
            cursor = (found.updated_at, found.id)
        return await self.ledger.chats(session, limit, cursor, sessions=sessions)

    async def delete(self, chat_id: str) -> bool:
        """Forget the chat; its subscribers get the empty list at version 0 (it is gone)."""
        deleted = await self.ledger.delete_chat(chat_id)
        if deleted:
            await self.announce(chat_id)
        return deleted

    async def prune(self, retention: float) -> int:
        return await self.ledger.prune_chats(retention, self.clock.now())

    # -- the frames (H3-H5)

    async def subscribe(self, client: Client, frame: ChatSubscribeFrame) -> None:
        chat_id = frame.id
        async with self._changing(chat_id):
            stored = await self.ledger.subscribe_chat(chat_id)
            refused = stored is not None and stored.session != client.session
            if refused or not client.is_open:  # closed meanwhile: drop() did not see it
                if chat_id not in self.subscribers:
                    await self.ledger.unsubscribe_chat(chat_id)
                if refused:
                    client.send(ProtocolErrorFrame(message=OTHER_SESSION))
                return
            self.subscribers.setdefault(chat_id, {})[client.id] = client
        client.send(_messages_frame(chat_id, stored))

    async def clear(self, client: Client, frame: ChatClearFrame, streaming: bool) -> None:
        """H4: refused while a response streams for the chat; else stored empty, announced."""
        stored = await self.ledger.get_chat(frame.id)
        if stored is not None and stored.session != client.session:
            client.send(ProtocolErrorFrame(message=OTHER_SESSION))
            return
        if streaming or (stored is not None and await self._streams(stored)):
            client.send(
                ProtocolErrorFrame(
                    message="a response is streaming for this chat: it was not cleared"
                )
            )
            return
        try:
            await self.ledger.save_chat(
                frame.id, client.session, 0, [], self.clock.now(), streaming=None
            )
        except ChatOfOtherSession:  # taken by another session meanwhile
            client.send(ProtocolErrorFrame(message=OTHER_SESSION))
            return
        await self.announce(frame.id)

    async def drop(self, client: Client) -> None:
        """A connection closed: it gets nothing more."""
        for chat_id in [c for c, subs in self.subscribers.items() if client.id in subs]:
            async with self._changing(chat_id):
                subs = self.subscribers.get(chat_id, {})
                subs.pop(client.id, None)
                if subs:
                    continue
                self.subscribers.pop(chat_id, None)
                self._pushed.pop(chat_id, None)
                try:
                    await self.ledger.unsubscribe_chat(chat_id)
                except (LedgerUnavailable, LedgerClosed) as exc:
                    # The row stays: this process is told of the chat's changes, and
                    # sends them to nobody, until it is forgotten or subscribes again.
                    logger.warning("chat %r: subscription not removed: %s", chat_id, exc)

    async def owned_elsewhere(self, session: str, chat_id: str) -> bool:
        """H5: does another session have this chat?"""
        stored = await self.ledger.get_chat(chat_id)
        return stored is not None and stored.session != session

    async def streams(self, chat_id: str) -> bool:
        """Does a run (on any process) still write into this chat?"""
        stored = await self.ledger.get_chat(chat_id)
        return stored is not None and await self._streams(stored)

    async def _streams(self, stored: StoredChat) -> bool:
        if stored.streaming is None:
            return False
        execution = await self.ledger.get_execution(stored.streaming)
        return execution is not None and not execution.finished

    # -- the run path: a send's history (H1), the response's message (H2)

    async def prepare(
        self,
        session: str,
        chat_id: str,
        trigger: ChatTrigger,
        message_id: str | None,
        messages: Sequence[dict[str, JsonValue]],
    ) -> Prepared | Refusal:
        """Merge a request into the stored history (H1); refuse another session's chat
        (H5) or one past its size limit. Nothing is written yet."""
        stored = await self.ledger.get_chat(chat_id)
        if stored is not None and stored.session != session:
            return Refusal(OTHER_SESSION, protocol=True)
        last = json.loads(stored.messages[-1]) if stored is not None and stored.messages else None
        history = next_history(messages, trigger, message_id, last)
        texts = [canonical_json(m) for m in history]
        size = sum(len(t.encode()) for t in texts)
        if len(texts) + 1 > self.max_messages or size > self.max_bytes:
            return Refusal(
                f"this chat is full (at most {self.max_messages:,} messages and "
                f"{self.max_bytes:,} bytes are stored): start a new chat",
                protocol=False,
            )
        kept = kept_prefix(stored.messages, texts) if stored is not None else 0
        return Prepared(session, chat_id, history, texts, kept, new=stored is None)

    async def store_request(self, prepared: Prepared, execution_id: str) -> bool:
        """H1: store the request's history, as the chat of the run it starts.

        Called in the ledger batch that starts the run, so the run and the history
        it answers commit together; :meth:`announce` it once that batch is over.
        """
        return await self._save(
            prepared.chat_id, prepared.session, prepared.kept, prepared.texts[prepared.kept :],
            streaming=execution_id, tell_subscribers=False, new=prepared.new,
        )  # fmt: skip

    def recorder(
        self, session: str, execution_id: str, request: RunRequest, *, replayed: bool
    ) -> ResponseRecorder:
        """The recorder of a run's answer. A new run's history is stored by
        :meth:`store_request`; a run ``replayed`` (a restart, a take-over) stores
        its whole history with the answer, not knowing what the first process stored."""
        return ResponseRecorder(self, session, execution_id, request, replayed=replayed)

    async def _save(
        self,
        chat_id: str,
        session: str,
        keep: int,
        texts: Sequence[str],
        *,
        streaming: str | None,
        tell_subscribers: bool = True,
        new: bool = False,
    ) -> bool:
        try:
            # The other processes subscribed to the chat are told when it commits.
            await self.ledger.save_chat(
                chat_id, session, keep, texts, self.clock.now(), streaming=streaming, new=new
            )
        except (ChatOfOtherSession, LedgerUnavailable) as exc:
            # The run goes on; what the page sees is its stream. A later save (the
            # final one) writes the message whole.
            logger.warning("chat %r not stored: %s", chat_id, exc)
            return False
        if tell_subscribers:
            await self.announce(chat_id)
        return True

    # -- a stored change to the subscribers here (H3); the ledger told the others

    async def announce(self, chat_id: str) -> None:
        """Send the chat as stored now to this process's subscribers of it."""
        subs = self.subscribers.get(chat_id)
        if not subs:
            return
        stored = await self.ledger.get_chat(chat_id)
        if stored is not None:
            if stored.version <= self._pushed.get(chat_id, 0):
                return
            self._pushed[chat_id] = stored.version
        else:
            self._pushed.pop(chat_id, None)
        frame = _messages_frame(chat_id, stored)
        for client in list(subs.values()):
            # A subscriber of another session never sees it (H5): it subscribed
            # before that session used the id first.
            if client.is_open and (stored is None or stored.session == client.session):
                client.send(frame)

    async def _on_changed(self, sender: str, args: tuple[str, ...]) -> None:
        if sender != self.ledger.owner:
            (chat_id,) = args
            await self.announce(chat_id)

    async def _on_reconnect(self) -> None:
        # Changes announced while the bus was away were missed: send what is newer.
        # The subscriptions are recorded again first: the database may have lost
        # them, or forgotten this process while it was away. Marked alive before
        # that, so another process's heartbeat does not forget it again with them.
        if self.subscribers:
            try:
                await self.ledger.keep_alive(self.clock.now())
            except LedgerUnavailable as exc:
                logger.warning("chats not resynced: %s", exc)
                return
        for chat_id in list(self.subscribers):
            try:
                async with self._changing(chat_id):
                    if chat_id in self.subscribers:
                        await self.ledger.subscribe_chat(chat_id)
                await self.announce(chat_id)
            except LedgerUnavailable as exc:  # away again: the next reconnect does it
                logger.warning("chat %r: not resynced: %s", chat_id, exc)


class _PerChatLock:
    """An asyncio lock per chat id, kept only while a task holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def __call__(self, chat_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(chat_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[chat_id]


def _messages_frame(chat_id: str, stored: StoredChat | None) -> ChatMessagesFrame:
    if stored is None:
        return ChatMessagesFrame(id=chat_id, messages=[], version=0)
    return ChatMessagesFrame(
        id=chat_id, messages=[json.loads(m) for m in stored.messages], version=stored.version
    )


class ResponseRecorder:
    """H2: one response's assistant message, built from its chunks and stored.

    Built by :class:`MessageBuilder`, the client's builder, so the stored
    message is the one the Python client shows. Stored at the position after
    the request's history (a response that continues the last assistant
    message replaces it), ``SAVE_DELAY`` after a chunk of ``_SAVE_AFTER`` (with
    what came meanwhile), and in its final state: by :meth:`store_final` in the
    transaction that ends the run, else by :meth:`close`. The saves along the
    way happen one at a time, in order, on a task of their own: the run never
    waits for them, and one not begun when the run ends is not made.

        await recorder.flush()              # the saves along the way are done
        async with ledger.batch():
            await ledger.set_status(...)    # the run's end commits ...
            await recorder.store_final()    # ... with the message in its last state
        await recorder.close(final=True)    # tells the subscribers (or stores, if not yet)
    """

    def __init__(
        self,
        conversations: Conversations,
        session: str,
        execution_id: str,
        request: RunRequest,
        *,
        replayed: bool,
    ) -> None:
        self._conversations = conversations
        self._session = session
        self._execution_id = execution_id
        self._chat_id = request.chat_id
        self._history = request.messages
        self._position = len(request.messages)
        self._builder = MessageBuilder(f"msg-{execution_id}")
        self._dirty = False
        self._timer: Timer | None = None  # the next save along the way, not begun
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self._final_stored = False
        # A run replayed (a restart, a take-over) writes its whole history with the
        # answer: whether the first process stored it before it went is not known.
        self._replayed = replayed

    @property
    def message(self) -> UIMessage:
        return self._builder.message

    def through(self, emit: Callable[[Chunk], None]) -> Callable[[Chunk], None]:
        """``emit`` that also builds the message from each chunk."""

        def recorded(chunk: Chunk) -> None:
            self.apply(chunk)
            emit(chunk)

        return recorded

    def apply(self, chunk: Chunk) -> None:
        kind = chunk.get("type")
        if kind == "start":
            self._continue(chunk.get("messageId"))
        self._builder.apply(chunk)
        if kind in _SAVE_AFTER and not self._closed:
            self._dirty = True
            writing = self._writer is not None and not self._writer.done()
            if self._timer is None and not writing:  # else the writer takes it in turn
                self._timer = self._conversations.clock.call_later(SAVE_DELAY, self._begin)

    def _begin(self) -> None:
        self._timer = None
        if not self._closed and (self._writer is None or self._writer.done()):
            self._writer = asyncio.get_running_loop().create_task(self._write())

    def _continue(self, message_id: JsonValue) -> None:
        """A response whose id is the last message's continues it (a round-trip)."""
        last = self._history[-1] if self._history else None
        if not isinstance(last, dict) or last.get("id") != message_id or not message_id:
            return
        if last.get("role") != "assistant" or self._builder.message.parts:
            return
        try:
            message = UIMessage.model_validate(last)
        except ValueError:
            return
        self._position = len(self._history) - 1
        self._builder.message = message
        for part in message.parts:
            if isinstance(part, ToolPart):
                self._builder.adopt(part)

    async def _write(self) -> None:
        while self._dirty:
            self._dirty = False
            await self._store(streaming=self._execution_id)

    async def _store(self, *, streaming: str | None, tell_subscribers: bool = True) -> bool:
        message = self._builder.message
        # A response that showed nothing (an error before its first part) leaves
        # no message, as on the page, which never places an empty one.
        texts = [canonical_json(message.to_wire())] if message.parts else []
        keep = self._position
        if self._replayed:
            texts = [canonical_json(m) for m in self._history[: self._position]] + texts
            keep = 0
        return await self._conversations._save(
            self._chat_id, self._session, keep, texts, streaming=streaming,
            tell_subscribers=tell_subscribers,
        )  # fmt: skip

    async def flush(self) -> None:
        """No more saves along the way: wait for the one in flight."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            await writer
        except asyncio.CancelledError:
            if not writer.cancelled():
                raise
        except Exception:
            # The response must still end for the page; what was stored stays.
            logger.exception("chat %r: the answer of run %s not stored", self._chat_id,
                             self._execution_id)  # fmt: skip

    async def store_final(self) -> None:
        """Store the message in its last state, in the ledger batch that ends the run,
        after :meth:`flush` (a save in flight must not be waited for inside a batch).

        Never raises: the run's end must not fail for its message. Once the batch
        commits, :meth:`close` only tells the subscribers; if it does not, or this
        save failed, :meth:`close` stores the message again.
        """
        try:
            stored = await self._store(streaming=None, tell_subscribers=False)
        except Exception:
            logger.exception("chat %r: the answer of run %s not stored with its end",
                             self._chat_id, self._execution_id)  # fmt: skip
            return
        if stored:
            self._conversations.ledger.after_commit(self._stored_final)

    def _stored_final(self) -> None:
        self._final_stored = True

    async def close(self, *, final: bool) -> None:
        """The response ended (``final``: its last state stored, and told) or stops here
        (shutdown, a lease lost: the run goes on elsewhere, and stores the message there)."""
        await self.flush()
        if not final:
            return
        try:
            if self._final_stored:
                await self._conversations.announce(self._chat_id)
            else:
                await self._store(streaming=None)
        except Exception:
            # The response must still end for the page; what was stored stays.
            logger.exception("chat %r: the answer of run %s not stored", self._chat_id,
                             self._execution_id)  # fmt: skip
