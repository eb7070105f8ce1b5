#!/usr/bin/env bash
# gpu_variants.sh OUT_DIR [NAME=CUDA_FLAGS ...] — time build-time variants of the CUDA
# kernels side by side on one GPU (dev/notes/cuda-notes.md keeps the results).
#
# Builds moex once per variant (in build-var-NAME/, in parallel), runs every variant's
# tests/gpu/test_cuda_backends (all at once), then `moex bench --device cuda` for the cases in
# VARIANT_CASES, and writes OUT_DIR/variants.csv (the variant's name, then the bench row)
# and OUT_DIR/variants.log. Without arguments the variants are the grouped GEMM's:
#   main        the defaults
#   regs200     GEMM_CONSUMER_REGS=200 (the register split the direct copy needs)
#   direct      GEMM_DIRECT_A=1 (hidden rows copied by index; 200 consumer registers)
# Other switches: GROUPED_TC_MIN_ROWS=N (grouped_mm takes the tensor-core GEMM from N rows per
# expert on average, 16 by default; with VARIANT_CASES at 64 or 512 tokens).
# Run scripts/gpu_suite.sh OUT_DIR SUITE_STEPS=none first on a machine without cJSON or
# pkg-config: the variants reuse the dependencies it makes in build-gpu/deps.
# Every step is time-limited, so one hung variant cannot take the run with it.
#
# Environment: VARIANT_CASES (qwen3-30b-a3b:16384,deepseek-v3:16384), VARIANT_BACKENDS
# (grouped_mm), VARIANT_RUNS (10), CUDA_ARCH (90a), VARIANT_TESTS (1; 0 builds and runs no
# test program: a quicker first look, whose numbers still need the tests of the winner).
# Five variants at once take several minutes to build (each gets a fifth of the cores).
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [NAME=CUDA_FLAGS ...]" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
shift
cd "$ROOT" || exit 2
VARIANTS=("$@")
[ ${#VARIANTS[@]} -eq 0 ] && VARIANTS=("main=" "regs200=-DGEMM_CONSUMER_REGS=200" "direct=-DGEMM_DIRECT_A=1")
CASES=${VARIANT_CASES:-qwen3-30b-a3b:16384,deepseek-v3:16384}
BACKENDS=${VARIANT_BACKENDS:-grouped_mm}
RUNS=${VARIANT_RUNS:-10}
ARCH=${CUDA_ARCH:-90a}
TESTS=${VARIANT_TESTS:-1}
TARGETS=(moex)
[ "$TESTS" = 1 ] && TARGETS+=(test_cuda_backends)
LOG="$OUT/variants.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

DEPS="$ROOT/build-gpu/deps"
EXTRA=()
if [ -x "$DEPS/bin/pkg-config" ]; then
  export PATH="$DEPS/bin:$PATH"
  EXTRA+=("-DPKG_CONFIG_EXECUTABLE=$DEPS/bin/pkg-config")
fi
[ -d "$DEPS/lib/pkgconfig" ] && export PKG_CONFIG_PATH="$DEPS/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
jobs=$(( $(nproc) / ${#VARIANTS[@]} ))
[ "$jobs" -lt 1 ] && jobs=1

echo "== $(date -u +%H:%M:%S) building ${#VARIANTS[@]} variants ($jobs jobs each)"
for v in "${VARIANTS[@]}"; do
  name=${v%%=*} flags=${v#*=}
  (timeout 400 cmake -S . -B "build-var-$name" -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DMOEX_BUILD_TESTS=OFF \
     -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "-DCMAKE_CUDA_FLAGS=$flags" "${EXTRA[@]}" >"build-var-$name.log" 2>&1 &&
   timeout 400 cmake --build "build-var-$name" -j"$jobs" --target "${TARGETS[@]}" >>"build-var-$name.log" 2>&1
   echo "$name: build exit $?") &
done
wait

echo "== $(date -u +%H:%M:%S) tests (the whole test_cuda_backends of every variant at once: correctness only)"
for v in "${VARIANTS[@]}"; do
  name=${v%%=*} b="build-var-$name"
  [ "$TESTS" = 1 ] && [ -x "$b/tests/gpu/test_cuda_backends" ] || continue
  (timeout 240 "$b/tests/gpu/test_cuda_backends" >"$OUT/test_$name.out" 2>&1
   echo "$name: test exit $? ($(tail -1 "$OUT/test_$name.out"))") &
done
wait
echo "== $(date -u +%H:%M:%S) bench"
csv="$OUT/variants.csv"
echo "variant,shape,backend,device,dtype,experts,threads,tokens,graph,ms,gflops,weight_gbps,max_abs_err,gemm_frac,bw_frac,read_floor_ms,floor_frac" >"$csv"
for v in "${VARIANTS[@]}"; do
  name=${v%%=*} b="build-var-$name"
  if [ ! -x "$b/moex" ]; then
    echo "$name: not built (build-var-$name.log):"; tail -5 "build-var-$name.log"
    continue
  fi
  IFS=, read -ra cases <<<"$CASES"
  for c in "${cases[@]}"; do
    rm -f "$OUT/bench.tmp"
    timeout 60 "$b/moex" bench --device cuda --shape "${c%%:*}" --tokens "${c##*:}" --dtype bf16 --backends "$BACKENDS" \
      --graph off --runs "$RUNS" --csv "$OUT/bench.tmp" >/dev/null 2>&1
    rc=$?
    [ -f "$OUT/bench.tmp" ] && grep -v '^#\|^shape,' "$OUT/bench.tmp" | sed "s/^/$name,/" | tee -a "$csv"
    [ $rc -ne 0 ] && echo "$name $c: bench exit $rc"
  done
done
rm -f "$OUT/bench.tmp" "$OUT"/test_*.out
echo "== done: $csv"
