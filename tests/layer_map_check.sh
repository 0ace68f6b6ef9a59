#!/usr/bin/env bash
# design.md §2's layer map, enforced on the sources: every `#include "X/..."` of a layer's files
# must name a layer it may use (lower never includes upper; frontends see only the engine API, no
# kernel or model headers; the oracle and the converter (model/ outside model/fast) include no
# kernels). Also checks the CMake side: dsv41_model links no kernels.
set -euo pipefail
SRC="$1/src"
allowed() {  # directory -> allowed include roots
  case "$1" in
    core) echo "core" ;;
    io) echo "core io" ;;
    text) echo "core io text" ;;
    grammar) echo "core text grammar" ;;
    vision) echo "core vision" ;;
    ops) echo "core ops" ;;
    model) echo "core io text model" ;;
    model/fast) echo "core io text model ops" ;;
    parallel) echo "core io text model parallel" ;;
    engine) echo "core io text grammar model parallel engine" ;;
    server) echo "core text grammar engine server" ;;
    cli) echo "core io text grammar vision model ops parallel engine server cli" ;;
    *) echo "" ;;
  esac
}
bad=0
while IFS= read -r f; do
  rel="${f#$SRC/}"
  layer="${rel%%/*}"
  [[ "$rel" == model/fast/* ]] && layer="model/fast"
  ok=" $(allowed "$layer") "
  while IFS= read -r inc; do
    root="${inc%%/*}"
    if [[ "$ok" != *" $root "* ]]; then
      echo "layer map: $rel includes \"$inc\" ($layer may include: $(allowed "$layer"))"
      bad=1
    fi
  done < <(grep -oE '^#include "[a-z_0-9]+/[^"]+"' "$f" | sed -E 's/#include "(.*)"/\1/')
done < <(find "$SRC" -name '*.h' -o -name '*.cpp')
# A model/ header outside model/fast that engine or frontends reach must not pull kernels in
# through model/fast either: model/fast headers the engine includes may not include ops/.
for h in "$SRC"/model/fast/fast_model.h "$SRC"/model/fast/kv_pool.h "$SRC"/model/seam.h; do
  if grep -qE '^#include "ops/' "$h"; then
    echo "layer map: ${h#$SRC/} (seen by the engine) includes a kernel header"
    bad=1
  fi
done
model_lib=$(awk '/dsv41_library\(dsv41_model$/{on=1} on{print} on&&/\)[[:space:]]*$/{exit}' \
  "$SRC/model/CMakeLists.txt")
if grep -q dsv41_ops <<<"$model_lib"; then
  echo "layer map: dsv41_model links dsv41_ops (the oracle and the converter must link no kernels)"
  bad=1
fi
[ "$bad" = 0 ] && echo "layer map: ok"
exit "$bad"
