#!/usr/bin/env bash
# Configures and builds dsv41 (Release) in build/. Extra arguments go to the CMake configure step.
# DSV41_BUILD_TARGET names one target to build instead of all of them (scripts/run-demo.sh builds
# only the `dsv41` binary: the tests and their helpers are most of the build).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
if [ -n "${DSV41_BUILD_TARGET:-}" ]; then
  cmake --build build -j"$(nproc)" --target "$DSV41_BUILD_TARGET"
else
  cmake --build build -j"$(nproc)"
fi
