// Forced tool calls with the official `@anthropic-ai/sdk` client (Messages API) against a running
// server whose model is the tiny random one (it writes no tool call by itself). Usage:
//   node anthropic_forced_tools_test.mjs BASE_URL MODEL MODE
// MODE "basic": tool_choice {type: "any"} and {type: "tool", name} at temperature 1, streamed and
// not, and disable_parallel_tool_use: every answer ends with stop_reason "tool_use", its tool_use
// blocks name a declared tool (the forced one when named) and their input validates under the
// tool's input_schema with ajv; a named tool missing from tools is a 400 invalid_request_error.
// Prints one line per check; exits 1 on the first failure.
import Anthropic from '@anthropic-ai/sdk';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { check, expectError, runMode } from './check.mjs';

const [base, model, mode] = process.argv.slice(2);
const client = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const ajv = new Ajv2020({ strict: false, validateFormats: true });
addFormats(ajv);

const schemas = {
  get_weather: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 10 }, unit: { enum: ['C', 'F'] } },
    required: ['city'],
  },
  set_alarm: {
    type: 'object',
    properties: { at: { type: 'string', pattern: '^[0-2][0-9]:[0-5][0-9]$' }, repeat: { type: 'boolean' } },
    required: ['at', 'repeat'],
  },
};
const validators = Object.fromEntries(Object.entries(schemas).map(([k, s]) => [k, ajv.compile(s)]));
const tools = Object.entries(schemas).map(([name, input_schema]) => ({ name, description: `the ${name} tool`, input_schema }));
const messages = [{ role: 'user', content: 'Help me.' }];
const off = { type: 'disabled' };
const validUse = (b, want, what) => {
  check(b.name in schemas, `${what}: a declared tool (${b.name})`);
  if (want) check(b.name === want, `${what}: the forced tool ${want} (got ${b.name})`);
  const validate = validators[b.name];
  check(validate(b.input), `${what}: input valid under ajv ${validate.errors ? ajv.errorsText(validate.errors) : ''}: ${JSON.stringify(b.input)}`);
};

async function basic() {
  const cases = [
    [{ type: 'any' }, null, false],
    [{ type: 'tool', name: 'set_alarm' }, 'set_alarm', false],
    [{ type: 'any', disable_parallel_tool_use: true }, null, true],
  ];
  for (const [tool_choice, want, one] of cases) {
    const m = await client.messages.create({ model, max_tokens: 600, temperature: 1, messages, tools, tool_choice, thinking: off });
    const what = `messages ${JSON.stringify(tool_choice)}`;
    check(m.stop_reason === 'tool_use', `${what}: stop_reason tool_use (got ${m.stop_reason})`);
    const uses = m.content.filter((b) => b.type === 'tool_use');
    check(uses.length >= 1 && (!one || uses.length === 1), `${what}: tool_use blocks (${uses.length})`);
    for (const b of uses) validUse(b, want, what);
  }

  const stream = client.messages.stream({
    model, max_tokens: 600, temperature: 1, messages, tools, tool_choice: { type: 'tool', name: 'get_weather' }, thinking: off,
  });
  const final = await stream.finalMessage();
  check(final.stop_reason === 'tool_use', `stream: stop_reason tool_use (got ${final.stop_reason})`);
  const uses = final.content.filter((b) => b.type === 'tool_use');
  check(uses.length >= 1, 'stream: tool_use blocks');
  for (const b of uses) validUse(b, 'get_weather', 'stream');

  await expectError(
    client.messages.create({ model, max_tokens: 5, messages, tools, tool_choice: { type: 'tool', name: 'nope' }, thinking: off }),
    Anthropic.BadRequestError, 400, 'unknown forced tool',
    (e) => {
      check(e.error?.type === 'error' && e.error?.error?.type === 'invalid_request_error', `unknown forced tool: Anthropic error shape (${JSON.stringify(e.error)})`);
      check(e.error.error.message.includes('tool_choice'), `unknown forced tool: names tool_choice (${e.error.error.message})`);
    });
}

await runMode(mode, { basic });
