// The chat page and the dashboard of `dsv41 serve` in a real browser: Debian's chromium, headless,
// driven through playwright-core. Run against a server whose model answers every chat request with
// the scripted reasoning + text + get_weather call of tests/server/server_harness.h, one sequence
// at a time with a waiting queue of one (so the test can fill it for a 429).
// Usage: node browser_test.mjs BASE_URL OUT_DIR   (screenshots go to OUT_DIR)
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { check } from './check.mjs';

const [base, outDir] = process.argv.slice(2);
mkdirSync(outDir, { recursive: true });
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';

const browser = await chromium.launch({ executablePath, headless: true,
                                         args: ['--no-sandbox', '--disable-gpu'] });
const failures = [];
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  page.on('pageerror', (e) => failures.push(`page error: ${e.message}`));
  // Console errors fail the test, but for the two refusals it asks for (the browser logs each).
  const expected = /Failed to load resource: the server responded with a status of (400|429)/;
  page.on('console', (m) => {
    if (m.type() === 'error' && !expected.test(m.text())) failures.push(`console: ${m.text()}`);
  });
  const outside = [];
  page.on('request', (r) => { if (!r.url().startsWith(base)) outside.push(r.url()); });

  // --- The chat page: a streamed answer with its reasoning folded and a tool call.
  await page.goto(`${base}/`);
  await page.waitForFunction(() => document.getElementById('model').textContent === 'scripted');
  await page.fill('#tools', JSON.stringify([{ type: 'function', function: {
    name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }]));
  // Count the updates of the reasoning and the answer as they stream in.
  await page.evaluate(() => {
    window.updates = { reasoning: 0, content: 0 };
    new MutationObserver((records) => {
      for (const r of records) {
        const t = r.target.nodeType === 1 ? r.target : r.target.parentElement;
        if (t && t.classList.contains('reasoning-text')) window.updates.reasoning++;
        if (t && t.classList.contains('content')) window.updates.content++;
      }
    }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
  });
  await page.fill('#prompt', 'What is the weather in Paris?');
  await page.click('#send');
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
  const updates = await page.evaluate(() => window.updates);
  check(updates.reasoning > 3 && updates.content > 1,
        `the text arrived streamed (${updates.reasoning} reasoning, ${updates.content} answer updates)`);
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
  check(errorText.includes('HTTP 400') && errorText.includes('max_tokens'),
        `a 400 names its parameter (${errorText})`);
  check(await page.locator('.msg.assistant').count() === 0, 'no empty answer is left for a refused turn');
  await page.fill('#max_tokens', '512');

  // --- Stop: the stream ends at once, the server cancels the request.
  await page.click('#new-chat');
  await page.fill('#tools', '');
  await page.fill('#prompt', 'Tell me a long story');
  await page.click('#send');
  await page.waitForFunction(() => {
    const r = document.querySelector('.msg.assistant .reasoning-text');
    return r && r.textContent.length > 0;  // the first reasoning has arrived (folded: not visible)
  });
  await page.click('#stop');
  await page.waitForFunction(() => document.querySelector('.msg.assistant').dataset.finish === 'stopped');
  check((await page.locator('.msg.assistant .stats').textContent()).includes('stopped'), 'the message says stopped');
  check(!(await page.locator('.msg.assistant .content').textContent()).includes('Let me check.'),
        'the answer stopped before its end');
  check(await page.locator('#send').isEnabled(), 'the page takes a new message after a stop');
  let running = -1;
  for (let i = 0; i < 50 && running !== 0; ++i) {
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
    for (let i = 0; i < 100 && v < 1; ++i) {
      v = await gauge(name);
      if (v < 1) await new Promise((r) => setTimeout(r, 50));
    }
    check(v === 1, `holder ${k + 1} is ${k === 0 ? 'running' : 'waiting'}`);
  }
  await page.fill('#prompt', 'Are you busy?');
  await page.click('#send');
  await page.waitForFunction(() => document.querySelectorAll('.error').length > 0);
  const busyText = await page.locator('.error').last().textContent();
  check(busyText.includes('HTTP 429') && busyText.includes('retry after 1 s'),
        `a 429 is shown with its Retry-After (${busyText})`);
  hold.abort();
  await Promise.all(holders);

  // --- The dashboard: plots that update from /metrics.
  await page.goto(`${base}/dashboard`);
  await page.waitForFunction(() => Number(document.getElementById('chart-throughput').dataset.samples) >= 2);
  const before = Number(await page.locator('#chart-requests').getAttribute('data-samples'));
  // Work for the plots: a chat answer generated while the dashboard watches; its tokens show as a
  // throughput above 0 in a sample taken while it runs.
  const chat = { model: 'scripted', messages: [{ role: 'user', content: 'weather?' }], max_tokens: 200 };
  const generation = fetch(`${base}/v1/chat/completions`, { method: 'POST', body: JSON.stringify(chat),
    headers: { 'Content-Type': 'application/json' } }).then((r) => r.json());
  const rate = await page.waitForFunction(() => {
    const last = JSON.parse(document.getElementById('chart-throughput').dataset.last || '[]');
    return last[0] > 0 ? last[0] : null;
  }, null, { timeout: 15000 });
  check(await rate.jsonValue() > 0, `the throughput plot shows the running request (${await rate.jsonValue()} tok/s)`);
  check((await generation).choices[0].message.content.startsWith('Let me check.'), 'the watched request answered');
  await page.waitForFunction((n) => Number(document.getElementById('chart-requests').dataset.samples) >= n + 2, before);
  check(Number(await page.locator('#chart-requests').getAttribute('data-samples')) >= before + 2,
        'the plots take a new point every second');
  await page.waitForFunction(() => Number(document.querySelector('#tile-generated .value').textContent) > 0);
  check((await page.locator('#tile-foreign_reads .value').textContent()) === '0', 'foreign reads shown, 0');
  for (const id of ['throughput', 'requests', 'kv', 'hit', 'ttft', 'foreign'])
    check(await page.locator(`#chart-${id}`).isVisible(), `the ${id} plot is on the page`);
  check(!(await page.locator('#status').getAttribute('class')).includes('bad'), 'the dashboard reads /metrics');
  await page.screenshot({ path: `${outDir}/dashboard.png` });
  check(outside.length === 0, `nothing is fetched from anywhere but the server (${outside.join(', ')})`);
} finally {
  await browser.close();
}
for (const f of failures) check(false, f);
console.log('all checks passed');
