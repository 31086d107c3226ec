// Page (b) of the peer benchmark: the `ai` package's own chat (AbstractChat with a minimal
// in-memory ChatState, as its React/Vue/Svelte bindings give it one) over its
// WebSocketChatTransport, with the three tools in JavaScript, the AI SDK's client-tool
// pattern: onToolCall + addToolOutput + sendAutomaticallyWhen. /ai/ai.mjs is the ai
// package bundled by esbuild (scripts/build_web.py).
import {
  AbstractChat,
  WebSocketChatTransport,
  lastAssistantMessageIsCompleteWithToolCalls,
} from "/ai/ai.mjs";

const peer = window.__peer;
// A response that ended at tool calls and started no continuation within this long is a
// dead end. No later send can rescue it: nothing else would send.
const DEAD_END_MS = 5000;
const TURN_TIMEOUT_MS = 60000;

const TOOLS = {
  add: ({ a, b }) => a + b,
  upper: ({ text }) => text.toUpperCase(),
  lookup: ({ key }) => ({ key, length: key.length }),
};
// What the server offers the model: the same specs page (a)'s SDK derives from its Python.
const SPECS = [
  {
    name: "add",
    description: "Add two integers.",
    inputSchema: {
      type: "object",
      properties: { a: { type: "integer" }, b: { type: "integer" } },
      required: ["a", "b"],
    },
  },
  {
    name: "upper",
    description: "The text in upper case.",
    inputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  },
  {
    name: "lookup",
    description: "A record for the key.",
    inputSchema: { type: "object", properties: { key: { type: "string" } }, required: ["key"] },
  },
];

// The ChatState the framework bindings implement, without a framework: plain fields,
// a new array on every change (as React's does), structuredClone for snapshots.
class MemoryChatState {
  constructor(onChange) {
    this.onChange = onChange;
    this._status = "ready";
    this.error = undefined;
    this.messages = [];
  }
  get status() {
    return this._status;
  }
  set status(status) {
    this._status = status;
    this.onChange();
  }
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
    this.onChange();
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
    this.onChange();
  };
  replaceMessage = (index, message) => {
    this.messages = [
      ...this.messages.slice(0, index),
      this.snapshot(message),
      ...this.messages.slice(index + 1),
    ];
    this.onChange();
  };
  snapshot = (thing) => structuredClone(thing);
}

class BrowserChat extends AbstractChat {
  constructor(init) {
    const state = new MemoryChatState(() => current && observe(current.record));
    super({ ...init, state });
  }
}

const textOf = (message) =>
  message && message.role === "assistant"
    ? message.parts.filter((p) => p.type === "text").map((p) => p.text).join("")
    : "";

function observe(record) {
  record.status(chat.status);
  const message = chat.lastMessage;
  if (!message || message.role !== "assistant") return;
  for (const part of message.parts) {
    if (part.type.startsWith("tool-") || part.type === "dynamic-tool") {
      record.part(part.toolCallId, part.state);
    }
  }
}

let current = null; // { record, expected, resolve, deadEnd, timeout }

function end(outcome, detail) {
  const turn = current;
  if (turn === null) return;
  current = null;
  clearTimeout(turn.deadEnd);
  clearTimeout(turn.timeout);
  turn.resolve(turn.record.result(outcome, detail, textOf(chat.lastMessage)));
}

const chat = new BrowserChat({
  id: "peer-aichat",
  transport: new WebSocketChatTransport({ url: peer.wsUrl() }),
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls,
  onToolCall: ({ toolCall }) => {
    const run = TOOLS[toolCall.toolName];
    // Not awaited: awaiting addToolOutput inside onToolCall deadlocks the chat (its docs).
    if (run === undefined) {
      chat.addToolOutput({
        state: "output-error",
        tool: toolCall.toolName,
        toolCallId: toolCall.toolCallId,
        errorText: `unknown tool ${toolCall.toolName}`,
      });
      return;
    }
    chat.addToolOutput({
      tool: toolCall.toolName,
      toolCallId: toolCall.toolCallId,
      output: run(toolCall.input),
    });
  },
  onFinish: ({ finishReason, isError, isAbort }) => {
    const turn = current;
    if (turn === null) return;
    clearTimeout(turn.deadEnd);
    turn.record.finish(isError ? "error" : isAbort ? "abort" : finishReason ?? "none");
    if (isError || isAbort) {
      end("error", String(chat.error || "aborted"));
      return;
    }
    if (finishReason === "tool-calls") {
      const sends = peer.sends;
      turn.deadEnd = setTimeout(() => {
        if (current === turn && peer.sends === sends) {
          end("no-answer", "ended at tool calls; no continuation was sent");
        }
      }, DEAD_END_MS);
      return;
    }
    const text = textOf(chat.lastMessage);
    if (text === turn.expected) end("answered", null);
    else if (!text) end("no-answer", `finished (${finishReason}) without text`);
    else end("unclassified", "text other than the expected answer");
  },
});

peer.turn = (text, expected) =>
  new Promise((resolve) => {
    chat.messages = []; // every turn is the same work (page (a) does the same)
    const record = peer.newTurn(chat.status);
    const turn = { record, expected, resolve, deadEnd: undefined, timeout: undefined };
    current = turn;
    turn.timeout = setTimeout(() => {
      if (current === turn) end("unclassified", "no end within the turn timeout");
    }, TURN_TIMEOUT_MS);
    chat.sendMessage({ text }).catch((error) => {
      if (current === turn) end("error", String(error));
    });
  });

// The page's tools, registered with the server on a socket of their own (the transport
// speaks only chat frames), the way a clienttools page registers them: the server offers
// them to the model, and in round-trip mode leaves their calls to this page.
function registerTools() {
  return new Promise((resolve, reject) => {
    const socket = new WebSocket(peer.wsUrl());
    socket.onopen = () =>
      socket.send(
        JSON.stringify({
          type: "cf_agent_client_tools",
          protocol: 1,
          clientId: "peer-aichat",
          tools: SPECS,
        }),
      );
    socket.onmessage = (event) => {
      const frame = JSON.parse(event.data);
      if (frame.type !== "cf_agent_client_tools_ack") return;
      if (frame.rejected.length) reject(new Error(JSON.stringify(frame.rejected)));
      else resolve(socket);
    };
    socket.onerror = () => reject(new Error("the tools socket failed"));
  });
}

try {
  peer.toolsSocket = await registerTools();
  peer.status = "ready";
} catch (error) {
  peer.fail(error);
}
