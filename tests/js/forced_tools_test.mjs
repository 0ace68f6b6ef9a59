// Forced tool calls with the official `openai` npm client against a running server whose model is
// the tiny random one (it writes no tool call by itself). Usage:
//   node forced_tools_test.mjs BASE_URL MODEL MODE
// MODE "basic": chat completions with tool_choice "required" and a named function (streamed and
// not, n = 2) and the Responses API's tool_choice, at temperature 1: every answer ends with
// finish_reason "tool_calls" / function_call items, names a declared tool (the forced one when
// named), and its arguments validate under that tool's schema with ajv (draft 2020-12,
// ajv-formats); a named tool missing from tools is a BadRequestError naming tool_choice.
// Prints one line per check; exits 1 on the first failure.
import OpenAI from 'openai';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { check, expectError, runMode } from './check.mjs';

const [base, model, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const ajv = new Ajv2020({ strict: false, validateFormats: true });
addFormats(ajv);

const schemas = {
  forecast: {
    type: 'object',
    properties: {
      city: { type: 'string', minLength: 1, maxLength: 10 },
      days: { type: 'integer', minimum: 1, maximum: 7 },
      unit: { enum: ['C', 'F'] },
    },
    required: ['city', 'days'],
    additionalProperties: false,
  },
  book: {
    type: 'object',
    properties: {
      date: { type: 'string', format: 'date' },
      seats: { type: 'array', items: { type: 'integer', minimum: 1, maximum: 40 }, maxItems: 3 },
      note: { type: ['string', 'null'], maxLength: 8 },
    },
    required: ['date', 'seats'],
  },
};
const validators = Object.fromEntries(Object.entries(schemas).map(([k, s]) => [k, ajv.compile(s)]));
const tools = Object.entries(schemas).map(([name, parameters]) => ({
  type: 'function', function: { name, description: `the ${name} tool`, parameters, strict: true },
}));
const validCall = (name, args, want, what) => {
  check(name in schemas, `${what}: a declared tool (${name})`);
  if (want) check(name === want, `${what}: the forced tool ${want} (got ${name})`);
  let v;
  try {
    v = JSON.parse(args);
  } catch (e) {
    check(false, `${what}: arguments are JSON (${e.message}): ${args}`);
  }
  const validate = validators[name];
  check(validate(v), `${what}: arguments valid under ajv ${validate.errors ? ajv.errorsText(validate.errors) : ''}: ${args}`);
};
const noThinking = { chat_template_kwargs: { thinking: false } };
const messages = [{ role: 'user', content: 'Plan a trip.' }];

async function basic() {
  for (const [tool_choice, want] of [['required', null], [{ type: 'function', function: { name: 'book' } }, 'book']]) {
    const r = await client.chat.completions.create({
      model, messages, tools, tool_choice, temperature: 1, max_tokens: 600, n: 2, seed: 3, ...noThinking,
    });
    for (const [i, c] of r.choices.entries()) {
      check(c.finish_reason === 'tool_calls', `chat ${want ?? 'required'} choice ${i}: finish_reason tool_calls (got ${c.finish_reason})`);
      check(c.message.tool_calls?.length >= 1, `chat choice ${i}: tool calls`);
      for (const t of c.message.tool_calls) validCall(t.function.name, t.function.arguments, want, `chat choice ${i}`);
    }
  }

  const stream = await client.chat.completions.create({
    model, messages, tools, tool_choice: { type: 'function', function: { name: 'forecast' } },
    temperature: 1, max_tokens: 600, seed: 4, stream: true, ...noThinking,
  });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      finish = c.finish_reason ?? finish;
      for (const d of c.delta?.tool_calls ?? []) {
        calls[d.index] ??= { name: '', args: '' };
        calls[d.index].name += d.function?.name ?? '';
        calls[d.index].args += d.function?.arguments ?? '';
      }
    }
  }
  check(finish === 'tool_calls', `chat stream: finish_reason tool_calls (got ${finish})`);
  check(calls.length >= 1, 'chat stream: tool calls');
  for (const c of calls) validCall(c.name, c.args, 'forecast', 'chat stream');

  const rtools = tools.map((t) => ({ type: 'function', name: t.function.name, parameters: t.function.parameters, strict: true }));
  for (const [tool_choice, want] of [['required', null], [{ type: 'function', name: 'forecast' }, 'forecast']]) {
    const r = await client.responses.create({
      model, input: 'Plan a trip.', tools: rtools, tool_choice, temperature: 1, max_output_tokens: 600,
      reasoning: { effort: 'none' },
    });
    const fcs = r.output.filter((o) => o.type === 'function_call');
    check(fcs.length >= 1, `responses ${want ?? 'required'}: function_call items (got ${JSON.stringify(r.output).slice(0, 200)})`);
    for (const f of fcs) validCall(f.name, f.arguments, want, `responses ${want ?? 'required'}`);
  }

  await expectError(
    client.chat.completions.create({
      model, messages, tools, max_tokens: 5, ...noThinking, tool_choice: { type: 'function', function: { name: 'nope' } },
    }),
    OpenAI.BadRequestError, 400, 'unknown forced tool',
    (e) => check(e.error.param === 'tool_choice', `unknown forced tool: param tool_choice (got ${e.error.param})`));
}

await runMode(mode, { basic });
