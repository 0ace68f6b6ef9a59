#!/usr/bin/env bash
# Demo: set-up, a build of the `dsv41` binary alone (scripts/test.sh builds the tests), then
# `dsv41 serve` with no --model: on first run it creates the demo model (a small random-weight V4.1
# checkpoint with the V4.1-style real tokenizer) in the cache directory
# (${DSV41_CACHE:-~/.cache/dsv41}/demo), then answers OpenAI requests on http://127.0.0.1:8000.
# Stop it with Ctrl-C (or SIGTERM): in-flight requests finish first. Arguments go to `serve`
# (`--port 9000`, `--api-key KEY`, ...), over the script's defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DSV41_BUILD_TARGET=dsv41 bash scripts/build.sh
# The script's defaults (127.0.0.1:8000) only where the arguments do not give their own: `serve`
# refuses a flag given twice.
defaults=()
has() { local a; for a in "${args[@]}"; do [[ "$a" == "$1" || "$a" == "$1="* ]] && return 0; done; return 1; }
args=("$@")
has --host || defaults+=(--host 127.0.0.1)
has --port || defaults+=(--port 8000)
exec ./build/src/cli/dsv41 serve "${defaults[@]}" "$@"
