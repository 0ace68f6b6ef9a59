// Drives a running `dsv41 serve` with the official `@anthropic-ai/sdk` client (Messages API).
// Usage: node anthropic_client_test.mjs BASE_URL MODEL MODE
// MODE "basic": messages.create streamed and not (greedy: the stream's final message equals the
//   non-streamed one), system prompts, stop sequences, count_tokens, a tool round trip accepted,
//   typed errors (400 / 404 in Anthropic's shape).
// MODE "tools": the server runs a scripted model answering with reasoning and a DSML tool call;
//   checks the thinking, text and tool_use blocks, stop_reason tool_use, streamed and not, and the
//   round trip (the assistant turn with its thinking and tool_use blocks, then the tool_result).
// Prints one line per check; exits 1 on the first failure.
import Anthropic from '@anthropic-ai/sdk';
import { check, expectError, runMode } from './check.mjs';

const [base, model, mode] = process.argv.slice(2);
const client = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

// Anthropic's error shape: {"type": "error", "error": {"type", "message"}}.
const expectTypedError = (promise, cls, status, type, what) =>
  expectError(promise, cls, status, what, (e) => {
    check(e.error?.type === 'error' && e.error?.error?.type === type, `${what}: error type ${type} (got ${JSON.stringify(e.error)})`);
    check(typeof e.error.error.message === 'string' && e.error.error.message.length > 0, `${what}: error message`);
  });

const tools = [{
  name: 'get_weather',
  description: 'Get the weather for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];

async function basic() {
  const messages = [{ role: 'user', content: 'Say something.' }];
  // Thinking is on by default, as in DeepSeek's Anthropic format; these requests switch it off.
  const off = { type: 'disabled' };
  const m = await client.messages.create({ model, max_tokens: 8, temperature: 0, messages, thinking: off });
  check(m.type === 'message' && m.role === 'assistant' && m.id.startsWith('msg_'), 'message object');
  check(m.content.length >= 1 && m.content.every((b) => b.type === 'text'), 'text blocks (thinking disabled)');
  check(['end_turn', 'max_tokens'].includes(m.stop_reason), `stop_reason (${m.stop_reason})`);
  check(m.usage.input_tokens > 0 && m.usage.output_tokens >= 1 && m.usage.output_tokens <= 8, 'usage');
  // Anthropic's accounting: the prompt is input + cache creation + cache reads (prefix-cache hits).
  const prompt = (u) => u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
  check(m.usage.cache_creation_input_tokens === 0 && Number.isInteger(m.usage.cache_read_input_tokens), 'usage cache fields');

  const stream = client.messages.stream({ model, max_tokens: 8, temperature: 0, messages, thinking: off });
  let deltas = '';
  stream.on('text', (t) => { deltas += t; });
  const fin = await stream.finalMessage();
  const text = (x) => x.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(text(fin) === text(m), 'streamed final message equals the non-streamed one');
  check(deltas === text(m), 'text deltas add up to the answer');
  check(fin.stop_reason === m.stop_reason && fin.usage.output_tokens === m.usage.output_tokens, 'streamed stop_reason and usage');
  check(prompt(fin.usage) === prompt(m.usage), 'streamed usage splits the same prompt');

  const sys = await client.messages.create({ model, max_tokens: 4, temperature: 0, system: [{ type: 'text', text: 'Be brief.' }], messages, thinking: off });
  check(prompt(sys.usage) > prompt(m.usage), 'system blocks reach the prompt');
  const count = await client.messages.countTokens({ model, system: [{ type: 'text', text: 'Be brief.' }], messages, thinking: off });
  check(count.input_tokens === prompt(sys.usage), `count_tokens equals the prompt (${count.input_tokens})`);

  const think = await client.messages.create({
    model, max_tokens: 1025, temperature: 0, messages, thinking: { type: 'enabled', budget_tokens: 1024 },
    stop_sequences: ['\u0000never'],
  });
  check(prompt(think.usage) !== prompt(m.usage), 'thinking enabled changes the prompt');
  const byDefault = await client.messages.create({ model, max_tokens: 2, temperature: 0, messages });
  const adaptive = await client.messages.create({ model, max_tokens: 2, temperature: 0, messages, thinking: { type: 'adaptive' } });
  check(prompt(byDefault.usage) === prompt(adaptive.usage) && prompt(byDefault.usage) !== prompt(m.usage),
    'thinking on by default (DeepSeek\'s default), at the default effort');

  // A long prompt asked again: its blocks come from the prefix cache, reported as cache reads, in
  // the streamed message_start too.
  const long = [{ role: 'user', content: 'Tell me about the weather in Paris and Lyon. '.repeat(30) }];
  const cold = await client.messages.create({ model, max_tokens: 2, temperature: 0, messages: long });
  const warm = await client.messages.create({ model, max_tokens: 2, temperature: 0, messages: long });
  check(warm.usage.cache_read_input_tokens > 0 && prompt(warm.usage) === prompt(cold.usage),
    `cache reads on a repeated prompt (${JSON.stringify(warm.usage)})`);
  const again = client.messages.stream({ model, max_tokens: 2, temperature: 0, messages: long });
  let started = null;
  // A copy: the SDK accumulates the later events into the message_start object itself.
  again.on('streamEvent', (e) => { if (e.type === 'message_start') started = { ...e.message.usage }; });
  const warmStreamed = await again.finalMessage();
  check(started?.cache_read_input_tokens > 0 && prompt(started) === prompt(cold.usage),
    `message_start usage has the cache reads (${JSON.stringify(started)})`);
  const u = warmStreamed.usage;
  check(u.input_tokens === warm.usage.input_tokens && u.cache_read_input_tokens === warm.usage.cache_read_input_tokens &&
    u.cache_creation_input_tokens === 0, `streamed final usage equals the non-streamed one (${JSON.stringify(u)})`);

  // A tool round trip: the assistant's tool_use and the user's tool_result go back in.
  const history = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '{"temp": 21}' }] },
  ];
  const tr = await client.messages.create({ model, max_tokens: 5, messages: history, tools });
  check(['end_turn', 'max_tokens', 'tool_use'].includes(tr.stop_reason), 'tools round trip answers');

  await expectTypedError(client.messages.create({ model: 'nope', max_tokens: 4, messages }), Anthropic.NotFoundError, 404, 'not_found_error', 'unknown model');
  await expectTypedError(client.messages.create({ model, max_tokens: 4, messages, temperature: 5 }), Anthropic.BadRequestError, 400, 'invalid_request_error', 'temperature range');
  await expectTypedError(client.messages.create({ model, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] }),
    Anthropic.BadRequestError, 400, 'invalid_request_error', 'image blocks refused');
  await expectTypedError(client.messages.create({ model, max_tokens: 1000000000, messages }), Anthropic.BadRequestError, 400, 'invalid_request_error', 'max_tokens beyond the context');
}

async function toolsMode() {
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const req = { model, max_tokens: 1100, messages, tools, thinking: { type: 'enabled', budget_tokens: 1024 } };
  const m = await client.messages.create(req);
  const kinds = m.content.map((b) => b.type).join(',');
  check(kinds === 'thinking,text,tool_use', `content blocks thinking, text, tool_use (got ${kinds})`);
  check(m.content[0].thinking === 'I should call the tool.', 'thinking block');
  check(m.content[1].text === 'Let me check.', 'text block');
  const call = m.content[2];
  check(call.name === 'get_weather' && call.input.city === 'Paris' && call.input.days === 3, `tool_use input ${JSON.stringify(call.input)}`);
  check(m.stop_reason === 'tool_use', 'stop_reason tool_use');

  const events = [];
  const stream = client.messages.stream(req);
  stream.on('streamEvent', (e) => events.push(e.type === 'content_block_delta' ? `delta:${e.delta.type}` : e.type));
  const fin = await stream.finalMessage();
  // Equal but for the tool_use ids, which are unique per response.
  const noIds = (content) => JSON.stringify(content.map(({ id, ...rest }) => rest));
  check(noIds(fin.content) === noIds(m.content), `streamed blocks equal the non-streamed ones (${noIds(fin.content)} vs ${noIds(m.content)})`);
  check(fin.content[2].id.startsWith('toolu_') && fin.content[2].id !== call.id, 'tool_use ids unique per response');
  check(fin.stop_reason === 'tool_use', 'streamed stop_reason tool_use');
  check(events[0] === 'message_start' && events[events.length - 1] === 'message_stop', 'event sequence starts and ends right');
  for (const t of ['delta:thinking_delta', 'delta:text_delta', 'delta:input_json_delta', 'content_block_stop', 'message_delta'])
    check(events.includes(t), `stream has ${t}`);

  // The round trip: the whole assistant turn (thinking + text + tool_use) and the result go back.
  const back = [...messages, { role: 'assistant', content: m.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: [{ type: 'text', text: '21 C' }] }] }];
  const r2 = await client.messages.create({ ...req, max_tokens: 200, thinking: { type: 'adaptive' }, messages: back });
  check(r2.content.some((b) => b.type === 'tool_use'), 'round trip accepted');

  // stop_sequences end the answer with stop_reason stop_sequence; max_tokens with max_tokens.
  const st = await client.messages.create({ ...req, stop_sequences: ['check'] });
  check(st.stop_reason === 'stop_sequence' && st.stop_sequence === 'check', `stop_sequence (${st.stop_reason}, ${st.stop_sequence})`);
  check(st.content.map((b) => b.type).join(',') === 'thinking,text' && st.content[1].text === 'Let me ', 'text cut before the stop sequence');
  const short = await client.messages.create({ ...req, max_tokens: 3, thinking: { type: 'adaptive' } });
  check(short.stop_reason === 'max_tokens' && short.usage.output_tokens === 3, 'stop_reason max_tokens');

  // tool_choice none: the DSML block stays plain text.
  const none = await client.messages.create({ ...req, tool_choice: { type: 'none' } });
  check(none.content.every((b) => b.type !== 'tool_use') && none.stop_reason === 'end_turn', 'tool_choice none');
  // A forced tool that is not declared is refused (forced calls themselves: anthropic_forced_tools_test.mjs).
  await expectTypedError(client.messages.create({ ...req, tool_choice: { type: 'tool', name: 'nope' } }), Anthropic.BadRequestError, 400, 'invalid_request_error', 'tool_choice of an undeclared tool refused');
}

await runMode(mode, { basic, tools: toolsMode });
