#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up, build, then every test (unit, ASan+UBSan hardening,
# CLI) through CTest. The last lines are CTest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 600
