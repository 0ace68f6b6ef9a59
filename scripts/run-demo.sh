#!/usr/bin/env bash
# Demo: set-up, a build of the `dsv41` binary alone (scripts/test.sh builds the tests), then
# `dsv41 serve` with no --model: on first run it creates the demo model (a small random-weight V4.1
# checkpoint with the V4.1-style real tokenizer) in the cache directory
# (${DSV41_CACHE:-~/.cache/dsv41}/demo), then answers OpenAI requests on http://127.0.0.1:8000.
# Stop it with Ctrl-C (or SIGTERM): in-flight requests finish first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DSV41_BUILD_TARGET=dsv41 bash scripts/build.sh
exec ./build/src/cli/dsv41 serve --host 127.0.0.1 --port 8000 "$@"
