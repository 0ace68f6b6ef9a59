// Tool-call arguments streamed as they are generated (issue 36 item 7), through the official
// `openai` and `@anthropic-ai/sdk` clients, against a scripted server whose model writes one call
// with a long string argument (tests/server/tool_stream_test.cpp). Usage:
//   node tool_stream_test.mjs BASE_URL MODEL stream
// Checks, in chat completions, Responses and Messages: the arguments arrive in more than one
// piece, the pieces concatenate to the non-streamed arguments byte for byte, and the clients' own
// stream helpers assemble the same call.
// Prints one line per check; exits 1 on the first failure.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { check, runMode } from './check.mjs';

const [base, model, mode] = process.argv.slice(2);
const root = base.replace(/\/v1$/, '');
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const anthropic = new Anthropic({ baseURL: root, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

const messages = [{ role: 'user', content: 'Write the file.' }];
const chatTools = [{ type: 'function', function: { name: 'write_file', parameters: { type: 'object' } } }];
const chatBody = { model, messages, tools: chatTools, max_tokens: 1000, thinking: { type: 'disabled' } };

function parsesAsObject(text) {
  try {
    const v = JSON.parse(text);
    return typeof v === 'object' && v !== null && typeof v.content === 'string' && v.content.length > 300;
  } catch {
    return false;
  }
}

async function stream() {
  const whole = await client.chat.completions.create(chatBody);
  const call = whole.choices[0].message.tool_calls[0];
  const args = call.function.arguments;
  check(call.function.name === 'write_file' && args.length > 300, `chat: one call with long arguments (${args.length} bytes)`);

  // Chat completions, raw chunks.
  let streamed = '';
  let pieces = 0;
  for await (const chunk of await client.chat.completions.create({ ...chatBody, stream: true })) {
    for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
      if (tc.function?.arguments) {
        streamed += tc.function.arguments;
        pieces += 1;
      }
    }
  }
  check(pieces > 1, `chat: arguments in ${pieces} pieces`);
  check(streamed === args, 'chat: the pieces concatenate to the non-streamed arguments');
  check(parsesAsObject(streamed), 'chat: the concatenated pieces parse as JSON with the long content');
  // The client's stream helper assembles the same call.
  const helper = client.chat.completions.stream({ ...chatBody });
  const final = await helper.finalChatCompletion();
  check(final.choices[0].message.tool_calls[0].function.arguments === args, 'chat: the stream helper assembles the same arguments');

  // Responses.
  const rBody = { model, input: 'Write the file.', reasoning: { effort: 'none' }, tools: [{ type: 'function', name: 'write_file', parameters: { type: 'object' } }] };
  const r = await client.responses.create(rBody);
  check(r.output[0].type === 'function_call' && r.output[0].arguments === args, 'responses: the same arguments');
  streamed = '';
  pieces = 0;
  let done = null;
  for await (const ev of await client.responses.create({ ...rBody, stream: true })) {
    if (ev.type === 'response.function_call_arguments.delta') {
      streamed += ev.delta;
      pieces += 1;
    }
    if (ev.type === 'response.function_call_arguments.done') done = ev.arguments;
  }
  check(pieces > 1, `responses: arguments in ${pieces} deltas`);
  check(streamed === args && done === args, 'responses: the deltas concatenate to the arguments (and .done carries them)');
  check(parsesAsObject(streamed), 'responses: the concatenated deltas parse as JSON with the long content');

  // Messages: input_json_delta pieces; the SDK's stream helper parses them into the same input.
  const mBody = { model, max_tokens: 1000, messages, thinking: { type: 'disabled' }, tools: [{ name: 'write_file', input_schema: { type: 'object' } }] };
  const m = await anthropic.messages.create(mBody);
  check(m.content[0].type === 'tool_use' && JSON.stringify(m.content[0].input) === JSON.stringify(JSON.parse(args)),
    'messages: the same input');
  streamed = '';
  pieces = 0;
  for await (const ev of await anthropic.messages.create({ ...mBody, stream: true })) {
    if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta') {
      streamed += ev.delta.partial_json;
      pieces += 1;
    }
  }
  check(pieces > 1, `messages: input_json_delta in ${pieces} pieces`);
  check(streamed === args, 'messages: the pieces concatenate to the arguments byte for byte');
  check(parsesAsObject(streamed), 'messages: the concatenated pieces parse as JSON with the long content');
  const sm = await anthropic.messages.stream(mBody).finalMessage();
  check(JSON.stringify(sm.content[0].input) === JSON.stringify(m.content[0].input), 'messages: the stream helper assembles the same input');
}

await runMode(mode, { basic: stream, stream });
