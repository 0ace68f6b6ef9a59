#!/usr/bin/env bash
# `bench decode` in one process and split over mpirun ranks, in one script (issue 17): tok/s per
# split against one process, rank 0's time in collectives and its share of a step, bytes exchanged
# per token, and each rank's weights and resident memory.
#
# Usage: scripts/bench_parallel.sh MODEL [RANKS] [-- extra bench decode options]
#   RANKS (default 2): the splits measured are --tp RANKS, --ep RANKS and both.
#   Extra options go to every run (e.g. --streams 1,4 --steps 8 --kv-cache-gb 2); not --threads:
#   each rank gets THREADS (environment; default: this machine's cores / RANKS, at least 1) and the
#   one process RANKS x THREADS, so both use the same cores.
#   MPIRUN (environment) replaces `mpirun --oversubscribe` (add --bind-to numa, a hostfile, ...).
# Prints one JSON object; the raw bench outputs are kept in $OUT (default: a temporary folder).
set -euo pipefail
BIN="${DSV41:-$(dirname "$0")/../build/src/cli/dsv41}"
MODEL="${1:?usage: bench_parallel.sh MODEL [RANKS] [-- bench decode options]}"
shift
RANKS=2
if [ $# -gt 0 ] && [ "$1" != "--" ]; then RANKS="$1"; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
EXTRA=("$@")
for x in "${EXTRA[@]}"; do
  [ "$x" = "--threads" ] && { echo "bench_parallel: set THREADS (per rank), not --threads" >&2; exit 1; }
done
THREADS="${THREADS:-$(($(nproc) / RANKS))}"
[ "$THREADS" -ge 1 ] || THREADS=1
OUT="${OUT:-$(mktemp -d)}"
read -r -a MPIRUN <<<"${MPIRUN:-mpirun --oversubscribe}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "bench_parallel: one process, $((RANKS * THREADS)) threads ..." >&2
"$BIN" bench decode --model "$MODEL" --threads $((RANKS * THREADS)) "${EXTRA[@]}" >"$OUT/one.json"
for split in "tp $RANKS ep 1" "tp 1 ep $RANKS" "tp $RANKS ep $RANKS"; do
  read -r _ tp _ ep <<<"$split"
  echo "bench_parallel: $RANKS ranks of $THREADS threads, --tp $tp --ep $ep ..." >&2
  "${MPIRUN[@]}" -np "$RANKS" "$BIN" bench decode --model "$MODEL" --tp "$tp" --ep "$ep" \
    --threads "$THREADS" "${EXTRA[@]}" >"$OUT/tp${tp}_ep${ep}.json"
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
one = json.load(open(os.path.join(out, "one.json")))
res = {"isa": one["isa"], "threads_one_process": one["threads"], "one_process": {"points": [{k: p[k] for k in ("streams", "context", "tok_s", "step_ms")} for p in one["points"]],
                                           "per_rank": one["per_rank"]}, "splits": []}
for f in sorted(glob.glob(os.path.join(out, "tp*_ep*.json"))):
    d = json.load(open(f))
    pts = []
    for p, q in zip(d["points"], one["points"]):
        pts.append({"streams": p["streams"], "context": p["context"], "tok_s": p["tok_s"],
                    "vs_one_process": p["tok_s"] / q["tok_s"], "step_ms": p["step_ms"],
                    "collective_ms_per_step": p["collective_ms_per_step"],
                    "collective_share": p["collective_share"],
                    "exchanged_bytes_per_token": p["exchanged_bytes_per_token"]})
    res["splits"].append({"ranks": d["ranks"], "tp": d["tp"], "ep": d["ep"], "points": pts,
                          "per_rank": [{k: r[k] for k in ("rank", "weight_bytes", "rss_bytes", "rss_file_bytes", "kv_pool_bytes")} for r in d["per_rank"]]})
print(json.dumps(res, indent=2))
PY
