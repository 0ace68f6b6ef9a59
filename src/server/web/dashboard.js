// The dashboard (GET /dashboard): reads the server's own /metrics (Prometheus text) every second
// and plots the last three minutes: generation and prompt throughput (rates of the engine's token
// counters), running and waiting requests, KV blocks used of the pool, the prefix cache's hit rate
// over each interval, the mean time to first token of the requests that got one in the interval,
// and foreign KV reads (the isolation gate: it must stay 0). Each chart's canvas carries
// data-samples (points drawn), data-last (the newest values) and data-seen (each line's largest
// value so far) for the browser tests.
'use strict';

const POLL_MS = 1000;
const KEEP = 180;  // points: three minutes at one a second

const $ = (id) => document.getElementById(id);

// name -> value for the unlabelled samples of a Prometheus text exposition.
function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$/.exec(line);
    if (m && !m[2]) out.set(m[1], Number(m[3]));
  }
  return out;
}

const charts = [
  { id: 'throughput', title: 'Throughput', unit: 'tok/s',
    lines: [{ label: 'generated', color: '#2f6fde' }, { label: 'prompt', color: '#a0a8b8' }] },
  { id: 'requests', title: 'Requests', unit: '',
    lines: [{ label: 'running', color: '#1e8449' }, { label: 'waiting', color: '#d68910' }] },
  { id: 'kv', title: 'KV cache blocks', unit: 'blocks',
    lines: [{ label: 'used', color: '#8e44ad' }, { label: 'pool', color: '#c8ccd6' }] },
  { id: 'hit', title: 'Prefix-cache hit rate', unit: '%',
    lines: [{ label: 'prompt tokens found cached', color: '#16a085' }] },
  { id: 'ttft', title: 'Time to first token', unit: 's',
    lines: [{ label: 'mean of the interval', color: '#c0392b' }] },
  { id: 'foreign', title: 'Foreign KV reads (must stay 0)', unit: '',
    lines: [{ label: 'total', color: '#c0392b' }] },
];

const tiles = [
  { id: 'in_flight', label: 'in flight', metric: 'dsv41_in_flight_requests' },
  { id: 'generated', label: 'tokens generated', metric: 'dsv41_engine_generated_tokens_total' },
  { id: 'steps', label: 'engine steps', metric: 'dsv41_engine_steps_total' },
  { id: 'preemptions', label: 'preemptions', metric: 'dsv41_num_preemptions_total' },
  { id: 'kv_pct', label: 'KV pool used', metric: null },
  { id: 'foreign_reads', label: 'foreign reads', metric: 'dsv41_kv_foreign_reads_total' },
];

function build() {
  for (const t of tiles) {
    const d = document.createElement('div');
    d.className = 'tile';
    d.id = `tile-${t.id}`;
    d.innerHTML = '<div class="label"></div><div class="value">–</div>';
    d.querySelector('.label').textContent = t.label;
    $('tiles').appendChild(d);
  }
  for (const c of charts) {
    const box = document.createElement('section');
    box.className = 'chart';
    const h = document.createElement('h3');
    h.textContent = c.title;
    const legend = document.createElement('div');
    legend.className = 'legend';
    const canvas = document.createElement('canvas');
    canvas.id = `chart-${c.id}`;
    canvas.dataset.samples = '0';
    box.append(h, legend, canvas);
    $('charts').appendChild(box);
    c.canvas = canvas;
    c.legend = legend;
    for (const l of c.lines) l.values = [];
  }
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function fmt(v, unit) {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  const s = Number.isInteger(v) ? String(v)
    : Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2);
  return unit ? `${s} ${unit}` : s;
}

function draw(c) {
  const canvas = c.canvas;
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  const g = canvas.getContext('2d');
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  const left = 44, right = 6, top = 6, bottom = 18;
  const pw = w - left - right, ph = h - top - bottom;
  let max = 0;
  for (const l of c.lines) for (const v of l.values) if (v !== null && v > max) max = v;
  const ymax = c.unit === '%' ? 100 : niceMax(max);
  g.font = '11px system-ui, sans-serif';
  g.fillStyle = '#687086';
  g.strokeStyle = '#eceef3';
  g.lineWidth = 1;
  for (let k = 0; k <= 4; ++k) {
    const y = top + ph - (ph * k) / 4;
    g.beginPath();
    g.moveTo(left, y);
    g.lineTo(left + pw, y);
    g.stroke();
    g.fillText(fmt((ymax * k) / 4, ''), 2, y + 4);
  }
  g.fillText(`-${Math.round((KEEP * POLL_MS) / 60000)} min`, left, h - 4);
  g.fillText('now', left + pw - 20, h - 4);
  for (const l of c.lines) {
    g.strokeStyle = l.color;
    g.fillStyle = l.color;
    g.lineWidth = 2;
    g.beginPath();
    const at = (i) => left + (pw * (i + KEEP - l.values.length)) / (KEEP - 1);
    const y = (v) => top + ph - (ph * Math.min(v, ymax)) / ymax;
    l.values.forEach((v, i) => {
      if (v === null) return;
      const joined = i > 0 && l.values[i - 1] !== null;
      if (joined) g.lineTo(at(i), y(v));
      else g.moveTo(at(i), y(v));
      // A point between gaps (one interval's time to first token, say) is a dot: a line of one
      // point would draw nothing.
      if (!joined && (i + 1 >= l.values.length || l.values[i + 1] === null))
        g.fillRect(at(i) - 2, y(v) - 2, 4, 4);
    });
    g.stroke();
  }
  const last = c.lines.map((l) => l.values.length ? l.values[l.values.length - 1] : null);
  c.legend.textContent = c.lines.map((l, i) => `${l.label}: ${fmt(last[i], c.unit)}`).join('   ');
  canvas.dataset.samples = String(c.lines[0].values.length);
  canvas.dataset.last = JSON.stringify(last);
  // The largest value each line has shown since the page opened (null: none yet).
  canvas.dataset.seen = JSON.stringify(c.lines.map((l) => (l.seen === undefined ? null : l.seen)));
}

function push(id, values) {
  const c = charts.find((x) => x.id === id);
  c.lines.forEach((l, i) => {
    const v = values[i] === undefined || Number.isNaN(values[i]) ? null : values[i];
    l.values.push(v);
    if (v !== null && (l.seen === undefined || v > l.seen)) l.seen = v;
    if (l.values.length > KEEP) l.values.shift();
  });
}

function setTile(id, text, tone) {
  const d = $(`tile-${id}`);
  d.querySelector('.value').textContent = text;
  d.classList.toggle('good', tone === 'good');
  d.classList.toggle('bad', tone === 'bad');
}

let prev = null;  // { t, m } of the previous scrape

function update(m, t) {
  const get = (name) => (m.has(name) ? m.get(name) : null);
  const rate = (name) => {
    if (!prev || get(name) === null || !prev.m.has(name)) return null;
    const dt = (t - prev.t) / 1000;
    return dt > 0 ? Math.max(0, (get(name) - prev.m.get(name)) / dt) : null;
  };
  const delta = (name) => (prev && get(name) !== null && prev.m.has(name) ?
    get(name) - prev.m.get(name) : null);
  push('throughput', [rate('dsv41_engine_generated_tokens_total'),
                      rate('dsv41_engine_prompt_tokens_total')]);
  push('requests', [get('dsv41_running_requests'), get('dsv41_queue_length')]);
  push('kv', [get('dsv41_kv_blocks_used'), get('dsv41_kv_blocks_total')]);
  const queried = delta('dsv41_prefix_cache_query_tokens_total');
  const hit = delta('dsv41_prefix_cache_hit_tokens_total');
  push('hit', [queried > 0 ? (100 * hit) / queried : null]);
  const n = delta('dsv41_time_to_first_token_seconds_count');
  const sum = delta('dsv41_time_to_first_token_seconds_sum');
  push('ttft', [n > 0 ? sum / n : null]);
  push('foreign', [get('dsv41_kv_foreign_reads_total')]);
  for (const tile of tiles) {
    if (!tile.metric) continue;
    const v = get(tile.metric);
    const tone = tile.id === 'foreign_reads' ? (v === 0 ? 'good' : 'bad') : null;
    setTile(tile.id, v === null ? '–' : String(v), tone);
  }
  const used = get('dsv41_kv_blocks_used'), total = get('dsv41_kv_blocks_total');
  setTile('kv_pct', total > 0 ? `${((100 * used) / total).toFixed(1)} %` : 'no bounded pool');
  for (const c of charts) draw(c);
  prev = { t, m };
}

async function poll() {
  const t = performance.now();
  try {
    const res = await apiFetch('/metrics', { cache: 'no-store' });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    update(parseMetrics(await res.text()), t);
    const s = $('status');
    s.textContent = `Updated ${new Date().toLocaleTimeString()} · every ${POLL_MS / 1000} s`;
    s.classList.remove('bad');
  } catch (err) {
    const s = $('status');
    s.textContent = `Cannot read /metrics: ${err.message} (retrying)`;
    s.classList.add('bad');
  }
  setTimeout(poll, POLL_MS);
}

async function init() {
  build();
  try {
    const j = await (await apiFetch('/v1/models')).json();
    $('model').textContent = j.data[0].id;
  } catch (err) {
    $('model').textContent = '';
  }
  window.addEventListener('resize', () => charts.forEach(draw));
  poll();
}

init();
