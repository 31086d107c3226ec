// Edit and regenerate (rule H1) through the `ai` package's own AbstractChat.
//
//   node tests/node/abstract_chat_edit.mjs ws://127.0.0.1:PORT/agents/chat/SESSION CHAT_ID
//
// Two turns, then `regenerate()` (the last answer), then `sendMessage` with the
// first user message's id and a new text (an edit). After each step it reads
// the server's stored chat (GET /chats/{id}) and prints, as JSON on stdout,
// what the chat holds and what the server stored:
// {"steps": [{"step", "chat": [...], "stored": [...]}]}
import WebSocket from 'ws';
import { AbstractChat, WebSocketChatTransport } from 'ai';

globalThis.WebSocket ??= WebSocket;

const [url, chatId] = process.argv.slice(2);
const http = url.replace(/^ws/, 'http').replace(/\/agents\/chat\/[^/]+$/, '');

// The smallest ChatState: what AbstractChat reads and writes, kept as plain arrays.
class State {
  constructor() {
    this.messages = [];
    this.status = 'ready';
    this.error = undefined;
  }
  pushMessage = (message) => { this.messages = this.messages.concat(message); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (index, message) => {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  };
  snapshot = (thing) => structuredClone(thing);
}

const transport = new WebSocketChatTransport({ url, webSocket: WebSocket });
const chat = new AbstractChat({ id: chatId, transport, state: new State() });
const steps = [];

async function record(step) {
  if (chat.status === 'error') throw chat.error;
  const reply = await fetch(`${http}/chats/${encodeURIComponent(chatId)}`);
  const stored = await reply.json();
  steps.push({ step, chat: structuredClone(chat.messages), stored: stored.messages });
}

await chat.sendMessage({ text: 'hello' });
await record('first');
await chat.sendMessage({ text: 'call server_time {}' });
await record('second');
await chat.regenerate();
await record('regenerate');
const firstUser = chat.messages[0].id;
await chat.sendMessage({ text: 'hello, edited', messageId: firstUser });
await record('edit');
transport.close();
console.log(JSON.stringify({ steps }));
