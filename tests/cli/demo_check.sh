#!/usr/bin/env bash
# Check of scripts/run-demo.sh's first start: it must build the `dsv41` binary alone, not the tests
# and the sanitized tree (on 2 cores the whole build is most of a first start). Two parts:
#  1. run-demo.sh with the real scripts/build.sh, and stand-ins for setup.sh, cmake and the built
#     binary: the build step must name the target, and serve must start with the given arguments,
#     which override the script's --host/--port;
#  2. in the configured build tree: the `dsv41` target's inputs hold no test code.
# Usage: demo_check.sh REPO_ROOT BUILD_DIR
set -uo pipefail
root=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() {
  echo "demo_check: FAIL: $1" >&2
  failed=1
}

mkdir -p "$work/repo/scripts" "$work/repo/build/src/cli" "$work/bin"
cp "$root/scripts/run-demo.sh" "$root/scripts/build.sh" "$work/repo/scripts/"
printf '#!/bin/sh\necho "setup: ok"\n' >"$work/repo/scripts/setup.sh"
printf '#!/bin/sh\necho "cmake $*" >>"%s/cmake.log"\n' "$work" >"$work/bin/cmake"
printf '#!/bin/sh\necho "dsv41 $*"\n' >"$work/repo/build/src/cli/dsv41"
chmod +x "$work/bin/cmake" "$work/repo/build/src/cli/dsv41"
out=$(PATH="$work/bin:$PATH" bash "$work/repo/scripts/run-demo.sh" --model-name x 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "run-demo.sh exited $rc: $out"
builds=$(grep -c -- '--build' "$work/cmake.log")
[ "$builds" -eq 1 ] || fail "expected one cmake --build, got $builds: $(cat "$work/cmake.log")"
grep -q -- '--build build .*--target dsv41' "$work/cmake.log" ||
  fail "the build step does not name the dsv41 target: $(cat "$work/cmake.log")"
[[ "$out" == *"dsv41 serve --host 127.0.0.1 --port 8000 --model-name x"* ]] ||
  fail "serve did not start with the given arguments: $out"
# Arguments override the script's defaults (serve refuses a flag given twice).
for given in "--port 9000" "--port=9000"; do
  # shellcheck disable=SC2086
  out=$(PATH="$work/bin:$PATH" bash "$work/repo/scripts/run-demo.sh" $given 2>&1)
  [[ "$out" == *"dsv41 serve --host 127.0.0.1 $given" ]] || fail "run-demo.sh $given: $out"
done
out=$(PATH="$work/bin:$PATH" bash "$work/repo/scripts/run-demo.sh" --host 0.0.0.0 --port 1 2>&1)
[[ "$out" == *"dsv41 serve --host 0.0.0.0 --port 1" ]] || fail "run-demo.sh --host --port: $out"

# The dsv41 target's inputs: the binary's own objects and libraries, no test programs.
inputs=$(ninja -C "$build" -t inputs dsv41) || fail "ninja -t inputs dsv41 failed"
objs=$(grep -c '\.o$' <<<"$inputs")
all=$(ninja -C "$build" -t inputs all | grep -c '\.o$')
tests=$(grep -c -E '(^|/)tests/|gtest' <<<"$inputs")
[ "$tests" -eq 0 ] || fail "the dsv41 target depends on $tests test inputs"
[ "$objs" -gt 0 ] && [ "$objs" -lt "$all" ] || fail "dsv41 needs $objs of $all objects"
[ $failed -eq 0 ] && echo "demo_check: ok (dsv41 alone: $objs of $all objects)"
exit $failed
