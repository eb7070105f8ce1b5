#!/usr/bin/env bash
# check_wgmma.sh NVCC SOURCE_DIR [ARCH] — compile the grouped GEMM (src/backends/cuda/gemm_sm90.cu) and
# fail if ptxas serialises its wgmmas (C7518) or injects waits of its own (C7517): either one
# leaves the kernel correct but several times slower, and only `-Xptxas -v` tells.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 NVCC SOURCE_DIR [ARCH]" >&2
  exit 2
fi
NVCC=$1 SRC=$2 ARCH=${3:-90a}
OBJ=$(mktemp) || exit 2
trap 'rm -f "$OBJ"' EXIT
LOG=$("$NVCC" -std=c++17 -O3 -gencode "arch=compute_$ARCH,code=sm_$ARCH" -I"$SRC/include" -I"$SRC/src" \
  -Xptxas -v -c "$SRC/src/backends/cuda/gemm_sm90.cu" -o "$OBJ" 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  echo "$LOG" | tail -20
  echo "gemm_sm90.cu did not compile (exit $rc)"
  exit 1
fi
BAD=$(echo "$LOG" | grep -E "C7518|C7517")
if [ -n "$BAD" ]; then
  echo "$BAD"
  echo "ptxas serialises or waits on the grouped GEMM's wgmmas: $(echo "$BAD" | wc -l) kernel(s)"
  exit 1
fi
echo "grouped GEMM: no serialised wgmma and no injected wait in $(echo "$LOG" | grep -c 'Compiling entry function') kernels"
