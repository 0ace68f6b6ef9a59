#!/usr/bin/env bash
# Guards the dispatch promise "no higher-tier instruction runs on a CPU without it" at link level.
# An ISA tier's object may define weak (COMDAT) functions under names other objects define too:
# inline library code that was not inlined (std::vector's destructor, say). The linker keeps one
# copy for the whole program, possibly the tier's, so no such copy may hold a VEX/EVEX-encoded
# instruction (any mnemonic starting with v, or a ymm/zmm/mask register): the scalar code and
# lower tiers would call it. Arguments: the tier objects. Exit 1 naming each offending function.
set -euo pipefail
if [[ $# -eq 0 ]]; then
  echo "usage: check_tier_objects.sh OBJECT..." >&2
  exit 2
fi
bad=0
for obj in "$@"; do
  [[ -f "$obj" ]] || { echo "missing object: $obj" >&2; exit 2; }
  for sym in $(nm "$obj" | awk '$2 == "W" || $2 == "V" || $2 == "u" { print $3 }'); do
    if objdump -d --no-show-raw-insn --disassemble="$sym" "$obj" |
        grep -qE $'^ +[0-9a-f]+:\tv[a-z0-9]+|%[yz]mm|%k[0-7]'; then
      echo "$obj: weak function $(echo "$sym" | c++filt) holds AVX instructions" >&2
      bad=1
    fi
  done
done
if [[ $bad -eq 0 ]]; then echo "tier objects: no weak function holds AVX instructions ($# objects)"; fi
exit $bad
