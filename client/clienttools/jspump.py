"""The socket's event handlers in JavaScript, shared by both browser flavours.

`PUMP_SOURCE` is the body of a `Function` that returns a factory; a flavour makes it
once per page (`new Function(PUMP_SOURCE)()`, where the page's Content-Security-Policy
allows it) and calls it once per socket:

    release = factory(ws, on_frame, on_batch, on_close, DIRECT_FRAMES, TURN_AFTER)

- a frame that arrives while the page is idle goes to `on_frame(data)` inside its
  `message` event, as the string itself: no event object crosses into Python and
  there is no event-loop turn between the socket and the session;
- after `DIRECT_FRAMES` frames without the page getting a free turn (a burst),
  frames wait in a backlog that one `MessageChannel` message hands to
  `on_batch(frames)` as one JS array: handling a burst frame by frame halves
  pipelined throughput, while a batch runs the same code back to back, warm;
- `on_close(code, reason)` comes after every frame that came before the close;
- `release()` drops the handlers (the socket's and the channel's).

The free-turn message is posted after `TURN_AFTER` direct frames, so a sequential
round trip (an ack, then the next invoke) posts one, not one per frame.
browser.py (Pyodide) also has the same logic in Python for a page that forbids
making functions; mpy.py needs none, since PyScript itself needs `eval`.
"""

__all__ = ["DIRECT_FRAMES", "PUMP_SOURCE", "TURN_AFTER"]

#: Frames in a row that `onmessage` hands straight to Python before the socket
#: starts batching. The sequential round trip needs 2 (an ack, then the next invoke).
DIRECT_FRAMES = 4
#: The direct frame after which the socket asks for a free turn (a `MessageChannel`
#: message) to learn that the page is idle again: once per round trip, not per frame.
TURN_AFTER = 2

PUMP_SOURCE = """
return (ws, onFrame, onBatch, onClose, directFrames, turnAfter) => {
  let direct = 0, backlog = [], turnPosted = false;
  const channel = new MessageChannel();
  const port = channel.port2;
  const turn = () => { if (!turnPosted) { turnPosted = true; port.postMessage(null); } };
  const drain = () => {
    if (backlog.length) { const frames = backlog; backlog = []; onBatch(frames); }
  };
  channel.port1.onmessage = () => { turnPosted = false; direct = 0; drain(); };
  ws.onmessage = (event) => {
    if (backlog.length || direct >= directFrames) { backlog.push(event.data); turn(); return; }
    direct++;
    if (direct >= turnAfter) turn();
    onFrame(event.data);
  };
  ws.onclose = (event) => { drain(); onClose(event.code, event.reason); };
  ws.onerror = () => {};  // a close event always follows
  return () => {
    ws.onmessage = null; ws.onclose = null; ws.onerror = null;
    channel.port1.onmessage = null; channel.port1.close(); backlog = [];
  };
};
"""
