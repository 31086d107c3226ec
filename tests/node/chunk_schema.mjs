// Validates a batch of responses against the real `ai` package.
//
//   node tests/node/chunk_schema.mjs batch.json
//
// batch.json: [{id, complete, chunks: [UIMessageChunk, ...]}, ...]. Every chunk
// must pass `uiMessageChunkSchema`; every complete response (sequence 0 to
// `end`) must also build a UIMessage through `readUIMessageStream` without an
// error, which checks ordering (no tool output before its input, ...).
// Exit code 0 when all pass; 1 with one line per failure otherwise.
import { readFileSync } from 'node:fs';
import { readUIMessageStream, uiMessageChunkSchema } from 'ai';
import { safeValidateTypes } from '@ai-sdk/provider-utils';

const batch = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const failures = [];
let chunkCount = 0;

for (const response of batch) {
  for (const [index, chunk] of response.chunks.entries()) {
    chunkCount += 1;
    const result = await safeValidateTypes({ value: chunk, schema: uiMessageChunkSchema });
    if (!result.success) {
      failures.push(`${response.id} #${index} ${JSON.stringify(chunk).slice(0, 200)}: ${result.error.message.slice(0, 300)}`);
    }
  }
  if (!response.complete) continue;
  const stream = new ReadableStream({
    start(controller) {
      for (const chunk of response.chunks) controller.enqueue(chunk);
      controller.close();
    },
  });
  try {
    let last;
    for await (const message of readUIMessageStream({ stream, terminateOnError: false, onError: () => {} })) {
      last = message;
    }
    if (last === undefined && response.chunks.length > 0) {
      failures.push(`${response.id}: readUIMessageStream produced no message`);
    }
  } catch (error) {
    failures.push(`${response.id}: readUIMessageStream failed: ${error.message}`);
  }
}

if (failures.length > 0) {
  console.log(failures.join('\n'));
  process.exit(1);
}
console.log(`ok: ${chunkCount} chunks in ${batch.length} responses`);
