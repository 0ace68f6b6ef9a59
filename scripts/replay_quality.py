#!/usr/bin/env python3
"""Decoder replay's quality gate (issue 15): teacher-forced logits of one token sequence from the
reference, the full fast path and the fast path with decoder replay, compared over the rows replay
computes (its NaN rows are skipped): mean |delta logprob| of the next token and the share of rows
whose argmax differs from the reference's, for replay and for the full fast path over the same rows.

Usage: replay_quality.py TOKENS_FILE REFERENCE.f32 FULL.f32 REPLAY.f32 [--engine-rows CHUNK]
--engine-rows CHUNK (the files written with --mode chunked:CHUNK): compare only the rows the engine
samples from, each chunk's last row and the rows of a last, partial chunk (decode-like: they read
the decoder windows the replayed chunks left).
Prints one JSON object."""
import json, math, struct, sys


def rows(path, vocab):
    data = open(path, "rb").read()
    n = len(data) // 4
    vals = struct.unpack(f"<{n}f", data)
    return [vals[i * vocab:(i + 1) * vocab] for i in range(n // vocab)]


def logprob(row, tok):
    m = max(row)
    return row[tok] - m - math.log(sum(math.exp(v - m) for v in row))


def argmax(row):
    return max(range(len(row)), key=row.__getitem__)


chunk = 0
if len(sys.argv) == 7 and sys.argv[5] == "--engine-rows":
    chunk = int(sys.argv[6])
elif len(sys.argv) != 5:
    sys.exit(__doc__)
toks = [int(x) for x in open(sys.argv[1]).read().replace(",", " ").split()]
size = len(open(sys.argv[2], "rb").read()) // 4
vocab = size // len(toks)
ref, full, rep = (rows(p, vocab) for p in sys.argv[2:5])
used = [t for t in range(len(toks) - 1) if not math.isnan(rep[t][0])]
if chunk:
    used = [t for t in used if (t + 1) % chunk == 0 or t >= len(toks) // chunk * chunk]
assert used, "replay computed no rows with a next token"
out = {"rows": len(toks), "rows_compared": len(used)}
for name, got in (("full", full), ("replay", rep)):
    d = off = 0.0
    for t in used:
        d += abs(logprob(got[t], toks[t + 1]) - logprob(ref[t], toks[t + 1]))
        off += argmax(got[t]) != argmax(ref[t])
    out[name] = {"mean_abs_dlogprob": d / len(used), "argmax_off": off / len(used)}
print(json.dumps(out))
