#!/usr/bin/env bash
# Soak test (docs/hardening.md): starts `dsv41 serve` on the demo model (made on first use) with
# a 0.1 GB KV pool, small enough that the prefix cache fills it and must then evict, on a
# free port, and runs tests/soak/soak.py against it for MINUTES (default 30): 8
# concurrent clients, streamed and whole requests on every generation API, random client hang-ups,
# malformed requests mixed in; the server's RSS every 10 s. Exit 1 on any 5xx or connection
# error, an answer of the wrong class, KV blocks left in use once idle, a foreign read, or RSS
# growing more than 2% after warm-up (2 minutes and the pool filled once, which the prefix
# cache's first eviction shows).   bash scripts/soak.sh [MINUTES]   (DSV41_BIN: another binary)
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES="${1:-30}"
BIN="${DSV41_BIN:-build/src/cli/dsv41}"  # DSV41_BIN: another build's binary
[ -x "$BIN" ] || { echo "soak: build first (bash scripts/build.sh)"; exit 1; }
LOG=$(mktemp /tmp/dsv41_soak_XXXX.log)
# No --model: the demo model (made and converted on first use), served as dsv41-demo.
"$BIN" serve --port 0 --kv-cache-gb 0.1 2>"$LOG" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 1500); do  # up to 5 minutes (a first run makes the demo model)
  PORT=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$LOG" | grep -o '[0-9]*$' || true)
  [ -n "$PORT" ] && break
  sleep 0.2
done
[ -n "${PORT:-}" ] || { echo "soak: the server did not start"; cat "$LOG"; exit 1; }
echo "soak: server pid $PID on port $PORT, $MINUTES minutes, log $LOG"
python3 tests/soak/soak.py "$PORT" "$PID" "$MINUTES"
