// The chat page (GET /): a conversation kept in the page, each turn streamed from
// /v1/chat/completions (stream_options.include_usage for the token count). Reasoning arrives as
// delta.reasoning_content and is shown folded above the answer; tool calls as delta.tool_calls.
// Everything is put on the page as text (textContent), never as HTML. Images (attached with the
// Image button, pasted or dropped) go with the next message as image_url parts (data: URLs).
'use strict';

const $ = (id) => document.getElementById(id);
// images: data: URLs attached to the next message (file input, paste or drop).
const state = { model: null, history: [], controller: null, images: [] };

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function scrollDown() {
  const m = $('messages');
  m.scrollTop = m.scrollHeight;
}

// An error from the server or the network, as the page shows it: status, the parameter named,
// the message, and Retry-After for a full queue.
function showError(text) {
  $('messages').appendChild(el('div', 'error', text));
  scrollDown();
}

async function errorText(res) {
  let text = `HTTP ${res.status}`;
  try {
    const j = await res.json();
    const e = j.error || {};
    if (e.param) text += ` (parameter ${e.param})`;
    text += `: ${e.message || JSON.stringify(j)}`;
  } catch (err) {
    text += ': the answer was not JSON';
  }
  const retry = res.headers.get('Retry-After');
  if (res.status === 429 && retry) text += ` — retry after ${retry} s`;
  return text;
}

async function loadModel() {
  try {
    const res = await apiFetch('/v1/models');
    if (res.status === 503 && res.headers.get('Retry-After')) {  // the server is loading the model
      $('model').textContent = 'loading the model…';
      setTimeout(loadModel, 2000);
      return;
    }
    if (!res.ok) throw new Error(await errorText(res));
    const j = await res.json();
    state.model = j.data[0].id;
    $('model').textContent = state.model;
  } catch (err) {
    showError(`Could not read /v1/models: ${err.message}`);
  }
}

function numberField(body, id, integer) {
  const v = $(id).value.trim();
  if (v === '') return;
  body[id] = integer ? parseInt(v, 10) : parseFloat(v);
}

// The request body for the conversation so far; throws with a message on a bad tools or schema
// field.
function requestBody() {
  const messages = [];
  const system = $('system').value.trim();
  if (system) messages.push({ role: 'system', content: system });
  messages.push(...state.history);
  const body = { model: state.model, messages, stream: true,
                 stream_options: { include_usage: true } };
  const thinking = $('thinking').checked;
  body.chat_template_kwargs = { thinking };
  if (thinking && $('effort').value) body.reasoning_effort = $('effort').value;
  numberField(body, 'temperature', false);
  numberField(body, 'top_p', false);
  numberField(body, 'max_tokens', true);
  numberField(body, 'seed', true);
  const stops = $('stop_sequences').value.split('\n').filter((s) => s.length > 0);
  if (stops.length) body.stop = stops;
  // Structured output: the answer (after the reasoning, in thinking mode) follows the schema.
  const schema = $('json_schema').value.trim();
  if (schema) {
    let parsed;
    try {
      parsed = JSON.parse(schema);
    } catch (err) {
      throw new Error(`JSON schema: not valid JSON (${err.message})`);
    }
    body.response_format = { type: 'json_schema',
                             json_schema: { name: 'page', schema: parsed, strict: true } };
  }
  const tools = $('tools').value.trim();
  if (tools) {
    try {
      body.tools = JSON.parse(tools);
    } catch (err) {
      throw new Error(`Tools: not valid JSON (${err.message})`);
    }
  }
  return body;
}

function addUserMessage(text, images) {
  const m = el('div', 'msg user');
  m.appendChild(el('div', 'role', 'you'));
  for (const url of images) {
    const img = el('img', 'image');
    img.src = url;  // a data: URL the page made from the user's own file
    img.alt = 'attached image';
    m.appendChild(img);
  }
  m.appendChild(el('div', 'content', text));
  $('messages').appendChild(m);
  scrollDown();
}

// The images waiting for the next message, each with a button that takes it off.
function renderAttachments() {
  const box = $('attachments');
  box.textContent = '';
  state.images.forEach((url, i) => {
    const t = el('div', 'thumb');
    const img = el('img');
    img.src = url;
    img.alt = `image ${i + 1}`;
    const x = el('button', 'secondary', '×');
    x.type = 'button';
    x.title = 'Remove';
    x.addEventListener('click', () => {
      state.images.splice(i, 1);
      renderAttachments();
    });
    t.append(img, x);
    box.appendChild(t);
  });
}

// Files (input, paste or drop) -> data: URLs attached to the next message; other files are
// refused on the page (the server reads PNG, JPEG, WebP and GIF).
function attachFiles(files) {
  for (const f of files) {
    if (!/^image\/(png|jpeg|webp|gif)$/.test(f.type)) {
      showError(`${f.name || 'the file'}: not an image the server reads (PNG, JPEG, WebP or GIF)`);
      continue;
    }
    const reader = new FileReader();
    reader.onload = () => {
      state.images.push(reader.result);
      renderAttachments();
    };
    reader.readAsDataURL(f);
  }
}

// The assistant's message as it streams: a folded reasoning block (shown once reasoning arrives),
// the answer, tool calls, and a line of figures at the end.
function assistantView() {
  const m = el('div', 'msg assistant');
  m.appendChild(el('div', 'role', 'assistant'));
  const details = el('details', 'reasoning');
  const summary = el('summary', null, 'Reasoning');
  const reasoning = el('div', 'reasoning-text');
  details.append(summary, reasoning);
  details.hidden = true;
  const content = el('div', 'content');
  const tools = el('div', 'tools');
  const stats = el('div', 'stats');
  m.append(details, content, tools, stats);
  $('messages').appendChild(m);
  return { m, details, summary, reasoning, content, tools, stats };
}

function renderToolCalls(view, calls) {
  view.tools.textContent = '';
  for (const c of calls) {
    const box = el('div', 'tool-call');
    box.appendChild(el('span', 'tool-name', c.name));
    box.appendChild(document.createTextNode(`(${c.arguments})`));
    view.tools.appendChild(box);
  }
}

// What one answer produced so far; filled in place, so that a Stop or an error keeps what came.
function newAnswer() {
  return { reasoning: '', content: '', calls: [], finish: null, usage: null, tFirst: null, chunks: 0 };
}

// Reads the SSE stream of one answer into `out`, updating `view`. Throws when the server reports
// an error in the stream or the stream ends before its [DONE].
async function readStream(res, view, out) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error('The stream ended before the answer did (the connection closed).');
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, '\n');
    let cut;
    while ((cut = buffer.indexOf('\n\n')) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of frame.split('\n')) {
        if (!line.startsWith('data:')) continue;  // keep-alive comments
        const data = line.slice(5).replace(/^ /, '');
        if (data === '[DONE]') return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(`The server stopped the answer: ${chunk.error.message}`);
        if (chunk.usage) out.usage = chunk.usage;
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        const d = choice.delta || {};
        if (d.reasoning_content || d.content || d.tool_calls) {
          if (out.tFirst === null) out.tFirst = performance.now();
          out.chunks++;
        }
        if (d.reasoning_content) {
          out.reasoning += d.reasoning_content;
          view.details.hidden = false;
          view.reasoning.textContent = out.reasoning;
          view.summary.textContent = `Reasoning (${out.reasoning.length} characters)`;
        }
        if (d.content) {
          out.content += d.content;
          view.content.textContent = out.content;
        }
        for (const tc of d.tool_calls || []) {
          const call = out.calls[tc.index] || (out.calls[tc.index] = { id: '', name: '', arguments: '' });
          if (tc.id) call.id = tc.id;
          if (tc.function && tc.function.name) call.name += tc.function.name;
          if (tc.function && tc.function.arguments) call.arguments += tc.function.arguments;
          renderToolCalls(view, out.calls);
        }
        if (choice.finish_reason) out.finish = choice.finish_reason;
        scrollDown();
      }
    }
  }
}

// The figures under an answer. A stopped or failed answer has no usage chunk: its pieces are
// counted as they arrived instead (a piece is a token or a few).
function statsLine(out, t0, ending) {
  const now = performance.now();
  const parts = [];
  if (out.tFirst !== null) parts.push(`first token ${((out.tFirst - t0) / 1000).toFixed(2)} s`);
  const secs = (now - (out.tFirst !== null ? out.tFirst : t0)) / 1000;
  if (out.usage) {
    const n = out.usage.completion_tokens;
    parts.push(`${n} tokens`);
    if (n > 1 && secs > 0) parts.push(`${((n - 1) / secs).toFixed(1)} tok/s`);
    parts.push(`prompt ${out.usage.prompt_tokens} tokens`);
  } else if (out.chunks > 0) {
    parts.push(`${out.chunks} ${out.chunks === 1 ? 'piece' : 'pieces'} received`);
    if (out.chunks > 1 && secs > 0) parts.push(`${((out.chunks - 1) / secs).toFixed(1)} pieces/s`);
  }
  if (ending) parts.push(ending);
  else if (out.finish) parts.push(`finish: ${out.finish}`);
  return parts.join(' · ');
}

function setBusy(busy) {
  $('send').disabled = busy;
  $('stop').disabled = !busy;
}

async function send(text) {
  // The conversation this turn belongs to: New conversation replaces state.history, and a turn of
  // the old one that ends afterwards is not carried into the new one.
  const history = state.history;
  const images = state.images;
  // With images, the content is parts: the text, then each image (as the page shows them).
  const content = images.length
    ? [{ type: 'text', text }, ...images.map((url) => ({ type: 'image_url', image_url: { url } }))]
    : text;
  let body;
  try {
    history.push({ role: 'user', content });
    body = requestBody();
  } catch (err) {
    history.pop();
    showError(err.message);
    return;
  }
  state.images = [];
  renderAttachments();
  addUserMessage(text, images);
  const view = assistantView();
  const t0 = performance.now();
  state.controller = new AbortController();
  setBusy(true);
  const out = newAnswer();
  let ending = null;  // 'stopped' or 'failed'
  try {
    const res = await apiFetch('/v1/chat/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body), signal: state.controller.signal });
    if (!res.ok) {
      view.m.remove();
      if (state.history === history) {  // not a turn: it can be sent again, images included
        history.pop();
        if (images.length && !state.images.length) {
          state.images = images;
          renderAttachments();
        }
      }
      showError(await errorText(res));
      return;
    }
    await readStream(res, view, out);
  } catch (err) {
    if (err.name === 'AbortError') {
      ending = 'stopped';
    } else {
      ending = 'failed';
      showError(err.message);
    }
  } finally {
    state.controller = null;
    setBusy(false);
  }
  view.m.dataset.finish = ending || out.finish || '';
  view.stats.textContent = statsLine(out, t0, ending);
  if (state.history !== history) return;
  if (ending === 'failed') {
    history.pop();  // a failed turn is left out of the conversation (what came stays on screen)
    return;
  }
  // A finished or stopped answer is the assistant's turn, with what it had written so far.
  const turn = { role: 'assistant', content: out.content };
  const calls = out.calls.filter((c) => c);
  if (calls.length)
    turn.tool_calls = calls.map((c) => ({ id: c.id, type: 'function',
                                          function: { name: c.name, arguments: c.arguments } }));
  history.push(turn);
  scrollDown();
}

function init() {
  loadModel();
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const text = $('prompt').value;
    if (!text.trim() || state.controller || !state.model) return;
    $('prompt').value = '';
    send(text);
  });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {  // not while an IME composes
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('stop').addEventListener('click', () => {
    if (state.controller) state.controller.abort();
  });
  $('new-chat').addEventListener('click', () => {
    if (state.controller) state.controller.abort();
    state.history = [];
    state.images = [];
    renderAttachments();
    $('messages').textContent = '';
    $('prompt').focus();
  });
  $('image_file').addEventListener('change', (e) => {
    attachFiles(e.target.files);
    e.target.value = '';
  });
  $('prompt').addEventListener('paste', (e) => {
    const files = [...(e.clipboardData ? e.clipboardData.files : [])];
    if (files.length) {
      e.preventDefault();
      attachFiles(files);
    }
  });
  const area = document.querySelector('.conversation');
  area.addEventListener('dragover', (e) => {
    e.preventDefault();
    area.classList.add('dropping');
  });
  area.addEventListener('dragleave', () => area.classList.remove('dropping'));
  area.addEventListener('drop', (e) => {
    e.preventDefault();
    area.classList.remove('dropping');
    attachFiles(e.dataTransfer ? e.dataTransfer.files : []);
  });
}

init();
