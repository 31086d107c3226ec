// Runs UIMessageChunk streams through the real `ai` package, for the
// differential tests of clienttools/chat.py.
//
// Usage:
//   node read_ui_message_stream.mjs [FILE]          (stdin when no FILE)
//     input:  a JSON array of chunks, or {"name": ..., "chunks": [...]}
//     output: the final UIMessage as JSON (an empty assistant message when
//             no chunk built anything); schema failures and stream errors go to stderr, exit code 1
//             when a chunk fails `uiMessageChunkSchema`
//   node read_ui_message_stream.mjs --batch [FILE]
//     input:  a JSON array of {"name", "chunks"}
//     output: a JSON array of {"name", "message", "lastSnapshot",
//             "invalidChunks": [{"index", "error"}], "errors": [text]}
//   node read_ui_message_stream.mjs --partial-json [FILE]
//     input:  a JSON array of strings
//     output: a JSON array of {"value": ...} ({} when the AI SDK's
//             parsePartialJson gives undefined)
//
// "message" is the builder's state after the last chunk. readUIMessageStream
// only yields a snapshot when a chunk calls write(), and a few chunks change
// the message without it (start-step), so the last yielded snapshot
// ("lastSnapshot") can lag one part behind. To read the final state we pass
// `message`, an empty assistant message whose id is the stream's first
// `start.messageId`: readUIMessageStream then builds into that object in place
// (createStreamingUIMessageState keeps a given assistant message), and with
// the same id its reset-on-new-messageId rule is a no-op, exactly as for the
// fresh message it would otherwise create.

import { readFileSync } from 'node:fs';
import { parsePartialJson, readUIMessageStream, uiMessageChunkSchema } from 'ai';

const schema = uiMessageChunkSchema();

async function validateChunks(chunks) {
  const invalid = [];
  for (const [index, chunk] of chunks.entries()) {
    const result = await schema.validate(chunk);
    if (!result.success) {
      // zod's message lists every union branch; one line is enough to find it.
      const text = String(result.error?.message ?? result.error).replace(/\s+/g, ' ');
      invalid.push({ index, error: text.slice(0, 300) });
    }
  }
  return invalid;
}

async function runStream(chunks) {
  const errors = [];
  const firstStart = chunks.find(c => c?.type === 'start' && c.messageId != null);
  const initial = { id: firstStart?.messageId ?? '', role: 'assistant', parts: [] };
  const stream = new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
  let lastSnapshot = null;
  for await (const snapshot of readUIMessageStream({
    message: initial,
    stream,
    onError: error => errors.push(String(error?.message ?? error)),
  })) {
    lastSnapshot = snapshot;
  }
  // A later `start` with another messageId makes the SDK start a new object.
  const message =
    lastSnapshot != null && lastSnapshot.id !== initial.id ? lastSnapshot : initial;
  return { message: JSON.parse(JSON.stringify(message)), lastSnapshot, errors };
}

function readInput(path) {
  return JSON.parse(readFileSync(path ?? 0, 'utf8'));
}

async function main(argv) {
  const batch = argv.includes('--batch');
  const partial = argv.includes('--partial-json');
  const path = argv.find(arg => !arg.startsWith('--'));
  const input = readInput(path);

  if (partial) {
    const out = [];
    for (const text of input) {
      const { value } = await parsePartialJson(text);
      out.push(value === undefined ? {} : { value });
    }
    process.stdout.write(JSON.stringify(out));
    return 0;
  }

  if (batch) {
    const out = [];
    for (const { name, chunks } of input) {
      const invalidChunks = await validateChunks(chunks);
      out.push({ name, ...(await runStream(chunks)), invalidChunks });
    }
    process.stdout.write(JSON.stringify(out));
    return 0;
  }

  const chunks = Array.isArray(input) ? input : input.chunks;
  const invalid = await validateChunks(chunks);
  for (const { index, error } of invalid) {
    process.stderr.write(`chunk ${index} fails uiMessageChunkSchema: ${error}\n`);
  }
  const { message, errors } = await runStream(chunks);
  for (const error of errors) process.stderr.write(`stream error: ${error}\n`);
  process.stdout.write(JSON.stringify(message) + '\n');
  return invalid.length > 0 ? 1 : 0;
}

process.exitCode = await main(process.argv.slice(2));
