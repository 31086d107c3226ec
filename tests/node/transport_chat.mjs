// A conversation through the stock WebSocketChatTransport of the `ai` package.
//
//   node tests/node/transport_chat.mjs ws://127.0.0.1:PORT/agents/chat/SESSION
//
// Three turns (plain text; a server tool plus a browser tool in one response;
// a resume when nothing streams), each read with readUIMessageStream. Prints
// {"messages": [...], "resumedNothing": true} as JSON on stdout.
import WebSocket from 'ws';
import { WebSocketChatTransport, readUIMessageStream } from 'ai';

// Node 20 has no global WebSocket; the transport also takes one as an option.
globalThis.WebSocket ??= WebSocket;

const url = process.argv[2];
const transport = new WebSocketChatTransport({ url, webSocket: WebSocket });
const chatId = 'node-chat';
const messages = [];

async function turn(text) {
  messages.push({ id: `u${messages.length}`, role: 'user', parts: [{ type: 'text', text }] });
  const stream = await transport.sendMessages({
    trigger: 'submit-message',
    chatId,
    messageId: undefined,
    messages,
    abortSignal: undefined,
  });
  let last;
  for await (const message of readUIMessageStream({ stream, terminateOnError: true })) {
    last = message;
  }
  messages.push(last);
}

await turn('hello');
await turn('call server_time {}\ncall echo {"from": "node"}');
const resumed = await transport.reconnectToStream({ chatId });
transport.close();
console.log(JSON.stringify({ messages, resumedNothing: resumed === null }));
