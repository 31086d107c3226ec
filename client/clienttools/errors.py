"""The error every client core raises when its caller misuses it.

Like h11's split: ``LocalProtocolError`` means *we* used an API wrongly (a
second chat request while one is in flight, the end of a tool run the session
never started); nothing went out on the wire and the peer cannot cause it.
What the peer gets wrong is logged and ignored instead (rule C13), and a
response that ends in an error is ``chat.ChatResponseError``.

    >>> from clienttools.chat import ChatState
    >>> state = ChatState(chat_id="c1")
    >>> _ = state.begin_request("r1", "hi")
    >>> state.begin_request("r2", "again")
    Traceback (most recent call last):
    ...
    clienttools.errors.LocalProtocolError: a response is in progress; stop it or wait for it first
"""

from __future__ import annotations

__all__ = ["LocalProtocolError"]


class LocalProtocolError(Exception):
    """The caller misused a client core; nothing was sent, and the peer cannot cause this."""
