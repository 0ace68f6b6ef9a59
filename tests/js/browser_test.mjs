// The chat page and the dashboard of `dsv41 serve` in a real browser: Debian's chromium, headless,
// driven through playwright-core. The chat page runs against a server whose model answers every
// chat request with the scripted reasoning + text + get_weather call of
// tests/server/server_harness.h, one sequence at a time with a waiting queue of one (so the test
// can fill it for a 429); the dashboard against a server on the tiny model's fast path, with a
// bounded KV pool and the prefix cache.
// Last, a third server, scripted and started with the API key `sk-page`: the page asks for the key
// once (a refused key again), keeps it for the tab, and the dashboard reads /metrics with it.
// Usage: node browser_test.mjs CHAT_BASE_URL FAST_BASE_URL OUT_DIR HOLD_FILE KEYED_BASE_URL
// (screenshots go to OUT_DIR; while HOLD_FILE exists the scripted model stops after the third
// token of an answer: the chat server's ScriptBackend waits for it to go)
import { chromium } from 'playwright-core';
import { mkdirSync, unlinkSync, writeFileSync } from 'node:fs';
import { check } from './check.mjs';

const [base, fastBase, outDir, holdFile, keyedBase] = process.argv.slice(2);
// A failed check exits at once: the hold must not outlive the test (the model would wait on it).
process.on('exit', () => { try { unlinkSync(holdFile); } catch {} });
const holdModel = () => writeFileSync(holdFile, '');
const releaseModel = () => unlinkSync(holdFile);
mkdirSync(outDir, { recursive: true });
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';

const browser = await chromium.launch({ executablePath, headless: true,
                                         args: ['--no-sandbox', '--disable-gpu'] });
const failures = [];
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  // With the model held after its third token: the page shows the reasoning so far, the answer has
  // not ended and its text is empty. That the page renders an answer before it ends is the proof
  // of streaming that does not depend on the machine's speed.
  const halfStreamed = async (what) => {
    await page.waitForFunction(() => {
      const r = document.querySelector('.msg.assistant:last-child .reasoning-text');
      return r && r.textContent.length > 0;  // the first reasoning has arrived (folded: not visible)
    });
    check(await page.evaluate(() => {
      const m = document.querySelector('.msg.assistant:last-child');
      return !m.dataset.finish && m.querySelector('.content').textContent === '';
    }), `${what}: the page shows the answer as it streams (its reasoning, before the answer ends)`);
  };
  page.on('pageerror', (e) => failures.push(`page error: ${e.message}`));
  // Console errors fail the test, but for the two refusals it asks for (the browser logs each).
  const expected = /Failed to load resource: the server responded with a status of (400|429)/;
  page.on('console', (m) => {
    if (m.type() === 'error' && !expected.test(m.text())) failures.push(`console: ${m.text()}`);
  });
  const outside = [];
  const sent = [];  // the bodies the page posted to /v1/chat/completions
  page.on('request', (r) => {
    if (!r.url().startsWith(base) && !r.url().startsWith(fastBase)) outside.push(r.url());
    if (r.url().endsWith('/v1/chat/completions')) sent.push(r.postDataJSON());
  });

  // --- The chat page: a streamed answer with its reasoning folded and a tool call.
  await page.goto(`${base}/`);
  await page.waitForFunction(() => document.getElementById('model').textContent === 'scripted');
  await page.fill('#tools', JSON.stringify([{ type: 'function', function: {
    name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }]));
  // Count the updates of the reasoning and the answer as they stream in.
  await page.evaluate(() => {
    window.updates = { reasoning: [], content: [] };  // when each update came (ms)
    new MutationObserver((records) => {
      for (const r of records) {
        const t = r.target.nodeType === 1 ? r.target : r.target.parentElement;
        if (t && t.classList.contains('reasoning-text')) window.updates.reasoning.push(performance.now());
        if (t && t.classList.contains('content')) window.updates.content.push(performance.now());
      }
    }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
  });
  // Settings reach the request as set.
  await page.fill('#temperature', '0.7');
  await page.fill('#top_p', '0.9');
  await page.fill('#seed', '42');
  await page.selectOption('#effort', 'high');
  await page.fill('#stop_sequences', 'STOP-A\nSTOP-B');
  await page.fill('#prompt', 'What is the weather in Paris?');
  holdModel();
  await page.click('#send');
  await halfStreamed('a request with tools');
  releaseModel();
  const answer = page.locator('.msg.assistant').last();
  await answer.locator('.tool-call').waitFor();
  await page.waitForFunction(() => document.querySelector('.msg.assistant:last-child').dataset.finish);
  const details = answer.locator('details.reasoning');
  check(await details.isVisible(), 'the reasoning block is shown');
  check(!(await details.evaluate((d) => d.open)), 'the reasoning is folded');
  check((await answer.locator('.reasoning-text').textContent()) === 'I should call the tool.',
        'the reasoning text is the model\'s');
  check((await answer.locator('summary').textContent()).includes('23 characters'), 'the fold says its length');
  check((await answer.locator('.content').textContent()).trim() === 'Let me check.', 'the answer text');
  check((await answer.locator('.tool-name').textContent()) === 'get_weather', 'the tool call is shown by name');
  const call = await answer.locator('.tool-call').textContent();
  check(call.includes('"city"') && call.includes('Paris'), `the tool call's arguments (${call})`);
  check(await answer.evaluate((m) => m.dataset.finish) === 'tool_calls', 'finish reason tool_calls');
  const stats = await answer.locator('.stats').textContent();
  check(/\d+ tokens/.test(stats) && /tok\/s/.test(stats) && /first token/.test(stats),
        `tokens and tok/s under the message (${stats})`);
  // Streamed: several updates each, not one burst of a buffered body (that the page shows an
  // answer before it ends is checked under the hold, at Stop below: timing the updates here
  // depended on the machine's load).
  const updates = await page.evaluate(() => window.updates);
  check(updates.reasoning.length > 3 && updates.content.length > 1,
        `the text arrived streamed (${updates.reasoning.length} reasoning updates, ` +
        `${updates.content.length} answer updates)`);
  const first = sent[sent.length - 1];
  check(first.stream === true && first.stream_options.include_usage === true, 'the page streams with usage');
  check(first.temperature === 0.7 && first.top_p === 0.9 && first.seed === 42 && first.max_tokens === 512,
        `temperature, top-p, seed and max tokens reach the request (${JSON.stringify(first)})`);
  check(first.chat_template_kwargs.thinking === true && first.reasoning_effort === 'high',
        'thinking on with the effort chosen');
  check(JSON.stringify(first.stop) === '["STOP-A","STOP-B"]', 'stop sequences, one a line');
  check(first.tools.length === 1 && first.tools[0].function.name === 'get_weather', 'the tools declared');
  await page.screenshot({ path: `${outDir}/chat.png` });
  await details.locator('summary').click();
  check(await details.evaluate((d) => d.open), 'the reasoning unfolds on a click');
  await page.screenshot({ path: `${outDir}/chat-reasoning-open.png` });

  // --- A 400 shows the parameter the server named, and the turn can be sent again.
  await page.click('#new-chat');
  check(await page.locator('#messages > *').count() === 0, 'a new conversation starts empty');
  await page.fill('#max_tokens', '99999999');
  await page.fill('#prompt', 'Hello');
  await page.click('#send');
  const error = page.locator('.error').last();
  await error.waitFor();
  const errorText = await error.textContent();
  check(errorText.includes('HTTP 400') && errorText.includes('(parameter max_tokens)'),
        `a 400 names its parameter (${errorText})`);
  check(await page.locator('.msg.assistant').count() === 0, 'no empty answer is left for a refused turn');
  await page.fill('#max_tokens', '512');

  // --- Stop: the stream ends at once, the server cancels the request. The model is held after
  // its third token, so the page shows a half-streamed answer until the hold goes.
  await page.click('#new-chat');
  await page.fill('#tools', '');
  await page.fill('#prompt', 'Tell me a long story');
  holdModel();
  await page.click('#send');
  await halfStreamed('a request to stop');
  await page.click('#stop');
  await page.waitForFunction(() => document.querySelector('.msg.assistant').dataset.finish === 'stopped');
  check((await page.locator('.msg.assistant .stats').textContent()).includes('stopped'), 'the message says stopped');
  check(!(await page.locator('.msg.assistant .content').textContent()).includes('Let me check.'),
        'the answer stopped before its end');
  releaseModel();  // the model goes on and finds its request cancelled
  check(await page.locator('#send').isEnabled(), 'the page takes a new message after a stop');
  const stoppedStats = await page.locator('.msg.assistant .stats').textContent();
  check(/first token/.test(stoppedStats) && /\d+ pieces? received/.test(stoppedStats),
        `a stopped answer keeps its figures (${stoppedStats})`);
  const partial = await page.locator('.msg.assistant .reasoning-text').textContent();
  // The next turn carries the conversation: the question, the stopped answer, the new question;
  // with thinking off there is no reasoning block.
  await page.uncheck('#thinking');
  await page.fill('#prompt', 'Go on');
  await page.click('#send');
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length === 2 &&
                                   document.querySelectorAll('.msg.assistant')[1].dataset.finish);
  const second = sent[sent.length - 1];
  check(second.messages.length === 3 && second.messages[0].content === 'Tell me a long story' &&
        second.messages[1].role === 'assistant' && second.messages[2].content === 'Go on',
        `a second turn carries the first (${JSON.stringify(second.messages)})`);
  check(second.chat_template_kwargs.thinking === false && second.reasoning_effort === undefined,
        'thinking off reaches the request');
  check(await page.locator('.msg.assistant').nth(1).locator('details.reasoning').isHidden(),
        'no reasoning block with thinking off');
  check(partial.length > 0, 'the stopped answer had reasoning');
  // --- A JSON schema: the request carries it as response_format, the answer follows it.
  await page.fill('#json_schema', JSON.stringify({ type: 'object', properties: { ok: { type: 'boolean' } },
                                                   required: ['ok'], additionalProperties: false }));
  await page.fill('#prompt', 'As JSON, please');
  await page.click('#send');
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length === 3 &&
                                   document.querySelectorAll('.msg.assistant')[2].dataset.finish);
  const third = sent[sent.length - 1];
  check(third.response_format && third.response_format.type === 'json_schema' &&
        third.response_format.json_schema.schema.required[0] === 'ok',
        `the schema reaches the request (${JSON.stringify(third.response_format)})`);
  const jsonAnswer = (await page.locator('.msg.assistant').nth(2).locator('.content').textContent()).trim();
  let parsedAnswer = null;
  try { parsedAnswer = JSON.parse(jsonAnswer); } catch (e) { /* checked below */ }
  check(parsedAnswer !== null && typeof parsedAnswer.ok === 'boolean' &&
        Object.keys(parsedAnswer).length === 1, `the answer follows the schema (${jsonAnswer})`);
  await page.fill('#json_schema', '{not json');
  await page.fill('#prompt', 'Again');
  await page.click('#send');
  await page.waitForFunction(() => [...document.querySelectorAll('.error')].some(
    (e) => e.textContent.includes('JSON schema: not valid JSON')));
  await page.fill('#json_schema', '');
  // --- An image attached with the Image button: a thumbnail waits above the composer; the message
  // carries it as an image_url part (a data: URL) and shows it; this scripted model has no vision
  // tower, so the server's 400 is shown and the image waits again to be sent or removed.
  const imageFile = new URL('../fuzz/corpus/image/rgb.png', import.meta.url).pathname;
  await page.setInputFiles('#image_file', imageFile);
  await page.waitForSelector('#attachments .thumb img');
  check(await page.locator('#attachments .thumb').count() === 1, 'an attached image waits as a thumbnail');
  const errorsBeforeImage = await page.locator('.error').count();
  const sentBeforeImage = sent.length;
  await page.fill('#prompt', 'What is in the picture?');
  await page.click('#send');
  await page.waitForFunction((n) => document.querySelectorAll('.error').length > n, errorsBeforeImage);
  const withImage = sent[sentBeforeImage];
  const lastUser = withImage.messages[withImage.messages.length - 1].content;
  check(Array.isArray(lastUser) && lastUser[0].text === 'What is in the picture?' &&
        lastUser[1].type === 'image_url' && lastUser[1].image_url.url.startsWith('data:image/png;base64,'),
        'the message carries the image as an image_url part');
  check(await page.locator('.msg.user img.image').count() === 1, 'the conversation shows the image');
  const imageError = await page.locator('.error').last().textContent();
  check(imageError.includes('HTTP 400') && imageError.includes('takes no images'),
        `the server's refusal is shown (${imageError})`);
  check(await page.locator('#attachments .thumb').count() === 1, 'the refused image waits again');
  await page.click('#attachments .thumb button');
  check(await page.locator('#attachments .thumb').count() === 0, 'the image can be removed');
  await page.check('#thinking');
  let running = -1;
  for (let i = 0; i < 300 && running !== 0; ++i) {  // up to 30 s on a starved machine
    const m = await (await fetch(`${base}/metrics`)).text();
    running = Number(/^dsv41_running_requests (\S+)$/m.exec(m)[1]);
    if (running !== 0) await new Promise((r) => setTimeout(r, 100));
  }
  check(running === 0, 'the server cancelled the stopped request');

  // --- 429: with the one sequence running and the one queue place taken, the page's request is
  // refused, and the page says so with Retry-After.
  const hold = new AbortController();
  const long = { model: 'scripted', prompt: 'x', max_tokens: 1000, ignore_eos: true, stream: true };
  const holders = [];
  const gauge = async (name) => {
    const m = await (await fetch(`${base}/metrics`)).text();
    return Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(m)[1]);
  };
  // The first holder must be running (not just queued) before the second takes the queue's place.
  for (const [k, name] of [[0, 'dsv41_running_requests'], [1, 'dsv41_queue_length']]) {
    holders.push(fetch(`${base}/v1/completions`, { method: 'POST', body: JSON.stringify(long),
      headers: { 'Content-Type': 'application/json' }, signal: hold.signal }).catch(() => {}));
    let v = 0;
    for (let i = 0; i < 600 && v < 1; ++i) {
      v = await gauge(name);
      if (v < 1) await new Promise((r) => setTimeout(r, 50));
    }
    check(v === 1, `holder ${k + 1} is ${k === 0 ? 'running' : 'waiting'}`);
  }
  // (an earlier step left an error on the page: wait for a new one, not any)
  const errorsBefore = await page.locator('.error').count();
  await page.fill('#prompt', 'Are you busy?');
  await page.click('#send');
  await page.waitForFunction((n) => document.querySelectorAll('.error').length > n, errorsBefore);
  const busyText = await page.locator('.error').last().textContent();
  check(busyText.includes('HTTP 429') && busyText.includes('retry after 1 s'),
        `a 429 is shown with its Retry-After (${busyText})`);
  hold.abort();
  await Promise.all(holders);

  // --- The dashboard, on the fast-path server: plots that update from /metrics while requests run.
  await page.goto(`${fastBase}/dashboard`);
  await page.waitForFunction(() => Number(document.getElementById('chart-throughput').dataset.samples) >= 2);
  const before = Number(await page.locator('#chart-requests').getAttribute('data-samples'));
  // Work for the plots: two requests sharing a 300-token prompt (the second finds it cached),
  // generating while the dashboard watches.
  const prompt = Array.from({ length: 300 }, (_, i) => (i * 37 + 11) % 500);
  const work = async (n) => {
    for (let k = 0; k < n; ++k) {
      const r = await fetch(`${fastBase}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ model: 'scripted', prompt, max_tokens: 24, ignore_eos: true }) });
      check(r.status === 200, `a request for the dashboard to watch (${r.status})`);
      await r.json();
      await new Promise((res) => setTimeout(res, 1200));  // a scrape between them
    }
  };
  await work(3);
  // Longer requests, one after another, until the requests plot has seen one running, then
  // dropped. One request of 600 tokens once finished in 0.6 s, between two of the dashboard's
  // scrapes (every second), and the plot never saw it: the requests now follow each other until
  // the plots have seen them, however fast the model runs.
  const longRun = new AbortController();
  let busy = true;
  const longDone = (async () => {
    while (busy) {
      const r = await fetch(`${fastBase}/v1/completions`, { method: 'POST', signal: longRun.signal,
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ model: 'scripted', prompt, max_tokens: 1200, ignore_eos: true, stream: true }) });
      const reader = r.body.getReader();
      while (!(await reader.read()).done) {}
    }
  })().catch(() => {});
  await page.waitForFunction(() => JSON.parse(document.getElementById('chart-requests').dataset.seen)[0] >= 1 &&
                                   JSON.parse(document.getElementById('chart-kv').dataset.seen)[0] > 0,
                             null, { timeout: 20000 });
  busy = false;
  longRun.abort();
  await longDone;
  const seen = async (id) => JSON.parse(await page.locator(`#chart-${id}`).getAttribute('data-seen'));
  await page.waitForFunction(() => JSON.parse(document.getElementById('chart-ttft').dataset.seen)[0] !== null);
  check((await seen('throughput'))[0] > 0 && (await seen('throughput'))[1] > 0,
        `the throughput plot showed generated and prompt tok/s (${JSON.stringify(await seen('throughput'))})`);
  check((await seen('requests'))[0] >= 1, 'the requests plot showed a running request');
  const kv = await seen('kv');
  check(kv[0] > 0 && kv[1] > kv[0], `the KV plot showed blocks used of the pool (${JSON.stringify(kv)})`);
  check((await seen('hit'))[0] > 0, `the hit-rate plot showed cached prompt tokens (${JSON.stringify(await seen('hit'))} %)`);
  check((await seen('ttft'))[0] > 0, `the time-to-first-token plot showed a mean (${JSON.stringify(await seen('ttft'))} s)`);
  check(Number(await page.locator('#chart-requests').getAttribute('data-samples')) >= before + 3,
        'the plots take a new point every second');
  check((await page.locator('#tile-foreign_reads .value').textContent()) === '0', 'foreign reads shown, 0');
  check(/%$/.test(await page.locator('#tile-kv_pct .value').textContent()), 'the pool tile gives a share');
  for (const id of ['throughput', 'requests', 'kv', 'hit', 'ttft', 'foreign'])
    check(await page.locator(`#chart-${id}`).isVisible(), `the ${id} plot is on the page`);
  check(!(await page.locator('#status').getAttribute('class')).includes('bad'), 'the dashboard reads /metrics');
  await page.screenshot({ path: `${outDir}/dashboard.png` });
  check(outside.length === 0, `nothing is fetched from anywhere but the server (${outside.join(', ')})`);

  // --- A server with an API key: asked once (again after a refused key), kept for the tab.
  const kp = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  kp.on('pageerror', (e) => failures.push(`keyed page error: ${e.message}`));
  kp.on('console', (m) => {
    if (m.type() === 'error' && !/status of 401/.test(m.text())) failures.push(`keyed console: ${m.text()}`);
  });
  const auths = [];  // [path, Authorization] of every API call the keyed pages made
  kp.on('request', (r) => {
    const path = new URL(r.url()).pathname;
    if (!path.startsWith('/web/') && path !== '/' && path !== '/dashboard') auths.push([path, r.headers().authorization]);
  });
  await kp.goto(`${keyedBase}/`);
  await kp.waitForSelector('#api-key-dialog[open]');
  check((await kp.locator('#api-key-message').textContent()).includes('needs an API key'), 'the page asks for the key on a 401');
  await kp.fill('#api-key', 'sk-wrong');
  await kp.click('#api-key-ok');
  await kp.waitForFunction(() => document.getElementById('api-key-message')?.textContent.includes('refused'));
  check(true, 'a refused key is asked for again');
  await kp.fill('#api-key', 'sk-page');
  await kp.click('#api-key-ok');
  await kp.waitForFunction(() => document.getElementById('model').textContent === 'scripted');
  check(await kp.locator('#api-key-dialog').count() === 0, 'the right key closes the dialog and the page loads the model');
  await kp.fill('#prompt', 'hello');
  await kp.click('#send');
  await kp.waitForFunction(() => document.querySelector('.msg.assistant:last-child')?.dataset.finish);
  const posted = auths.filter(([p]) => p === '/v1/chat/completions');
  check(posted.length === 1 && posted[0][1] === 'Bearer sk-page', `the chat request carries the key (${JSON.stringify(posted)})`);
  await kp.goto(`${keyedBase}/dashboard`);
  await kp.waitForFunction(() => document.getElementById('status').textContent.startsWith('Updated'));
  check(await kp.locator('#api-key-dialog').count() === 0, 'the dashboard uses the kept key: no second question');
  check(auths.filter(([p]) => p === '/metrics').every(([, a]) => a === 'Bearer sk-page'), 'the dashboard sends the key to /metrics');
  await kp.screenshot({ path: `${outDir}/keyed-dashboard.png` });
} finally {
  await browser.close();
}
for (const f of failures) check(false, f);
console.log('all checks passed');
