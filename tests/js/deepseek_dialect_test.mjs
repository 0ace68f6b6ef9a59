// DeepSeek's API dialect (issue 36) through the official `openai` and `@anthropic-ai/sdk` clients.
// Usage: node deepseek_dialect_test.mjs BASE_URL MODEL MODE
// MODE "basic": the real `dsv41 serve` on the demo model (random weights, the derived V4.1
//   tokenizer with DeepSeek's FIM tokens; it never closes its thinking by itself). Checks
//   DeepSeek's thinking switch (extra body fields, as DeepSeek's docs send them), every effort name
//   of DeepSeek's set in the three APIs mapped as docs/chat.md says (seen in the rendered prompt
//   through /tokenize and /detokenize), the reasoning cap (thinking_token_budget, and Messages'
//   thinking.budget_tokens at its 1,024 minimum), usage with the prefix cache's hits (OpenAI's and
//   DeepSeek's fields, streamed too), prefix completion on the /beta path, FIM completion (the FIM
//   tokens around the prompt's and the suffix's ids, streamed too), vLLM's fields
//   (return_token_ids, min_tokens, bad_words, include_stop_str_in_output, skip_special_tokens,
//   truncate_prompt_tokens, repetition_penalty), Claude Code's billing-header system block left
//   out of the prompt, and a documented field that is not implemented refused naming it.
// MODE "defaults": the demo model served with --served-model-name MODEL deepseek-chat,
//   --reasoning-budget 3, --default-chat-template-kwargs '{"reasoning_effort":"max"}' and
//   --override-generation-config '{"max_new_tokens":6}': /v1/models shows them, a request naming
//   the alias is answered as MODEL, and each default acts.
// MODE "fim-missing": a server whose tokenizer has no FIM tokens: FIM is a 400 naming the token.
// MODE "parallel": a scripted model writing two tool calls: parallel_tool_calls false (Messages:
//   disable_parallel_tool_use) keeps the first only, streamed or not, in the three APIs.
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

  // Messages' thinking.budget_tokens caps too, at 1,024 (Anthropic's minimum, and ours): of
  // max_tokens 1026 the reasoning takes 1,024 (its </think> included) and the answer the last two.
  // Without the cap the demo model would think to the end (no text block). About 7 s on 2 cores.
  const capped = await anthropic.messages.create({ model, max_tokens: 1026, temperature: 0, messages: question, thinking: { type: 'enabled', budget_tokens: 1024 } });
  const kinds = capped.content.map((b) => b.type).join(',');
  const thought = (await post('/tokenize', { prompt: capped.content[0].thinking ?? '' })).count;
  check(kinds === 'thinking,text' && capped.content[1].text.length > 0 && capped.usage.output_tokens === 1026 &&
    capped.stop_reason === 'max_tokens', `messages budget_tokens 1024: the thinking ends, then text (${kinds}, ${capped.usage.output_tokens} tokens)`);
  check(thought > 900 && thought < 1100, `messages budget_tokens 1024: the thinking is about 1,023 tokens long (${thought} when tokenized again)`);

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

  // FIM (DeepSeek's beta path): BOS, fim_begin, the prompt's ids, fim_hole, the suffix's ids,
  // fim_end (docs/server.md: DeepSeek-V3's ids, which the derived V4.1 tokenizer keeps).
  const fimPrompt = 'def f(x):\n    ';
  const fimSuffix = '\n    return y';
  const fimBody = { model, prompt: fimPrompt, suffix: fimSuffix, max_tokens: 4, temperature: 0, ignore_eos: true, return_token_ids: true };
  const fim = await beta.completions.create(fimBody);
  const pre = (await post('/tokenize', { prompt: fimPrompt })).tokens;
  const suf = (await post('/tokenize', { prompt: fimSuffix })).tokens;
  const wantFim = [0, 128801, ...pre, 128800, ...suf, 128802];
  check(JSON.stringify(fim.choices[0].prompt_token_ids) === JSON.stringify(wantFim) && fim.usage.prompt_tokens === wantFim.length,
    `FIM: the FIM tokens around the prompt's and the suffix's ids (${JSON.stringify(fim.choices[0].prompt_token_ids)})`);
  check(await text(fim.choices[0].prompt_token_ids) === `<｜begin▁of▁sentence｜><｜fim▁begin｜>${fimPrompt}<｜fim▁hole｜>${fimSuffix}<｜fim▁end｜>`,
    'FIM: the prompt reads as DeepSeek\'s FIM layout');
  check(fim.choices[0].token_ids.length === 4 && fim.usage.completion_tokens_details.reasoning_tokens === 0,
    'FIM: a non-thinking completion of the middle');
  let fimStreamed = '';
  let fimStreamIds = null;
  for await (const chunk of await client.completions.create({ ...fimBody, stream: true })) {
    fimStreamed += chunk.choices[0]?.text ?? '';
    fimStreamIds ??= chunk.choices[0]?.prompt_token_ids ?? null;
  }
  check(JSON.stringify(fimStreamIds) === JSON.stringify(wantFim) && fimStreamed === fim.choices[0].text,
    'FIM streamed (/v1/completions): the same prompt ids and middle');
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

  // vLLM's output fields on the demo model's greedy output (completions; chat parses the same).
  const g0 = { model, prompt: 'The weather today', max_tokens: 6, temperature: 0, ignore_eos: true, return_token_ids: true };
  const base0 = await client.completions.create(g0);
  const ids0 = base0.choices[0].token_ids;
  const text0 = base0.choices[0].text;
  // min_tokens: the first greedy token as a stop token ends the output at once, but not before
  // min_tokens tokens (vLLM: EOS and stop_token_ids are held back until then).
  const stopped = await client.completions.create({ ...g0, stop_token_ids: [ids0[0]] });
  check(stopped.usage.completion_tokens === 1 && stopped.choices[0].finish_reason === 'stop', 'stop_token_ids: the first greedy token stops');
  const held = await client.completions.create({ ...g0, stop_token_ids: [ids0[0]], min_tokens: 4 });
  check(held.usage.completion_tokens >= 4 && !held.choices[0].token_ids.slice(0, 4).includes(ids0[0]),
    `min_tokens 4: the stop token is held back for 4 tokens (${JSON.stringify(held.choices[0].token_ids)})`);
  // bad_words: a word that greedy writes as one token is never written.
  let banned = -1;
  let word = '';
  for (const id of ids0) {
    const w = await text([id]);
    const again = (await post('/tokenize', { prompt: w })).tokens;
    // bad_words bans a word as it is and after a space (vLLM's two forms).
    if (w.trim().length > 0 && (w === w.trim() || w === ` ${w.trim()}`) && again.length === 1 && again[0] === id) {
      banned = id;
      word = w.trim();
      break;
    }
  }
  check(banned >= 0, `a greedy token that is a word of its own (${JSON.stringify(word)})`);
  const clean = await client.completions.create({ ...g0, bad_words: [word] });
  check(!clean.choices[0].token_ids.includes(banned) && clean.choices[0].text !== text0, `bad_words: ${JSON.stringify(word)} is not written`);
  // include_stop_str_in_output: a stop string from the middle of the greedy text ends the text
  // before it, or after it with the field.
  const chars = Array.from(text0);  // code points: a stop string of whole characters
  const at = Math.floor(chars.length / 2);
  const stop = chars.slice(at, at + 2).join('');
  const cut = text0.indexOf(stop);
  check(cut > 0 && Array.from(stop).length === 2, `a stop string inside the greedy text (${JSON.stringify(stop)})`);
  const without = await client.completions.create({ ...g0, stop: [stop] });
  const withStop = await client.completions.create({ ...g0, stop: [stop], include_stop_str_in_output: true });
  check(without.choices[0].text === text0.slice(0, cut) && without.choices[0].finish_reason === 'stop', 'stop string left out of the text');
  check(withStop.choices[0].text === text0.slice(0, cut + stop.length) && withStop.choices[0].finish_reason === 'stop',
    'include_stop_str_in_output: the stop string ends the text');
  // skip_special_tokens: a special token (forced by a bias) is left out of the text by default,
  // written with skip_special_tokens false; the ids are the same.
  const sp = { model, prompt: 'The weather today', max_tokens: 2, logit_bias: { 128000: 100 }, return_token_ids: true };
  const skipped = await client.completions.create(sp);
  const kept = await client.completions.create({ ...sp, skip_special_tokens: false });
  check(JSON.stringify(skipped.choices[0].token_ids) === '[128000,128000]' && skipped.choices[0].text === '' &&
    kept.choices[0].text === '<｜place▁holder▁no▁0｜>'.repeat(2), 'skip_special_tokens: default leaves special tokens out, false writes them');
  // truncate_prompt_tokens: the prompt's last N tokens are kept.
  const longPrompt = 'Tell me about the weather in Paris and Lyon.';
  const all = (await post('/tokenize', { prompt: longPrompt })).tokens;
  const trunc = await client.completions.create({ model, prompt: longPrompt, max_tokens: 1, truncate_prompt_tokens: 3, return_token_ids: true });
  check(all.length > 3 && JSON.stringify(trunc.choices[0].prompt_token_ids) === JSON.stringify(all.slice(-3)) && trunc.usage.prompt_tokens === 3,
    'truncate_prompt_tokens 3: the prompt\'s last 3 tokens');

  // Claude Code's first system block (x-anthropic-billing-header, a new value every request) is
  // left out of the prompt: counted and run as if it were not there, so the second request with
  // another value reads the first's blocks from the prefix cache.
  const system = `Run ${Date.now()}. ` + 'You are a careful assistant for weather questions in French cities. '.repeat(8);
  const billed = (v) => [{ type: 'text', text: `x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=${v};` }, { type: 'text', text: system }];
  const plainCount = await anthropic.messages.countTokens({ model, system: [{ type: 'text', text: system }], messages: question });
  const billedCount = await anthropic.messages.countTokens({ model, system: billed('1a2b3'), messages: question });
  const other = await anthropic.messages.countTokens({ model, system: [{ type: 'text', text: 'x-other-header: 1;' }, { type: 'text', text: system }], messages: question });
  check(billedCount.input_tokens === plainCount.input_tokens && other.input_tokens > plainCount.input_tokens,
    `billing-header block left out of the count (${billedCount.input_tokens} = ${plainCount.input_tokens}; another first block: ${other.input_tokens})`);
  const prompt = (u) => u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
  const first = await anthropic.messages.create({ model, max_tokens: 1, system: billed('00aa1'), messages: question });
  const second = await anthropic.messages.create({ model, max_tokens: 1, system: billed('ff0b2'), messages: question });
  check(prompt(first.usage) === plainCount.input_tokens && prompt(second.usage) === plainCount.input_tokens &&
    first.usage.cache_read_input_tokens === 0 && second.usage.cache_read_input_tokens > 0,
    `another billing value reads the first request's blocks from the cache (${JSON.stringify(second.usage)})`);

  // A documented field this server does not implement: 400 naming it.
  await expectError(client.chat.completions.create({ model, messages: question, max_tokens: 2, use_beam_search: true }),
    OpenAI.BadRequestError, 400, 'use_beam_search', (e) => check(e.error.param === 'use_beam_search', 'param use_beam_search'));
}


// The server-wide defaults of issue 36 item 8, as the serving flags set them (see MODE above).
async function defaults() {
  const list = await client.models.list();
  const m = list.data[0];
  check(list.data.length === 1 && m.id === model && JSON.stringify(m.aliases) === '["deepseek-chat"]',
    `models.list: the first name, the other as an alias (${JSON.stringify(m)})`);
  check(m.reasoning_budget === 3 && JSON.stringify(m.default_chat_template_kwargs) === '{"reasoning_effort":"max"}' &&
    JSON.stringify(m.default_sampling) === '{"max_new_tokens":6}', 'models.list shows the reasoning cap, the default kwargs and sampling');
  const alias = await client.models.retrieve('deepseek-chat');
  check(alias.id === model, 'models.retrieve of the alias: the served model');

  // The default kwargs render the prompt at effort max; the request's own kwargs win.
  const dflt = await post('/tokenize', { messages: question });
  check(effortOf(await text(dflt.tokens)) === 100, 'default kwargs: effort max (100) in the rendered prompt');
  const own = await post('/tokenize', { messages: question, chat_template_kwargs: { reasoning_effort: 'low' } });
  check(effortOf(await text(own.tokens)) === 25, 'the request\'s own chat_template_kwargs win (low, 25)');

  // A request naming the alias, with no max_tokens: answered as the first name, at the default
  // kwargs' prompt, 6 tokens (the override's max_new_tokens), at most 3 of them reasoning.
  const body = { model: 'deepseek-chat', messages: question, temperature: 0, ignore_eos: true };
  const r = await client.chat.completions.create(body);
  const n = r.usage.completion_tokens_details.reasoning_tokens;
  check(r.model === model && r.usage.prompt_tokens === dflt.count, `the alias is answered as ${model}, at the default kwargs' prompt`);
  check(r.usage.completion_tokens === 6 && r.choices[0].finish_reason === 'length', 'max_new_tokens 6 is the default max_tokens');
  check(n >= 1 && n <= 3 && r.choices[0].message.content.length > 0, `the server's reasoning cap: ${n} reasoning tokens, then content`);
  const more = await client.chat.completions.create({ ...body, thinking_token_budget: 10 });
  check(more.usage.completion_tokens_details.reasoning_tokens === n, 'a request cannot raise the server\'s cap');
  const less = await client.chat.completions.create({ ...body, thinking_token_budget: 1 });
  check(less.usage.completion_tokens_details.reasoning_tokens === 1, 'a request may lower it');
  const a = await anthropic.messages.create({ model: 'deepseek-chat', max_tokens: 8, temperature: 0, messages: question });
  check(a.model === model && a.content.map((b) => b.type).join(',') === 'thinking,text', 'messages: the alias answered, the cap ends the thinking');
  await expectError(client.chat.completions.create({ ...body, model: 'deepseek-reasoner', max_tokens: 2 }),
    OpenAI.NotFoundError, 404, 'a name not served');
}

// A tokenizer without DeepSeek's FIM tokens: FIM is a 400 naming the missing token.
async function fimMissing() {
  await expectError(beta.completions.create({ model, prompt: 'def f(', suffix: 'return 1', max_tokens: 4 }),
    OpenAI.BadRequestError, 400, 'FIM without FIM tokens', (e) => {
      check(e.error.param === 'suffix' && e.error.message.includes('<｜fim▁begin｜>'), `names the missing token (${e.error.message})`);
    });
}

// parallel_tool_calls false keeps the first of the model's two calls, in the three APIs.
async function parallel() {
  const chat = {
    model, messages: [{ role: 'user', content: 'Weather?' }], max_tokens: 200, thinking: { type: 'disabled' },
    tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }],
  };
  const cities = (calls) => calls.map((c) => JSON.parse(c.function.arguments).city).join(',');
  const both = await client.chat.completions.create(chat);
  check(cities(both.choices[0].message.tool_calls) === 'Paris,Lyon', 'chat: two calls by default');
  const one = await client.chat.completions.create({ ...chat, parallel_tool_calls: false });
  check(cities(one.choices[0].message.tool_calls) === 'Paris' && one.choices[0].finish_reason === 'tool_calls',
    'chat parallel_tool_calls false: the first call only');
  const streamed = await client.chat.completions.stream({ ...chat, parallel_tool_calls: false }).finalChatCompletion();
  check(cities(streamed.choices[0].message.tool_calls) === 'Paris', 'chat parallel_tool_calls false, streamed: the first call only');

  const rBody = { model, input: 'Weather?', reasoning: { effort: 'none' }, tools: [{ type: 'function', name: 'get_weather', parameters: { type: 'object' } }] };
  const rBoth = await client.responses.create(rBody);
  const rOne = await client.responses.create({ ...rBody, parallel_tool_calls: false });
  check(rBoth.output.length === 2 && rOne.output.length === 1 && JSON.parse(rOne.output[0].arguments).city === 'Paris',
    'responses parallel_tool_calls false: the first call only');

  const mBody = { model, max_tokens: 200, messages: [{ role: 'user', content: 'Weather?' }], thinking: { type: 'disabled' }, tools: [{ name: 'get_weather', input_schema: { type: 'object' } }] };
  const uses = (msg) => msg.content.filter((b) => b.type === 'tool_use').map((b) => b.input.city).join(',');
  const mBoth = await anthropic.messages.create(mBody);
  const mOne = await anthropic.messages.create({ ...mBody, tool_choice: { type: 'auto', disable_parallel_tool_use: true } });
  const mStreamed = await anthropic.messages.stream({ ...mBody, tool_choice: { type: 'auto', disable_parallel_tool_use: true } }).finalMessage();
  check(uses(mBoth) === 'Paris,Lyon' && uses(mOne) === 'Paris' && uses(mStreamed) === 'Paris' && mOne.stop_reason === 'tool_use',
    'messages disable_parallel_tool_use: the first call only, streamed or not');
}

await runMode(mode, { basic, defaults, 'fim-missing': fimMissing, parallel });
