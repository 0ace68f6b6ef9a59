// Drives a running `dsv41 serve` with the official `openai` client's Responses API. Usage:
//   node openai_responses_test.mjs BASE_URL MODEL MODE
// MODE "basic": responses.create streamed (responses.stream) and not, greedy, output_text, usage,
//   instructions, reasoning effort none, a function-call round trip accepted, refused store /
//   previous_response_id, typed errors.
// MODE "tools": the server runs a scripted model answering with reasoning and a DSML tool call;
//   checks the reasoning, message and function_call items, streamed and not, and the round trip
//   (reasoning, message and function_call items back in, with the function_call_output).
// Prints one line per check; exits 1 on the first failure.
import OpenAI from 'openai';
import { check, expectError, runMode } from './check.mjs';

const [base, model, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

const expectParamError = (promise, cls, status, param, what) =>
  expectError(promise, cls, status, what, (e) => {
    if (param !== undefined) check(e.error?.param === param, `${what}: param ${param} (got ${e.error?.param})`);
  });

const tools = [{
  type: 'function', name: 'get_weather', description: 'Get the weather for a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];

async function basic() {
  const req = { model, input: 'Say something.', max_output_tokens: 8, temperature: 0, reasoning: { effort: 'none' } };
  const r = await client.responses.create(req);
  check(r.object === 'response' && r.id.startsWith('resp_'), 'response object');
  check(['completed', 'incomplete'].includes(r.status), `status (${r.status})`);
  check(r.output.every((o) => o.type === 'message'), 'effort none: message items only');
  check(typeof r.output_text === 'string' && r.output_text.length > 0, 'output_text');
  check(r.usage.input_tokens > 0 && r.usage.output_tokens >= 1 && r.usage.output_tokens <= 8, 'usage');
  check(typeof r.usage.input_tokens_details?.cached_tokens === 'number' && r.usage.output_tokens_details?.reasoning_tokens === 0, 'usage details (no reasoning)');

  const stream = client.responses.stream(req);
  let deltas = '';
  stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const fin = await stream.finalResponse();
  check(fin.output_text === r.output_text, 'streamed final response equals the non-streamed one');
  check(deltas === r.output_text, 'output_text deltas add up to the answer');
  check(fin.status === r.status && fin.usage.output_tokens === r.usage.output_tokens, 'streamed status and usage');

  const withIns = await client.responses.create({ ...req, instructions: 'Be brief.' });
  check(withIns.usage.input_tokens > r.usage.input_tokens && withIns.instructions === 'Be brief.', 'instructions reach the prompt');
  const thinking = await client.responses.create({ ...req, reasoning: { effort: 'low' } });
  check(thinking.output[0]?.type === 'reasoning', 'effort low: a reasoning item first');

  const history = [
    { role: 'user', content: 'Weather in Paris?' },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city": "Paris"}' },
    { type: 'function_call_output', call_id: 'call_1', output: '{"temp": 21}' },
  ];
  const tr = await client.responses.create({ model, input: history, tools, max_output_tokens: 5 });
  check(['completed', 'incomplete'].includes(tr.status), 'function call round trip answers');

  await expectParamError(client.responses.create({ ...req, store: true }), OpenAI.BadRequestError, 400, 'store', 'store refused');
  await expectParamError(client.responses.create({ ...req, previous_response_id: r.id }), OpenAI.BadRequestError, 400, 'previous_response_id', 'previous_response_id refused');
  await expectParamError(client.responses.create({ ...req, model: 'nope' }), OpenAI.NotFoundError, 404, 'model', 'unknown model');
  await expectParamError(client.responses.create({ ...req, temperature: 5 }), OpenAI.BadRequestError, 400, 'temperature', 'temperature range');
  await expectParamError(client.responses.create({ ...req, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://x/y.png' }] }] }),
    OpenAI.BadRequestError, 400, 'input[0].content[0].image_url', 'an http image URL refused');
  await expectParamError(client.responses.create({ ...req, input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'f' }] }] }),
    OpenAI.BadRequestError, 400, 'input[0].content[0].type', 'files refused');
}

async function toolsMode() {
  const req = { model, input: 'Weather in Paris?', tools, max_output_tokens: 200, reasoning: { effort: 'medium' } };
  const r = await client.responses.create(req);
  const kinds = r.output.map((o) => o.type).join(',');
  check(kinds === 'reasoning,message,function_call', `items reasoning, message, function_call (got ${kinds})`);
  check(r.output[0].content[0].type === 'reasoning_text' && r.output[0].content[0].text === 'I should call the tool.', 'reasoning item');
  check(r.output_text === 'Let me check.', 'output_text');
  const call = r.output[2];
  check(call.name === 'get_weather' && JSON.parse(call.arguments).city === 'Paris' && call.call_id.startsWith('call_'), `function_call ${call.arguments}`);
  check(r.status === 'completed', 'status completed');
  const rt = r.usage.output_tokens_details.reasoning_tokens;
  check(rt > 0 && rt < r.usage.output_tokens, `reasoning_tokens ${rt} of ${r.usage.output_tokens}`);

  const seen = new Set();
  const stream = client.responses.stream(req);
  stream.on('event', (e) => seen.add(e.type));
  const fin = await stream.finalResponse();
  // Equal but for the ids (unique per response) and the fields the client's stream helper adds.
  const skip = new Set(['id', 'call_id', 'parsed', 'parsed_arguments']);
  const noIds = (out) => JSON.stringify(out, (k, v) => (skip.has(k) ? undefined : v));
  check(noIds(fin.output) === noIds(r.output), `streamed items equal the non-streamed ones (${noIds(fin.output)} vs ${noIds(r.output)})`);
  check(fin.output_text === 'Let me check.', 'streamed output_text');
  for (const t of ['response.created', 'response.output_item.added', 'response.reasoning_text.delta', 'response.output_text.delta',
    'response.function_call_arguments.delta', 'response.function_call_arguments.done', 'response.output_item.done', 'response.completed'])
    check(seen.has(t), `stream has ${t}`);

  // The round trip: the output items go back in as input, with the call's output.
  const back = [{ role: 'user', content: 'Weather in Paris?' }, ...r.output, { type: 'function_call_output', call_id: call.call_id, output: '21 C' }];
  const r2 = await client.responses.create({ ...req, input: back });
  check(r2.output.some((o) => o.type === 'function_call'), 'round trip accepted');

  const none = await client.responses.create({ ...req, tool_choice: 'none' });
  check(none.output.every((o) => o.type !== 'function_call') && none.output_text.includes('invoke'), 'tool_choice none');
  const short = await client.responses.create({ ...req, max_output_tokens: 3 });
  check(short.status === 'incomplete' && short.incomplete_details?.reason === 'max_output_tokens', 'incomplete at max_output_tokens');
  check(short.output.length === 1 && short.output[0].status === 'incomplete', 'the cut item is incomplete');
  // A forced function that is not declared is refused (forced calls themselves: forced_tools_test.mjs).
  await expectParamError(client.responses.create({ ...req, tool_choice: { type: 'function', name: 'nope' } }), OpenAI.BadRequestError, 400, 'tool_choice', 'tool_choice of an undeclared function refused');
}

await runMode(mode, { basic, tools: toolsMode });
