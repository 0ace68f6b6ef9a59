#!/usr/bin/env bash
# `dsv41 logits --path fast` end to end on a fresh tiny checkpoint in the official layout: the
# one-time conversion beside it (reused by the second run), 1,000 tokens, and batch invariance
# from the command line: among 8 companions in chunks of 37 the output equals the solo prefill
# byte for byte; the fast logits track the reference's (argmax agreement >= 0.97); bench decode
# (also at depth), prefill and serve print their keys.
set -euo pipefail
BIN="$1"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
"$BIN" make-tiny --out "$T/m" --preset tiny --seed 3 >/dev/null 2>&1
python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(0, 300)) for _ in range(1000)))" >"$T/toks"
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/solo.f32" --path fast 2>"$T/err1" >"$T/out1"
grep -q "converting it once" "$T/err1" || { echo "no conversion message"; cat "$T/err1"; exit 1; }
test -f "$T/m.dsv41-converted/manifest.json"
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/mixed.f32" --path fast \
  --companions 8 --companion-seed 5 --mode chunked:37 2>"$T/err2" >"$T/out2"
grep -q "using its conversion" "$T/err2" || { echo "conversion not reused"; cat "$T/err2"; exit 1; }
cmp "$T/solo.f32" "$T/mixed.f32"
grep -q '"foreign_reads":0' "$T/out2"
# the same with act-quant on (the act-quant GEMMs where the tier has them): byte-equal among
# companions
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/solo_aq.f32" --path fast \
  --act-quant on 2>/dev/null >/dev/null
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/mixed_aq.f32" --path fast \
  --act-quant on --companions 8 --companion-seed 5 --mode chunked:37 2>/dev/null >/dev/null
cmp "$T/solo_aq.f32" "$T/mixed_aq.f32"
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/ref.f32" >/dev/null 2>&1
python3 - "$T/solo.f32" "$T/ref.f32" <<'PY'
import struct, sys
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read()
assert len(a) == len(b) and len(a) % 4 == 0
n = len(a) // 4; fa = struct.unpack(f'<{n}f', a); fb = struct.unpack(f'<{n}f', b)
T = 1000; V = n // T
same = sum(max(range(V), key=lambda i: fa[t*V+i]) == max(range(V), key=lambda i: fb[t*V+i]) for t in range(T))
print("argmax agreement", same / T)
assert same / T >= 0.97
PY
# bench decode / prefill print the keys checks read (design.md §8), with counted bytes.
"$BIN" bench decode --model "$T/m.dsv41-converted" --streams 1,2 --steps 2 --probe-mb 16 \
  2>/dev/null >"$T/dec.json"
"$BIN" bench prefill --model "$T/m.dsv41-converted" --lengths 8,32 --probe-mb 16 2>/dev/null \
  >"$T/pre.json"
python3 - "$T/dec.json" "$T/pre.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); p = json.load(open(sys.argv[2]))
assert d["isa"] and len(d["points"]) == 2, d
for pt in d["points"]:
    for k in ("tok_s", "fraction_of_floor", "read_probe_gb_per_s", "bytes_per_step",
              "distinct_experts_per_step"):
        assert pt[k] > 0, (k, pt)
    assert pt["foreign_reads"] == 0
# two streams read the same dense weights once: bytes grow only by the extra experts' share
a, b = d["points"]
assert a["bytes_per_step"] <= b["bytes_per_step"] < 2 * a["bytes_per_step"], (a, b)
assert [q["tokens"] for q in p["points"]] == [8, 32] and all(q["ttft_ms"] > 0 for q in p["points"])
assert p["fp8_gemm_peak_gflop_s"] > 0
assert all(0 < q["fraction_of_gemm_peak"] and q["linear_gflop_s"] > 0 for q in p["points"])
# the roofline keys (design.md §4): counted flops, oneDNN's rate beside each point, and the
# fraction computed from them; two streams do twice one stream's multiply-adds
def roofline(q, step_s):
    assert q["flops_per_step"] > 0 and q["reference_gflop_per_s"] > 0, q
    want = max(q["bytes_per_step"] / 1e9 / q["read_probe_gb_per_s"],
               q["flops_per_step"] / 1e9 / q["reference_gflop_per_s"]) / step_s
    assert abs(q["fraction_of_roofline"] - want) <= 1e-9 + 1e-6 * want, (q, want)
for q in d["points"]:
    roofline(q, q["step_ms"] / 1e3)
assert abs(b["flops_per_step"] - 2 * a["flops_per_step"]) <= 1e-6 * b["flops_per_step"], (a, b)
for q in p["points"]:
    roofline(q, q["ttft_ms"] / 1e3)
# 4x the prompt: 4x every layer's work, the head's one logits row alike in both
f8, f32 = (q["flops_per_step"] for q in p["points"])
assert 3.9 * f8 < f32 < 4 * f8, (f8, f32)
PY
# decode at depth from the random context fill; bench serve (server + its own clients, loopback)
"$BIN" bench decode --model "$T/m.dsv41-converted" --streams 2 --context 300 --steps 2 \
  --probe-mb 16 2>/dev/null >"$T/ctx.json"
"$BIN" bench serve --model "$T/m.dsv41-converted" --concurrency 1,3 --requests 4 \
  --prompt-len 9 --max-tokens 16 --constrained ab 2>/dev/null >"$T/serve.json"
python3 - "$T/ctx.json" "$T/serve.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2]))
assert c["context_fill"] == "random" and c["points"][0]["context"] == 300, c
assert c["points"][0]["tok_s"] > 0 and c["points"][0]["foreign_reads"] == 0
assert [q["concurrency"] for q in s["points"]] == [1, 3], s
for q in s["points"]:
    assert q["failed"] == 0 and q["output_tokens"] == 4 * 16, q
    for k in ("output_tok_s", "ttft_p50_ms", "itl_p50_ms", "engine_decode_tok_s", "ratio_to_decode"):
        assert q[k] > 0, (k, q)
    # --constrained ab: the same load under a JSON schema longer than max_tokens: every request
    # answered, each to max_tokens, and the ratio of the rates reported
    k = q["constrained"]
    assert k["failed"] == 0 and k["output_tokens"] == 4 * 16, k
    assert q["constrained_tok_s_ratio"] > 0, q
assert s["kv_foreign_reads"] == 0 and s["constrained"] == "ab"
PY
# bench decode --speculative on: the three modes alternating; at a forced width (the cost model's
# choices depend on timings) every decode drafts, and oracle drafts (the control run's own greedy
# tokens) are all accepted.
"$BIN" bench decode --model "$T/m.dsv41-converted" --speculative on --streams 1,2 --spec-tokens 10 \
  --spec-repeats 2 --spec-width 2 2>/dev/null >"$T/spec.json"
python3 - "$T/spec.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["speculative"] == "dspark" and j["repeats"] == 2 and j["spec_width"] == 2, j
assert j["spec_probe"] == "shadow", j
assert [(q["prompt"], q["streams"]) for q in j["points"]] == \
    [("repetitive", 1), ("repetitive", 2), ("random", 1), ("random", 2)], j
for q in j["points"]:
    for m in ("off", "on", "oracle"):
        assert q[m]["tokens"] == 2 * 10 * q["streams"], (m, q)
        assert len(q[m]["per_stream_tok_s_runs"]) == 2 and q[m]["per_stream_tok_s"] > 0, (m, q)
        assert q[m]["unmeasured_streams"] == 0, (m, q)  # every stream's rate is in
    assert q["off"]["drafts"] == 0 and q["off"]["verify_steps"] == 0, q
    assert q["off"]["shadow_probes"] == 0 and q["on"]["shadow_probes"] == 0, q  # a fixed width
    assert q["oracle"]["accepted"] == q["oracle"]["drafts"] > 0, q
    assert q["on"]["verify_steps"] > 0, q
    assert q["speedup_per_stream"] > 0 and q["oracle_speedup_per_stream"] > 0, q
    assert q["speedup_per_stream_pooled"] > 0 and q["oracle_speedup_per_stream_pooled"] > 0, q
    # pooled: every repetition's stream tokens after the first over their seconds
    for m in ("off", "on", "oracle"):
        assert q[m]["per_stream_tok_s_pooled"] > 0, (m, q)
PY
# --spec-modes needs the control and one more mode (a usage error, exit 1, naming the option).
# --spec-paired needs exactly off,on and an even number of repetitions (the engines swap modes).
for modes in on off off,of off,on, "off,on,oracle --spec-paired" "off,on --spec-paired --spec-repeats 3"; do
  rc=0
  # shellcheck disable=SC2086  # the last two cases carry flags
  "$BIN" bench decode --model "$T/m.dsv41-converted" --speculative on --spec-modes $modes \
    2>"$T/modes.err" || rc=$?
  [ "$rc" = 1 ] || { echo "--spec-modes $modes: exit $rc, expected 1"; exit 1; }
  grep -qE -- "--spec-(modes|repeats)" "$T/modes.err" || { cat "$T/modes.err"; exit 1; }
done
# make-tiny --bigram: a checkpoint whose own drafter predicts the target (docs/dspark.md). Greedy
# text is that of plain decoding; at a forced width every draft of the real drafter is accepted
# on both prompts (the plain checkpoint above accepts next to none).
"$BIN" make-tiny --out "$T/bg" --preset tiny --seed 3 --bigram >/dev/null 2>&1
plain=$("$BIN" generate --model "$T/bg" --prompt 'hello world' --max-tokens 24 2>/dev/null)
spec=$("$BIN" generate --model "$T/bg" --prompt 'hello world' --max-tokens 24 --speculative dspark 2>/dev/null)
test -n "$plain" && test "$plain" = "$spec"
spec=$("$BIN" generate --model "$T/bg" --prompt 'hello world' --max-tokens 24 --speculative dspark \
  --spec-probe verify 2>/dev/null)
test "$plain" = "$spec"
"$BIN" bench decode --model "$T/bg.dsv41-converted" --speculative on --streams 1 --spec-tokens 24 \
  --spec-repeats 1 --spec-width 3 --spec-modes on,off 2>/dev/null >"$T/bgspec.json"
python3 - "$T/bgspec.json" "$T/spec.json" <<'PY'
import json, sys
j, plain = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert j["modes"] == "on,off", j
for q in j["points"]:
    assert "oracle" not in q and "oracle_speedup_per_stream" not in q, q  # --spec-modes on,off
    assert q["off"]["tokens"] == 24 and q["speedup_per_stream_pooled"] > 0, q
    assert q["off"]["unmeasured_streams"] == q["on"]["unmeasured_streams"] == 0, q
    assert q["on"]["drafts"] >= 12 and q["on"]["accepted"] == q["on"]["drafts"], q
acc = sum(q["on"]["accepted"] for q in plain["points"]); drafts = sum(q["on"]["drafts"] for q in plain["points"])
assert acc < 0.5 * drafts, (acc, drafts)
print("ok: the bigram checkpoint's drafter is accepted", [q["on"]["accepted"] for q in j["points"]])
PY
# --spec-paired: off and on at the same time on two engines that swap modes each repetition; the
# "on" runs draft (and are accepted at a forced width), the "off" runs never do.
"$BIN" bench decode --model "$T/bg.dsv41-converted" --speculative on --streams 1 --spec-tokens 24 \
  --spec-repeats 2 --spec-width 3 --spec-modes off,on --spec-paired 2>/dev/null >"$T/paired.json"
python3 - "$T/paired.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
import os
assert j["paired"] is True and j["threads_per_engine"] == max(1, os.cpu_count() // 2), j
for q in j["points"]:
    assert q["off"]["tokens"] == q["on"]["tokens"] == 2 * 24, q
    assert q["off"]["drafts_runs"] == [0, 0] and q["off"]["verify_steps"] == 0, q
    # every stream's rate is measured (the engine's emission times: one wake-up of the reading
    # thread collecting all 24 tokens gave a rate of 0 in CI once)
    assert q["off"]["unmeasured_streams"] == q["on"]["unmeasured_streams"] == 0, q
    # each engine ran "on" once (the engines swap) and drafted there, every draft accepted
    assert q["on"]["engine_runs"] == [0, 1] and q["off"]["engine_runs"] == [1, 0], q
    assert min(q["on"]["drafts_runs"]) >= 12 and q["on"]["accepted"] == q["on"]["drafts"], q
    assert len(q["speedup_per_stream_runs"]) == 2 and q["speedup_per_stream_pooled"] > 0, q
    # One stream, equal tokens per run: the pooled rate is the harmonic mean of the runs' rates.
    for m in ("off", "on"):
        rates = q[m]["per_stream_tok_s_runs"]
        harmonic = len(rates) / sum(1 / x for x in rates)
        assert abs(q[m]["per_stream_tok_s_pooled"] - harmonic) <= 1e-9 * harmonic, (m, q)
    ratio = q["on"]["per_stream_tok_s_pooled"] / q["off"]["per_stream_tok_s_pooled"]
    assert abs(q["speedup_per_stream_pooled"] - ratio) <= 1e-9 * ratio, q
PY
# ops' banded prefill attention (the default) gives the one-query path's bytes: prefill, and
# chunks among companions (runs of several sequences in one chunk).
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/nopa.f32" --path fast \
  --prefill-attention off 2>/dev/null >/dev/null
cmp "$T/solo.f32" "$T/nopa.f32"
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/nopa_mixed.f32" --path fast \
  --companions 8 --companion-seed 5 --mode chunked:37 --prefill-attention off 2>/dev/null >/dev/null
cmp "$T/mixed.f32" "$T/nopa_mixed.f32"
# Decoder replay (logits --decoder-replay on): in chunks of 100 the rows before each chunk's last
# window + margin (8 + 12) have no logits (NaN), the others are finite; it stays batch-invariant
# among companions and reads no foreign row; a margin covering the whole chunk (no replay) gives
# the full path's bytes; and the quality script compares replay and the full path with the
# reference over the replayed rows (figures printed, bounded loosely: random weights amplify the
# truncated windows, docs/decoder_replay.md).
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/full100.f32" --path fast \
  --mode chunked:100 2>/dev/null >/dev/null
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/rep.f32" --path fast \
  --mode chunked:100 --decoder-replay on 2>/dev/null >"$T/rep.json"
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/repmix.f32" --path fast \
  --mode chunked:100 --decoder-replay on --companions 4 --companion-seed 9 2>/dev/null >"$T/repmix.json"
cmp "$T/rep.f32" "$T/repmix.f32"
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/rep92.f32" --path fast \
  --mode chunked:100 --decoder-replay on --replay-margin 92 2>/dev/null >/dev/null
cmp "$T/full100.f32" "$T/rep92.f32"
"$BIN" logits --model "$T/m" --tokens-file "$T/toks" --out "$T/ref100.f32" --mode chunked:100 \
  >/dev/null 2>&1
python3 - "$T/rep.json" "$T/repmix.json" "$T/rep.f32" <<'PY'
import json, math, struct, sys
for f in sys.argv[1:3]:
    j = json.load(open(f))
    assert j["decoder_replay"] == "on" and j["foreign_reads"] == 0, j
    assert j["rows_without_logits"] == 10 * 80, j
data = open(sys.argv[3], "rb").read(); V = len(data) // 4 // 1000
for t in range(1000):
    v = struct.unpack_from("<f", data, 4 * t * V)[0]
    assert math.isnan(v) == (t % 100 < 80), (t, v)
PY
# --replay-margin exact ((decoder layers - 1) x (window - 1) = 3 x 7 here): each chunk's last row
# and every row after the last replayed chunk (20 tokens, too few to replay) are the full path's
# bits; the default margin 12 differs there.
python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(0, 300)) for _ in range(1020)))" >"$T/toks1020"
"$BIN" logits --model "$T/m" --tokens-file "$T/toks1020" --out "$T/full1020.f32" --path fast \
  --mode chunked:100 2>/dev/null >/dev/null
for mg in exact 12; do
  "$BIN" logits --model "$T/m" --tokens-file "$T/toks1020" --out "$T/rep1020_$mg.f32" --path fast \
    --mode chunked:100 --decoder-replay on --replay-margin $mg 2>/dev/null >"$T/rep1020_$mg.json"
done
python3 - "$T/full1020.f32" "$T/rep1020_exact.f32" "$T/rep1020_12.f32" "$T/rep1020_exact.json" <<'PY'
import json, sys
full, exact, approx = (open(f, "rb").read() for f in sys.argv[1:4])
assert json.load(open(sys.argv[4]))["replay_margin"] == 21
T = 1020; rb = len(full) // T
rows = [c * 100 + 99 for c in range(10)] + list(range(1000, 1020))
row = lambda b, p: b[p * rb:(p + 1) * rb]
same = [p for p in rows if row(full, p) == row(exact, p)]
assert same == rows, sorted(set(rows) - set(same))
assert any(row(full, p) != row(approx, p) for p in rows), "margin 12 is exact too: the check binds nothing"
print("ok: --replay-margin exact gives the full path's bits on", len(rows), "rows")
PY
python3 "$(dirname "$0")/../../scripts/replay_quality.py" "$T/toks" "$T/ref100.f32" \
  "$T/full100.f32" "$T/rep.f32" | tee "$T/q.json"
python3 - "$T/q.json" <<'PY'
import json, sys
q = json.load(open(sys.argv[1]))
assert q["rows_compared"] == 199, q
assert q["full"]["mean_abs_dlogprob"] < 0.05 and q["full"]["argmax_off"] < 0.1, q
assert q["replay"]["mean_abs_dlogprob"] < 0.5 and q["replay"]["argmax_off"] < 0.5, q
PY
# prompt_logprobs (vLLM's field) through serve with decoder replay on and prompt chunks of 32
# (> window + margin: replay would skip rows): every prompt token's logprob equals the logits
# file's (full stack, no cached prefix), top entries ranked; chat has it at the top level; with
# stream it is refused naming the field.
python3 -c "import random; random.seed(4); print(','.join(str(random.randrange(0, 300)) for _ in range(60)))" >"$T/p60"
"$BIN" logits --model "$T/m" --tokens-file "$T/p60" --out "$T/p60.f32" --path fast >/dev/null 2>&1
"$BIN" serve --model "$T/m" --port 0 --decoder-replay on --max-num-batched-tokens 32 \
  >"$T/plp.log" 2>&1 &
SPID=$!
# shellcheck source=../serve_port.sh
. "$(dirname "$0")/../serve_port.sh"
PORT=$(listen_port "$T/plp.log")
python3 - "$PORT" "$T/p60" "$T/p60.f32" <<'PY'
import json, math, struct, sys, urllib.request, urllib.error
port, toks = int(sys.argv[1]), [int(x) for x in open(sys.argv[2]).read().split(",")]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        return 200, json.load(urllib.request.urlopen(req))
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
st, r = post("/v1/completions", {"model": "m", "prompt": toks, "max_tokens": 2, "prompt_logprobs": 3})
assert st == 200, r
pl = r["choices"][0]["prompt_logprobs"]
assert pl[0] is None and len(pl) == len(toks), len(pl)
data = open(sys.argv[3], "rb").read(); V = len(data) // 4 // len(toks)
for p in range(1, len(toks)):
    row = struct.unpack_from(f"<{V}f", data, 4 * (p - 1) * V)
    m = max(row); lz = m + math.log(sum(math.exp(v - m) for v in row))
    e = pl[p][str(toks[p])]
    assert abs(e["logprob"] - (row[toks[p]] - lz)) < 1e-4, (p, e)
    assert e["rank"] == 1 + sum(v > row[toks[p]] for v in row), (p, e)
    ranks = sorted(x["rank"] for k, x in pl[p].items() if k != str(toks[p]))
    assert ranks == [i for i in (1, 2, 3) if i != e["rank"]][:len(ranks)] and len(pl[p]) >= 3, pl[p]
st, c = post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 2, "prompt_logprobs": 0})
assert st == 200 and c["prompt_logprobs"][0] is None and len(c["prompt_logprobs"]) == c["usage"]["prompt_tokens"], c
st, e = post("/v1/completions", {"model": "m", "prompt": toks, "max_tokens": 2, "prompt_logprobs": 1,
                                 "stream": True})
assert st == 400 and e["error"]["param"] == "prompt_logprobs", e
# A prompt_logprobs request takes no cached prefix, but the blocks it leaves stay in its cache_salt's
# partition: an unsalted request with the same prompt finds nothing, a same-salt one finds them.
def hits():
    m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return float([l for l in m.splitlines() if l.startswith("dsv41_prefix_cache_hit_tokens_total")][0].split()[-1])
long = (toks * 5)[:300]
h0 = hits()
assert post("/v1/completions", {"model": "m", "prompt": long, "max_tokens": 1, "prompt_logprobs": 0,
                                "cache_salt": "s1"})[0] == 200
assert post("/v1/completions", {"model": "m", "prompt": long, "max_tokens": 1})[0] == 200
assert hits() == h0, "an unsalted request attached blocks of a salted prompt_logprobs request"
assert post("/v1/completions", {"model": "m", "prompt": long, "max_tokens": 1, "cache_salt": "s1"})[0] == 200
assert hits() > h0, "the salted request found nothing of its own salt's blocks"
print("ok: prompt_logprobs match the logits file (decoder replay on, full stack); salts kept apart")
PY
kill $SPID; wait $SPID || true
echo ok
