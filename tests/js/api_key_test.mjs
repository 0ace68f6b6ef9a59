// A `dsv41 serve` started with API keys, through the official clients (issue 37 item 2).
// Usage: node api_key_test.mjs BASE_URL MODEL KEY
// The openai client (Authorization: Bearer) and the Anthropic client (x-api-key) pass with KEY;
// without it, or with another key, each gets its SDK's AuthenticationError (401) in its API's
// error shape; a streamed answer works with the key.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { check, expectError } from './check.mjs';

const [base, model, key] = process.argv.slice(2);
const opts = { maxRetries: 0, timeout: 60000 };
// No key at all: the client insists on one, so its Authorization header is taken off instead.
const openai = (apiKey) => new OpenAI({ baseURL: `${base}/v1`, apiKey: apiKey || 'unused', ...opts,
                                        ...(apiKey ? {} : { defaultHeaders: { Authorization: null } }) });
const anthropic = (apiKey) => new Anthropic({ baseURL: base, apiKey, ...opts });
const chat = { model, max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] };

const models = await openai(key).models.list();
check(models.data.some((m) => m.id === model), 'openai client with the key: /v1/models');
const c = await openai(key).chat.completions.create(chat);
check(c.choices.length === 1, 'openai client with the key: a chat completion');
let chunks = 0;
for await (const ch of await openai(key).chat.completions.create({ ...chat, stream: true })) chunks += ch.choices.length;
check(chunks >= 1, 'openai client with the key: a streamed chat completion');
for (const [what, k] of [['no key', ''], ['another key', `${key}x`]]) {
  await expectError(openai(k).chat.completions.create(chat), OpenAI.AuthenticationError, 401,
    `openai client, ${what}`, (e) => check(e.code === 'invalid_api_key', `openai client, ${what}: code invalid_api_key (got ${e.code})`));
}
const m = await anthropic(key).messages.create({ ...chat, thinking: { type: 'disabled' } });
check(m.type === 'message', 'anthropic client with the key (x-api-key): a message');
await expectError(anthropic(`${key}x`).messages.create(chat), Anthropic.AuthenticationError, 401,
  'anthropic client, another key', (e) => check(e.error?.error?.type === 'authentication_error', 'anthropic client: authentication_error'));
console.log('all checks passed');
