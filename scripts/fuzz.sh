#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz; clang, ASan+UBSan) in build-fuzz and runs each for
# SECONDS (default 60) on its committed seed corpus, two at a time, printing per target the
# executions, the coverage at start and end, and any crash (the input is saved as
# build-fuzz/findings/TARGET/crash-*). Exit status 1 when a target crashed.
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
# New inputs found are kept in build-fuzz/corpus/TARGET (the committed seeds are not modified).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-60}"
shift || true
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (apt-get install clang)"; exit 1; }
if [ ! -f build-fuzz/build.ninja ]; then
  CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDSV41_FUZZ=ON -DDSV41_BUILD_TESTS=OFF >/dev/null
fi
echo "fuzz: building the targets (clang, -fsanitize=fuzzer,address,undefined) ..."
ninja -C build-fuzz fuzz | tail -1
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(fuzz_safetensors fuzz_checkpoint_index fuzz_config fuzz_tokenizer_json fuzz_manifest
           fuzz_api_request fuzz_dsml_stream fuzz_stream_decoder fuzz_http fuzz_grammar_schema
           fuzz_grammar_matcher fuzz_image)
fi
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
run_one() {
  local t="$1" seeds="tests/fuzz/corpus/${1#fuzz_}" work="build-fuzz/corpus/$1"
  local out="build-fuzz/findings/$1"
  mkdir -p "$work" "$out"
  local dict=()
  for d in "tests/fuzz/${1#fuzz_}.dict" tests/fuzz/json.dict; do
    if [ -f "$d" ]; then dict=(-dict="$d"); break; fi
  done
  set +e
  "build-fuzz/tests/fuzz/$t" "$work" "$seeds" "${dict[@]}" -max_total_time="$SECONDS_EACH" \
    -timeout=10 -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 -artifact_prefix="$out/" \
    > "build-fuzz/findings/$t.log" 2>&1
  local rc=$?
  set -e
  local init cov execs
  init=$(grep -a -m1 -E '#[0-9]+\s+INITED' "build-fuzz/findings/$t.log" | grep -oE 'cov: [0-9]+' | head -1)
  cov=$(grep -a -E '#[0-9]+\s+(DONE|pulse|NEW|REDUCE)' "build-fuzz/findings/$t.log" | tail -1 | grep -oE 'cov: [0-9]+' | head -1)
  execs=$(grep -a -oE 'stat::number_of_executed_units: [0-9]+' "build-fuzz/findings/$t.log" | grep -oE '[0-9]+$')
  if [ $rc -eq 0 ]; then
    echo "fuzz: $t: ${execs:-?} executions in ${SECONDS_EACH}s, coverage ${init:-cov: ?} -> ${cov:-cov: ?}, no crash"
  else
    echo "fuzz: $t: CRASHED (exit $rc) after ${execs:-?} executions; input in $out/, log build-fuzz/findings/$t.log"
    grep -a -m3 -E 'ERROR|invariant failed|runtime error' "build-fuzz/findings/$t.log" | sed 's/^/fuzz:   /'
  fi
  return $rc
}
mkdir -p build-fuzz/findings
failed=0
pids=()
names=()
for t in "${TARGETS[@]}"; do
  run_one "$t" > "build-fuzz/findings/$t.summary" 2>&1 &
  pids+=($!)
  names+=("$t")
  if [ ${#pids[@]} -ge 2 ]; then
    wait "${pids[0]}" || failed=1
    cat "build-fuzz/findings/${names[0]}.summary"
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed=1
  cat "build-fuzz/findings/${names[$i]}.summary"
done
exit $failed
