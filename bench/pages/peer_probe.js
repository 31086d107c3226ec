// Loaded first by both pages of the peer benchmark (bench/peer.py), a classic script so it
// runs before any module. Both pages measure a turn with the same code (PeerTurn), on the
// page's own clock, from what the page's own chat reports: its status and its tool parts.
// It also counts the chat `send` frames each page writes on any WebSocket: one per request.
window.__peer = { status: "loading", error: null, sends: 0 };
(() => {
  const originalSend = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    if (typeof data === "string" && data.includes('"send"')) {
      try {
        if (JSON.parse(data).type === "send") window.__peer.sends += 1;
      } catch {
        // not JSON: not a chat request
      }
    }
    return originalSend.call(this, data);
  };
})();
window.__peer.fail = (error) => {
  window.__peer.error = String(error && error.stack ? error.stack : error);
  window.__peer.status = "failed";
};
window.__peer.wsUrl = () => new URLSearchParams(location.search).get("ws");

// The AI SDK's tool part states in order (rule C14): a part whose state goes to a lower
// rank than it had reached has moved backwards.
const TOOL_STATE_RANK = {
  "input-streaming": 0,
  "input-available": 1,
  "approval-requested": 2,
  "approval-responded": 3,
  "output-available": 4,
  "output-error": 4,
  "output-denied": 4,
};

// One turn: from the user's send to the chat's last `ready`. Pages call status() on every
// status change and part() for every tool part after every change.
class PeerTurn {
  constructor(status) {
    this.t0 = performance.now();
    this.sends0 = window.__peer.sends;
    this.last = status;
    this.statuses = [status];
    this.readyAt = [];
    this.readyMs = 0;
    this.rank = new Map();
    this.backwards = 0;
    this.finishReasons = [];
    this.endedAt = null;
  }
  status(status) {
    if (status === this.last || this.endedAt !== null) return;
    const now = performance.now();
    // Time spent in a `ready` entered inside the turn (the one before the send is not).
    if (this.last === "ready" && this.readyAt.length) {
      this.readyMs += now - this.readyAt[this.readyAt.length - 1];
    }
    this.last = status;
    this.statuses.push(status);
    if (status === "ready") this.readyAt.push(now);
  }
  part(toolCallId, state) {
    if (this.endedAt !== null) return;
    const rank = TOOL_STATE_RANK[state];
    if (rank === undefined) return;
    const reached = this.rank.get(toolCallId);
    if (reached !== undefined && rank < reached) this.backwards += 1;
    if (reached === undefined || rank > reached) this.rank.set(toolCallId, rank);
  }
  finish(reason) {
    this.finishReasons.push(reason);
  }
  // outcome: "answered" | "no-answer" | "error" | "unclassified"
  result(outcome, detail, text) {
    this.endedAt = performance.now();
    const endedReady = this.last === "ready";
    const end = endedReady ? this.readyAt[this.readyAt.length - 1] : this.endedAt;
    return {
      ms: end - this.t0,
      requests: window.__peer.sends - this.sends0,
      // Every `ready` inside the turn but the one that ends it.
      readyFlips: this.readyAt.length - (endedReady ? 1 : 0),
      readyMs: this.readyMs,
      backwards: this.backwards,
      toolCalls: this.rank.size,
      statuses: this.statuses,
      finishReasons: this.finishReasons,
      outcome,
      detail: detail || null,
      text,
    };
  }
}
window.__peer.PeerTurn = PeerTurn;
window.__peer.newTurn = (status) => new PeerTurn(status);
