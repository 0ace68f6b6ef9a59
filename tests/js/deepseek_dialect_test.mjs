// DeepSeek's API dialect (issue 36) through the official `openai` and `@anthropic-ai/sdk` clients,
// against the real `dsv41 serve` on a tiny checkpoint (its tokenizer has no FIM tokens). Usage:
//   node deepseek_dialect_test.mjs BASE_URL MODEL basic
// Checks: DeepSeek's thinking switch (extra body fields, as DeepSeek's docs send them), every
// effort name of DeepSeek's set in the three APIs mapped as docs/chat.md says (seen in the rendered
// prompt through /tokenize and /detokenize), the reasoning cap, usage with the prefix cache's hits
// (OpenAI's and DeepSeek's fields, streamed too), prefix completion on the /beta path, FIM's 400
// naming the missing token, return_token_ids, repetition_penalty changing greedy output, and a
// documented field that is not implemented refused naming it.
// Prints one line per check; exits 1 on the first failure.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { check, expectError, runMode } from './check.mjs';

const [base, model, mode] = process.argv.slice(2);
const root = base.replace(/\/v1$/, '');
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const beta = new OpenAI({ baseURL: `${root}/beta`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const anthropic = new Anthropic({ baseURL: root, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

const post = async (path, body) => {
  const r = await fetch(`${root}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return r.json();
};
const text = async (ids) => (await post('/detokenize', { tokens: ids })).prompt;
const effortOf = (prompt) => {
  const m = /Reasoning Effort: (\d+) /.exec(prompt);
  return m ? Number(m[1]) : null;
};
const question = [{ role: 'user', content: 'Say something.' }];
// docs/chat.md: DeepSeek's names folded to low / high / max, at the V4.1 encoder's numbers.
const table = { minimal: 25, low: 25, medium: 50, high: 50, xhigh: 50, max: 100, ultra: 100 };

async function basic() {
  // The thinking switch, as DeepSeek's docs send it through the openai client (extra body).
  const off = await client.chat.completions.create({ model, messages: question, max_tokens: 8, temperature: 0, thinking: { type: 'disabled' } });
  const msg = off.choices[0].message;
  check(msg.content.length > 0 && (msg.reasoning_content === null || msg.reasoning_content === undefined),
    'thinking disabled: the answer in content, no reasoning_content');
  check(off.usage.completion_tokens_details.reasoning_tokens === 0, 'thinking disabled: no reasoning tokens');

  // Every effort name in every API, mapped as the table says.
  for (const [name, n] of Object.entries(table)) {
    const rendered = await post('/tokenize', { messages: question, reasoning_effort: name });
    check(effortOf(await text(rendered.tokens)) === n, `chat reasoning_effort ${name} -> ${n}`);
    const kw = await post('/tokenize', { messages: question, chat_template_kwargs: { reasoning_effort: name } });
    check(JSON.stringify(kw.tokens) === JSON.stringify(rendered.tokens), `chat_template_kwargs.reasoning_effort ${name}`);
    const c = await client.chat.completions.create({ model, messages: question, max_tokens: 1, reasoning_effort: name });
    check(c.usage.prompt_tokens === rendered.count, `chat completion accepts ${name}`);
    const r = await client.responses.create({ model, input: 'Say something.', max_output_tokens: 1, reasoning: { effort: name } });
    check(r.usage.input_tokens === rendered.count && r.reasoning.effort === name, `responses reasoning.effort ${name}`);
    const a = await anthropic.messages.create({ model, max_tokens: 1, messages: question, output_config: { effort: name } });
    const count = await anthropic.messages.countTokens({ model, messages: question, output_config: { effort: name } });
    check(a.usage.input_tokens + a.usage.cache_read_input_tokens === rendered.count && count.input_tokens === rendered.count,
      `messages output_config.effort ${name}`);
  }
  const dflt = await post('/tokenize', { messages: question });
  check(effortOf(await text(dflt.tokens)) === 50, 'default: thinking on at high (50)');
  const none = await client.responses.create({ model, input: 'Say something.', max_output_tokens: 4, reasoning: { effort: 'none' } });
  check(none.output.every((o) => o.type !== 'reasoning'), 'responses effort none: no reasoning');

  // The reasoning cap: at most 5 reasoning tokens (the engine ends the reasoning), then an answer.
  for (const stream of [false, true]) {
    const req = { model, messages: question, max_tokens: 24, temperature: 0, thinking_token_budget: 5 };
    let content = '';
    let usage = null;
    if (!stream) {
      const r = await client.chat.completions.create(req);
      content = r.choices[0].message.content;
      usage = r.usage;
    } else {
      const s = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
      for await (const chunk of s) {
        content += chunk.choices[0]?.delta?.content ?? '';
        if (chunk.usage) usage = chunk.usage;
      }
    }
    const n = usage.completion_tokens_details.reasoning_tokens;
    check(n >= 1 && n <= 5 && content.length > 0, `thinking_token_budget 5${stream ? ', streamed' : ''}: ${n} reasoning tokens, then content`);
  }

  // Usage with the cache: a repeated long prompt reports its prefix-cache hits.
  const long = [{ role: 'user', content: 'Tell me about the weather in Paris and Lyon. '.repeat(30) }];
  const cold = await client.chat.completions.create({ model, messages: long, max_tokens: 2, temperature: 0 });
  const warm = await client.chat.completions.create({ model, messages: long, max_tokens: 2, temperature: 0 });
  const u = warm.usage;
  check(u.prompt_tokens_details.cached_tokens > 0 && u.prompt_cache_hit_tokens === u.prompt_tokens_details.cached_tokens &&
    u.prompt_cache_hit_tokens + u.prompt_cache_miss_tokens === u.prompt_tokens && u.prompt_tokens === cold.usage.prompt_tokens,
    `cached_tokens and DeepSeek's hit/miss on a repeated prompt (${JSON.stringify(u)})`);
  let streamedUsage = null;
  const s = await client.chat.completions.create({ model, messages: long, max_tokens: 2, temperature: 0, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of s) if (chunk.usage) streamedUsage = chunk.usage;
  check(streamedUsage.prompt_tokens_details.cached_tokens > 0 && streamedUsage.prompt_cache_hit_tokens > 0, 'streamed usage has the cache hits');
  const lc = await client.completions.create({ model, prompt: 'Tell me about the weather in Paris and Lyon. '.repeat(30), max_tokens: 2 });
  const lc2 = await client.completions.create({ model, prompt: 'Tell me about the weather in Paris and Lyon. '.repeat(30), max_tokens: 2 });
  check(lc2.usage.prompt_tokens_details.cached_tokens > 0 && lc2.usage.prompt_cache_hit_tokens > 0, 'completions usage has the cache hits');

  // Chat prefix completion on DeepSeek's beta path.
  const prefix = [...question, { role: 'assistant', content: 'Well,', prefix: true }];
  const p = await beta.chat.completions.create({ model, messages: prefix, max_tokens: 3, thinking: { type: 'disabled' }, return_token_ids: true });
  const rendered = await text(p.prompt_token_ids);
  check(rendered.endsWith('<｜Assistant｜></think>Well,') && p.choices[0].token_ids.length === p.usage.completion_tokens,
    'prefix: true continues the assistant text (/beta/chat/completions)');

  // FIM: this tokenizer has no FIM tokens: a 400 naming the token; return_token_ids on completions.
  await expectError(beta.completions.create({ model, prompt: 'def f(', suffix: 'return 1', max_tokens: 4 }),
    OpenAI.BadRequestError, 400, 'FIM without FIM tokens', (e) => {
      check(e.error.param === 'suffix' && e.error.message.includes('<｜fim▁begin｜>'), `names the missing token (${e.error.message})`);
    });
  const ids = await client.completions.create({ model, prompt: 'hello world', max_tokens: 3, return_token_ids: true });
  const t = await post('/tokenize', { prompt: 'hello world' });
  check(JSON.stringify(ids.choices[0].prompt_token_ids) === JSON.stringify(t.tokens) &&
    ids.choices[0].token_ids.length === ids.usage.completion_tokens, 'return_token_ids: prompt and output ids');

  // repetition_penalty changes greedy output: a bias makes token 500 the argmax everywhere; without
  // the penalty greedy repeats it, with it the token comes once.
  const g = { model, prompt: 'hello world', max_tokens: 12, temperature: 0, ignore_eos: true, logit_bias: { 500: 30 }, return_token_ids: true };
  const times = (r) => r.choices[0].token_ids.filter((x) => x === 500).length;
  const plain = await client.completions.create(g);
  const penal = await client.completions.create({ ...g, repetition_penalty: 100 });
  check(times(plain) === 12 && times(penal) === 1 && plain.choices[0].text !== penal.choices[0].text,
    `repetition_penalty changes greedy output (token 500: ${times(plain)} -> ${times(penal)} times)`);

  // A documented field this server does not implement: 400 naming it.
  await expectError(client.chat.completions.create({ model, messages: question, max_tokens: 2, use_beam_search: true }),
    OpenAI.BadRequestError, 400, 'use_beam_search', (e) => check(e.error.param === 'use_beam_search', 'param use_beam_search'));
}

await runMode(mode, { basic });
