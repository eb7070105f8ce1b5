#!/bin/sh
# planted.sh SOURCE_DIR — scripts/check_layers.sh must fail on a tree with one forbidden include
# planted (core including a backend header), naming the file and the header, and pass on the
# same tree without it.
set -u
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/src" "$src/tools" "$tmp/"
sh "$src/scripts/check_layers.sh" "$tmp" >/dev/null || { echo "the unplanted copy fails"; exit 1; }
printf '#include "backends/cpu/common.h"\n' >>"$tmp/src/core/status.c"
out=$(sh "$src/scripts/check_layers.sh" "$tmp") && { echo "a planted forbidden include passed: $out"; exit 1; }
echo "$out" | grep -q 'src/core/status.c:[0-9]*: the core layer may not include "backends/cpu/common.h"' ||
    { echo "the message does not name the file and header: $out"; exit 1; }
# a CUDA toolkit header in core is refused too
cp "$src/src/core/status.c" "$tmp/src/core/status.c"
printf '#include <cuda_runtime.h>\n' >>"$tmp/src/core/dtype.c"
sh "$src/scripts/check_layers.sh" "$tmp" >/dev/null && { echo "a CUDA header in core passed"; exit 1; }
echo "check_layers refuses the planted includes"
exit 0
