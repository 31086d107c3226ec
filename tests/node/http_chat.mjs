// The `ai` package's own chat (AbstractChat) over its DefaultChatTransport, against the
// reference server's HTTP chat transport; the page tools live in another client of the
// same session (a CPython ToolClient, started by the test).
//
//   node tests/node/http_chat.mjs http://127.0.0.1:PORT SESSION
//
// 1. One turn that calls the `echo` page tool: one POST, one response, the tool's output
//    before the answer, the status `streaming` from the first chunk to the end.
// 2. A turn whose `slow` tool is running when the response is cut (a network drop):
//    chat.resumeStream() GETs the rest, and the chat ends with one whole message.
// 3. A resume when nothing streams: the transport's GET answers 204 (null).
// Every response's raw event stream is parsed again with parseJsonEventStream and
// uiMessageChunkSchema, and read with readUIMessageStream (terminateOnError). Prints the
// result as JSON on stdout.
import {
  AbstractChat,
  DefaultChatTransport,
  parseJsonEventStream,
  readUIMessageStream,
  uiMessageChunkSchema,
} from 'ai';

const [base, session] = process.argv.slice(2);
const api = `${base}/agents/chat/${session}`;

// Every request the transport made, with the raw text of its response.
const requests = [];
// Armed: the next response is cut once a chunk of this type has been passed on.
let cutAfter = null;

async function recordingFetch(url, init) {
  const response = await fetch(url, init);
  const entry = { method: init?.method ?? 'GET', url: String(url), status: response.status, text: '' };
  requests.push(entry);
  if (!response.body || response.status === 204) return response;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let cutNext = false;
  const body = new ReadableStream({
    async pull(controller) {
      if (cutNext) {
        entry.cut = true;
        await reader.cancel();
        // What fetch raises when the network drops mid-body.
        controller.error(new TypeError('network error'));
        return;
      }
      const { done, value } = await reader.read();
      if (done) {
        controller.close();
        return;
      }
      entry.text += decoder.decode(value, { stream: true });
      controller.enqueue(value);
      if (cutAfter !== null && entry.text.includes(`"type":"${cutAfter}"`)) {
        cutAfter = null;
        cutNext = true;
      }
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: response.status, headers: response.headers });
}

// The ChatState the framework bindings implement, without a framework.
class MemoryChatState {
  constructor(onStatus) {
    this.onStatus = onStatus;
    this._status = 'ready';
    this.error = undefined;
    this.messages = [];
  }
  get status() {
    return this._status;
  }
  set status(status) {
    this._status = status;
    this.onStatus(status);
  }
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (index, message) => {
    this.messages = [
      ...this.messages.slice(0, index),
      this.snapshot(message),
      ...this.messages.slice(index + 1),
    ];
  };
  snapshot = (thing) => structuredClone(thing);
}

let statuses = [];

class NodeChat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new MemoryChatState((status) => statuses.push(status)) });
  }
}

const transport = new DefaultChatTransport({ api, fetch: recordingFetch, body: { theme: 'dark' } });
const errors = [];
const chat = new NodeChat({
  id: 'node-http-chat',
  transport,
  onError: (error) => errors.push(String(error)),
});

// A response's raw text, parsed and read again as the ai package's own functions do.
async function reread(text) {
  const bytes = new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode(text));
      controller.close();
    },
  });
  const rejected = [];
  const chunks = parseJsonEventStream({ stream: bytes, schema: uiMessageChunkSchema }).pipeThrough(
    new TransformStream({
      transform(result, controller) {
        if (result.success) controller.enqueue(result.value);
        else rejected.push(String(result.error));
      },
    }),
  );
  const types = [];
  const counted = chunks.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        types.push(chunk.type);
        controller.enqueue(chunk);
      },
    }),
  );
  let message;
  for await (const built of readUIMessageStream({ stream: counted, terminateOnError: true })) {
    message = built;
  }
  return { rejected, types, message };
}

async function turn(text) {
  statuses = [];
  const first = requests.length;
  await chat.sendMessage({ text });
  const made = requests.slice(first);
  return { statuses, requests: made, reread: await Promise.all(made.map((r) => reread(r.text))) };
}

const one = await turn('call echo {"origin": "node"}');

cutAfter = 'tool-input-available';
const two = await turn('call slow {"n": 3}');
const afterCut = { status: chat.status, messages: chat.messages.length };
statuses = [];
const before = requests.length;
await chat.resumeStream();
const resumed = {
  statuses,
  requests: requests.slice(before),
  reread: await Promise.all(requests.slice(before).map((r) => reread(r.text))),
};

const nothing = await transport.reconnectToStream({ chatId: chat.id });

console.log(
  JSON.stringify({
    one,
    two,
    afterCut,
    resumed,
    nothingActive: nothing === null,
    messages: chat.messages,
    status: chat.status,
    errors,
  }),
);
