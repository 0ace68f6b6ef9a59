#!/usr/bin/env bash
# Check of scripts/setup.sh without installing anything: apt-get, npm, dpkg-query and node are
# stand-ins that print what the real tools print while they work. setup.sh must say what it
# installs and let that progress through (a first run otherwise sits silent for a minute).
# Usage: setup_check.sh REPO_ROOT
set -uo pipefail
root=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/repo/scripts" "$work/repo/tests/js" "$work/bin"
cp "$root/scripts/setup.sh" "$work/repo/scripts/"
cp "$root/tests/js/package.json" "$work/repo/tests/js/"
stub() {
  printf '#!/bin/sh\n%s\n' "$2" >"$work/bin/$1"
  chmod +x "$work/bin/$1"
}
stub dpkg-query 'exit 1'  # nothing installed yet
stub node 'exit 0'
stub npm 'echo "stub-npm $*"; echo "added 31 packages in 2s"'
stub apt-get 'case " $* " in *" -qq "*) exit 0 ;; esac  # apt-get -qq prints nothing
case "$1" in
  update) echo "Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]" ;;
  *) echo "Unpacking cmake (3.25.1-1) ..."; echo "Setting up cmake (3.25.1-1) ..." ;;
esac'
out=$(PATH="$work/bin:$PATH" bash "$work/repo/scripts/setup.sh" 2>&1)
rc=$?
failed=0
expect() {
  if [[ "$out" != *"$1"* ]]; then
    echo "setup_check: FAIL: the output lacks '$1' ($2)" >&2
    failed=1
  fi
}
[ $rc -eq 0 ] || { echo "setup_check: FAIL: setup.sh exited $rc" >&2; failed=1; }
expect "Debian packages" "what it installs"
expect "cmake" "the package names"
expect "Get:1 http://deb.debian.org" "apt-get update's progress"
expect "Setting up cmake" "apt-get install's progress"
expect "openai" "which npm packages"
expect "added 31 packages" "npm's output"
expect "setup: ok" "the end"
[ $failed -eq 0 ] && echo "setup_check: ok" || printf '%s\n' "--- setup.sh output:" "$out" >&2
exit $failed
