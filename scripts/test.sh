#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up, then two builds and their tests through CTest:
# build/ (g++, Release: unit, engine, server, browser and CLI tests) and build-fuzz/ (clang, every
# layer library under ASan+UBSan: the hardening suites, the kernel, fast-forward and engine tests,
# every fuzz target on its seeds and committed regression inputs, then a few seconds of fuzzing
# each; tests/fuzz). Without clang the io/text hardening suites are built sanitized with g++ in
# build/ instead and the rest of the sanitized build is skipped (said so). Then the CTest summary of
# both and, last, the ten slowest tests of the run. Tests labelled `long` are skipped (CI time);
# `ctest -L long` in a tree runs them (docs/hardening.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if command -v clang++ >/dev/null 2>&1; then
  bash scripts/build.sh -DDSV41_ASAN_TESTS=OFF
  CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSV41_FUZZ=ON \
    -DDSV41_BUILD_TESTS=OFF >/dev/null
  cmake --build build-fuzz --target sanitized -j"$(nproc)"
else
  echo "test: clang++ not found: io/text hardening suites sanitized with g++; fuzz targets and sanitized engine tests not built"
  bash scripts/build.sh -DDSV41_ASAN_TESTS=ON
fi
status=0
fuzz_status=0
tested=(build)
if [ -d build-fuzz ] && command -v clang++ >/dev/null 2>&1; then
  tested+=(build-fuzz)
  echo "test: the sanitized build (build-fuzz)"
  # The thread pools sleep at once here: these tests run side by side on the cores, and a pool
  # that spins between jobs (ThreadPool::kSpin) slowed them by a quarter. The main build keeps the
  # default, so both ways of waiting are run.
  (cd build-fuzz && DSV41_POOL_SPIN_US=0 ctest --output-on-failure -j"$(nproc)" --timeout 600 -LE long) ||
    fuzz_status=1
  echo "test: the main build (build)"
fi
# One test more than cores in the main tree: its server, MPI and browser tests wait on sockets,
# timeouts and child processes (at -j2 on 2 cores 21% of the CPU idled: 259 of 326 core-seconds
# busy; at -j3 the tree took 138 s instead of 163 s, 2026-12-05).
(cd build && ctest --output-on-failure -j"$(($(nproc) + 1))" --timeout 600 -LE long) || status=1
# The ten slowest tests of both trees (CTest's own timings), so that CI time stays watched.
echo "test: the ten slowest tests"
for tree in "${tested[@]}"; do
  log="$tree/Testing/Temporary/LastTest.log"
  [ -f "$log" ] || continue
  awk -v tree="$tree" '/^[0-9]+\/[0-9]+ Testing: / { sub(/^[0-9]+\/[0-9]+ Testing: /, ""); name = $0 }
    /Test time = / { t = $0; sub(/.*Test time = */, "", t); sub(/ sec.*/, "", t);
                     printf "%8.1f s  %s (%s)\n", t, name, tree }' "$log"
done | sort -rn | sed -n 1,10p  # sed reads all of it: head would leave sort a SIGPIPE (141 under pipefail)
if [ $fuzz_status -ne 0 ]; then
  echo "test: FAILED in the sanitized build (build-fuzz): see its CTest output above"
  status=1
fi
exit $status
