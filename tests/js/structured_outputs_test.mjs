// Structured outputs with the official `openai` npm client against a running server whose model
// is the tiny random one (it writes no JSON by itself). Usage:
//   node structured_outputs_test.mjs BASE_URL MODEL MODE
// MODE "basic": chat completions with response_format json_schema (strict) at temperature 1, n = 3,
//   streamed and not, and completions with vLLM's structured_outputs (json, choice): every answer
//   finishes with "stop" and validates under ajv (draft 2020-12, ajv-formats); an unsupported
//   schema keyword is a BadRequestError naming the field and the keyword's path.
// Prints one line per check; exits 1 on the first failure.
import OpenAI from 'openai';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { check, expectError, runMode } from './check.mjs';

const [base, model, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const ajv = new Ajv2020({ strict: false, validateFormats: true });
addFormats(ajv);

const schema = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 12 },
    id: { type: 'string', format: 'uuid' },
    born: { type: 'string', format: 'date' },
    score: { type: 'number', minimum: 0, maximum: 10 },
    level: { enum: ['low', 'mid', 'high'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 5 }, maxItems: 2 },
  },
  required: ['name', 'id', 'born', 'score', 'level', 'tags'],
  additionalProperties: false,
};
const validate = ajv.compile(schema);
const valid = (text, what) => {
  let v;
  try {
    v = JSON.parse(text);
  } catch (e) {
    check(false, `${what}: JSON (${e.message}): ${text}`);
  }
  check(validate(v), `${what}: valid under ajv ${validate.errors ? ajv.errorsText(validate.errors) : ''}: ${text}`);
};
const noThinking = { chat_template_kwargs: { thinking: false } };
const messages = [{ role: 'user', content: 'Describe a person.' }];
const responseFormat = { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } };

async function basic() {
  const r = await client.chat.completions.create({
    model, messages, temperature: 1, max_tokens: 300, n: 3, response_format: responseFormat, ...noThinking,
  });
  check(r.choices.length === 3, 'chat: three choices');
  for (const [i, c] of r.choices.entries()) {
    check(c.finish_reason === 'stop', `chat choice ${i}: finish_reason stop (got ${c.finish_reason}: ${c.message.content})`);
    valid(c.message.content, `chat choice ${i}`);
  }

  const stream = await client.chat.completions.create({
    model, messages, temperature: 1, max_tokens: 300, seed: 11, stream: true,
    response_format: responseFormat, ...noThinking,
  });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      finish = c.finish_reason ?? finish;
    }
  }
  check(finish === 'stop', `chat stream: finish_reason stop (got ${finish})`);
  valid(text, 'chat stream');

  const comp = await client.completions.create({
    model, prompt: 'person:', temperature: 1, max_tokens: 300, n: 2, structured_outputs: { json: schema },
  });
  for (const [i, c] of comp.choices.entries()) {
    check(c.finish_reason === 'stop', `completions choice ${i}: finish_reason stop`);
    valid(c.text, `completions choice ${i}`);
  }
  const choice = await client.completions.create({
    model, prompt: 'pick:', temperature: 1, max_tokens: 20, structured_outputs: { choice: ['left', 'right'] },
  });
  check(['left', 'right'].includes(choice.choices[0].text), `completions choice: one of the list (${choice.choices[0].text})`);

  await expectError(
    client.chat.completions.create({
      model, messages, max_tokens: 5, ...noThinking,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { not: {} } } } } },
    }),
    OpenAI.BadRequestError, 400, 'unsupported keyword',
    (e) => {
      check(e.error.param === 'response_format.json_schema.schema', `unsupported keyword: param (got ${e.error.param})`);
      check(e.error.message.includes('"not" at /properties/a/not'), `unsupported keyword: message names it and its path (${e.error.message})`);
    });
}

await runMode(mode, { basic });
