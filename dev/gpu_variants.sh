#!/usr/bin/env bash
# gpu_variants.sh OUT_DIR [NAME=CUDA_FLAGS ...] — time variants of moex side by side on one
# GPU (dev/notes/cuda-notes.md keeps the results).
#
# Builds moex once per variant (in build-var-NAME/, in parallel), runs every variant's
# tests/gpu/test_cuda_backends (all at once), then `moex bench --device cuda` for the cases in
# VARIANT_CASES, and writes OUT_DIR/variants.csv (the variant's name, then the bench row)
# and OUT_DIR/variants.log. Without arguments there is one variant:
#   main        this checkout as it is, default flags
# NAME=CUDA_FLAGS builds this checkout with extra nvcc flags (CMAKE_CUDA_FLAGS). The kernels
# have no build-time switches any more (GEMM_DIRECT_A and the like were removed): to time a
# variant of the code, make it a git branch and build it from its own worktree, e.g.
#   git worktree add ../moex-try try-branch && (cd ../moex-try && dev/gpu_variants.sh OUT_TRY)
# and compare OUT_TRY/variants.csv with this checkout's OUT_DIR/variants.csv (same GPU, one
# run after the other).
# cJSON is compiled from MOEX_DEPS_DIR/cJSON (default peer-run/deps) where none is installed;
# OpenBLAS is not used. Every step is time-limited, so one hung variant cannot take the run
# with it.
#
# Environment: VARIANT_CASES (qwen3-30b-a3b:16384,deepseek-v3:16384), VARIANT_BACKENDS
# (grouped_mm), VARIANT_RUNS (10), CUDA_ARCH (90a), VARIANT_TESTS (1; 0 builds and runs no
# test program: a quicker first look, whose numbers still need the tests of the winner),
# MOEX_DEPS_DIR (peer-run/deps). Several variants at once share the cores.
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
[ ${#VARIANTS[@]} -eq 0 ] && VARIANTS=("main=")
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

DEPS_SRC=${MOEX_DEPS_DIR:-$ROOT/peer-run/deps}
EXTRA=(-DMOEX_OPENBLAS=OFF)
[ -f "$DEPS_SRC/cJSON/cJSON.c" ] && EXTRA+=("-DMOEX_CJSON_SOURCE_DIR=$DEPS_SRC/cJSON")
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
echo "variant,shape,backend,device,dtype,experts,threads,tokens,graph,ms,gflops,weight_gbps,max_abs_err,gemm_frac,bw_frac,read_floor_ms,floor_frac,first_ms,workspace_mib" >"$csv"
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
