// Drives a running `dsv41 serve` with the official `openai` npm client. Usage:
//   node openai_client_test.mjs BASE_URL MODEL MODE
// MODE "basic": completions (echo too) and chat, streamed and not, logprobs, usage, a tools round trip (tool
//   declarations + an assistant tool call + a tool result in, a valid answer out), models.retrieve,
//   token-id prompts, typed errors.
// MODE "tools": the server runs a scripted model that answers with reasoning and a DSML tool call;
//   checks reasoning_content and tool_calls, streamed and not.
// MODE "engine-failure": the server's model fails every step; a non-streamed request must raise
//   the SDK's InternalServerError (a real 500 with OpenAI's error JSON, not a 200 whose body the
//   client cannot parse), a streamed one an APIError from its in-band error event.
// Prints one line per check; exits 1 on the first failure.
import OpenAI from 'openai';
import { check, expectError, runMode } from './check.mjs';

const [base, model, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

// OpenAI errors name the parameter at fault.
const expectParamError = (promise, cls, status, param, what) =>
  expectError(promise, cls, status, what, (e) => {
    check(e.error && typeof e.error.message === 'string' && e.error.message.length > 0, `${what}: error.message`);
    if (param !== undefined) check(e.error.param === param, `${what}: error.param ${param} (got ${e.error.param})`);
  });

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

async function basic() {
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === model, 'models.list names the served model');
  const one = await client.models.retrieve(model);
  check(one.id === model && one.object === 'model', 'models.retrieve returns the served model');
  await expectParamError(client.models.retrieve('nope'), OpenAI.NotFoundError, 404, undefined, 'models.retrieve of an unknown model');

  const c = await client.completions.create({ model, prompt: 'hello world', max_tokens: 6, logprobs: 2, seed: 7 });
  check(c.object === 'text_completion' && typeof c.choices[0].text === 'string', 'completion text');
  check(c.usage.completion_tokens >= 1 && c.usage.completion_tokens <= 6, 'completion usage');
  check(['stop', 'length'].includes(c.choices[0].finish_reason), 'completion finish_reason');
  const lp = c.choices[0].logprobs;
  check(lp.tokens.length === c.usage.completion_tokens && lp.token_logprobs.every((x) => x <= 0), 'completion logprobs');
  check(lp.top_logprobs.every((m) => Object.keys(m).length >= 1), 'completion top_logprobs');
  const again = await client.completions.create({ model, prompt: 'hello world', max_tokens: 6, logprobs: 2, seed: 7 });
  check(again.choices[0].text === c.choices[0].text, 'seeded completion reproduces');

  let streamed = '';
  let finish = null;
  const cs = await client.completions.create({ model, prompt: 'hello world', max_tokens: 6, seed: 7, logprobs: 2, stream: true });
  for await (const chunk of cs) {
    streamed += chunk.choices[0]?.text ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  check(streamed === c.choices[0].text, 'streamed completion equals the non-streamed one');
  check(finish === c.choices[0].finish_reason, 'streamed completion finish_reason');

  // echo (vLLM's rules): the prompt before the completion, the logprobs covering the prompt first
  // (the first prompt token's null); max_tokens 0 scores the prompt alone (lm-eval's requests).
  // (greedy: an echo computes the prompt on the full stack, decoder replay aside)
  const g = await client.completions.create({ model, prompt: 'hello world', max_tokens: 6, logprobs: 2, temperature: 0 });
  const e = await client.completions.create({ model, prompt: 'hello world', max_tokens: 6, logprobs: 2, temperature: 0, echo: true });
  check(e.choices[0].text === 'hello world' + g.choices[0].text, 'echo: the prompt, then the completion');
  const elp = e.choices[0].logprobs;
  const np = e.usage.prompt_tokens;
  check(elp.tokens.length === np + e.usage.completion_tokens &&
        ['token_logprobs', 'top_logprobs', 'text_offset'].every((k) => elp[k].length === elp.tokens.length),
        'echo: logprobs arrays aligned over prompt and completion');
  check(elp.token_logprobs[0] === null && elp.top_logprobs[0] === null &&
        elp.token_logprobs.slice(1).every((x) => typeof x === 'number' && x <= 0),
        'echo: only the first prompt token has no logprob');
  check(elp.tokens.slice(0, np).join('') === 'hello world' && elp.text_offset[np] === 'hello world'.length,
        'echo: prompt tokens and offsets index the returned text');
  check(elp.tokens.slice(np).join('') === g.choices[0].logprobs.tokens.join(''), 'echo: the completion part as without echo');
  const score = await client.completions.create({ model, prompt: 'hello world', max_tokens: 0, logprobs: 1, echo: true });
  const slp = score.choices[0].logprobs;
  check(score.choices[0].text === 'hello world' && score.usage.completion_tokens === 0 &&
        slp.tokens.length === np && score.choices[0].finish_reason === 'length',
        'echo with max_tokens 0 scores the prompt alone');
  check(slp.token_logprobs.every((x, i) => (x === null) === (i === 0) &&
        (i === 0 || Math.abs(x - elp.token_logprobs[i]) < 1e-4)),
        'echo with max_tokens 0: the same prompt logprobs');
  let echoed = '';
  const es = await client.completions.create({ model, prompt: 'hello world', max_tokens: 6, temperature: 0, echo: true, stream: true });
  for await (const chunk of es) echoed += chunk.choices[0]?.text ?? '';
  check(echoed === e.choices[0].text, 'echo streamed: the prompt first, then the completion');

  const messages = [{ role: 'user', content: 'Say something.' }];
  const chat = await client.chat.completions.create({
    model, messages, max_tokens: 8, seed: 3, logprobs: true, top_logprobs: 2,
    chat_template_kwargs: { thinking: false },
  });
  check(chat.object === 'chat.completion' && chat.choices[0].message.role === 'assistant', 'chat message');
  check(typeof chat.choices[0].message.content === 'string', 'chat content');
  check(chat.choices[0].logprobs.content.length === chat.usage.completion_tokens, 'chat logprobs per token');
  check(chat.choices[0].logprobs.content.every((t) => t.top_logprobs.length === 2), 'chat top_logprobs');

  let content = '';
  let usage = null;
  let roleSeen = false;
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 8, seed: 3, stream: true, stream_options: { include_usage: true },
    chat_template_kwargs: { thinking: false },
  });
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const d = chunk.choices[0]?.delta;
    if (d?.role === 'assistant') roleSeen = true;
    content += d?.content ?? '';
  }
  check(roleSeen, 'chat stream starts with the assistant role');
  check(content === chat.choices[0].message.content, 'streamed chat equals the non-streamed one');
  check(usage && usage.completion_tokens === chat.usage.completion_tokens, 'stream include_usage');

  // n: parallel samples, choice i the request with seed + i, streamed under their indices.
  const three = await client.chat.completions.create({
    model, messages, max_tokens: 8, seed: 3, n: 3, temperature: 1, chat_template_kwargs: { thinking: false },
  });
  check(three.choices.length === 3 && three.choices.every((c, i) => c.index === i), 'n=3 gives choices 0..2');
  check(three.choices[0].message.content === chat.choices[0].message.content, 'n=3 choice 0 is the seed-3 answer');
  const seed4 = await client.chat.completions.create({
    model, messages, max_tokens: 8, seed: 4, temperature: 1, chat_template_kwargs: { thinking: false },
  });
  check(three.choices[1].message.content === seed4.choices[0].message.content, 'n=3 choice 1 is the seed-4 answer');
  const parts = ['', '', ''];
  const nstream = await client.chat.completions.create({
    model, messages, max_tokens: 8, seed: 3, n: 3, temperature: 1, stream: true,
    chat_template_kwargs: { thinking: false },
  });
  for await (const chunk of nstream) for (const c of chunk.choices) parts[c.index] += c.delta?.content ?? '';
  check(parts.every((p, i) => p === three.choices[i].message.content), 'streamed n=3 equals the non-streamed choices');

  // Thinking mode: the answer is split into reasoning_content and content.
  const think = await client.chat.completions.create({ model, messages, max_tokens: 5, seed: 1 });
  check(typeof think.choices[0].message.reasoning_content === 'string', 'thinking mode returns reasoning_content');

  // Tools round trip: declarations, a previous tool call and its result go in; an answer comes out.
  const history = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
  ];
  const tr = await client.chat.completions.create({ model, messages: history, tools, max_tokens: 5 });
  check(['stop', 'length', 'tool_calls'].includes(tr.choices[0].finish_reason), 'tools round trip answers');

  await expectParamError(client.chat.completions.create({ model: 'nope', messages }), OpenAI.NotFoundError, 404, 'model', 'unknown model');
  await expectParamError(client.chat.completions.create({ model, messages, temperature: 5 }), OpenAI.BadRequestError, 400, 'temperature', 'temperature range');
  await expectParamError(client.completions.create({ model, prompt: [999999999] }), OpenAI.BadRequestError, 400, 'prompt', 'token id outside the vocabulary');
  await expectParamError(client.completions.create({ model, prompt: 'hi', max_tokens: 1000000000 }), OpenAI.BadRequestError, 400, 'max_tokens', 'max_tokens beyond the context');

  // Token-id prompts (JSON numbers the server's parser stores as unsigned) and stop_token_ids.
  for (const prompt of [[0], [5, 6, 7], [[5, 6, 7]]]) {
    const t = await client.completions.create({ model, prompt, max_tokens: 2, stop_token_ids: [5] });
    check(t.usage.prompt_tokens === (Array.isArray(prompt[0]) ? prompt[0] : prompt).length, `token-id prompt ${JSON.stringify(prompt)}`);
  }
}

async function toolsMode() {
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 200 });
  const m = r.choices[0].message;
  check(m.reasoning_content === 'I should call the tool.', `reasoning_content (got ${JSON.stringify(m.reasoning_content)})`);
  check(m.content === 'Let me check.', `content (got ${JSON.stringify(m.content)})`);
  check(m.tool_calls?.length === 1 && m.tool_calls[0].function.name === 'get_weather', 'one tool call');
  check(JSON.stringify(JSON.parse(m.tool_calls[0].function.arguments)) === '{"city":"Paris","days":3}', 'typed arguments');
  check(r.choices[0].finish_reason === 'tool_calls', 'finish_reason tool_calls');

  const s = await client.chat.completions.create({ model, messages, tools, max_tokens: 200, stream: true });
  let reasoning = '';
  let content = '';
  // A call streams as OpenAI's do: its first delta has the index, id, type and name, the later
  // ones pieces of its arguments under the same index.
  const calls = [];
  let finish = null;
  for await (const chunk of s) {
    const d = chunk.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? '';
    content += d.content ?? '';
    for (const tc of d.tool_calls ?? []) {
      if (tc.id !== undefined) calls.push({ index: tc.index, id: tc.id, type: tc.type, name: tc.function?.name, args: '' });
      const open = calls[calls.length - 1];
      check(open !== undefined && tc.index === open.index, `streamed tool-call delta of the open call (index ${tc.index})`);
      open.args += tc.function?.arguments ?? '';
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  check(reasoning === 'I should call the tool.' && content === 'Let me check.', 'streamed reasoning/content split');
  check(calls.length === 1 && calls[0].name === 'get_weather' && calls[0].index === 0 && calls[0].type === 'function', 'streamed tool call');
  check(calls[0].args === m.tool_calls[0].function.arguments, `streamed arguments equal the non-streamed ones (got ${JSON.stringify(calls[0].args)})`);
  check(finish === 'tool_calls', 'streamed finish_reason tool_calls');

  // The call goes back in as history with its result: the round trip the encoder must accept.
  const back = [...messages, m, { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '21 C' }];
  const r2 = await client.chat.completions.create({ model, messages: back, tools, max_tokens: 200 });
  check(r2.choices[0].message.tool_calls?.length === 1, 'tool history accepted');

  // tool_choice "none": the DSML block stays plain content.
  const none = await client.chat.completions.create({ model, messages, tools, tool_choice: 'none', max_tokens: 200 });
  check(!none.choices[0].message.tool_calls && none.choices[0].message.content.includes('invoke'), 'tool_choice none');
}

async function engineFailure() {
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  await expectError(client.chat.completions.create({ model, messages, max_tokens: 50 }),
    OpenAI.InternalServerError, 500, 'engine failure, not streamed', (e) => {
      check(e.error?.type === 'internal_error' && e.error.message.startsWith('engine error:'),
        `engine failure: error JSON (got ${JSON.stringify(e.error)})`);
    });
  let raised = null;
  try {
    const s = await client.chat.completions.create({ model, messages, max_tokens: 50, stream: true });
    for await (const chunk of s) void chunk;
  } catch (e) {
    raised = e;
  }
  check(raised instanceof OpenAI.APIError && raised.error?.type === 'internal_error',
    `engine failure, streamed: APIError (got ${raised?.constructor?.name}: ${raised?.message})`);
}

await runMode(mode, { basic, tools: toolsMode, 'engine-failure': engineFailure });
