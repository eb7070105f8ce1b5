#!/usr/bin/env bash
# gpu_suite.sh OUT_DIR — the GPU suite, on a machine with an NVIDIA GPU:
#   1. checks the build dependencies: cJSON, when none is installed, is compiled by
#      the build from its sources in MOEX_DEPS_DIR (-DMOEX_CJSON_SOURCE_DIR); OpenBLAS
#      is not used (-DMOEX_OPENBLAS=OFF: only the CPU bench's sgemm ceiling needs it);
#      without cmocka the CPU test programs are left out — nothing is installed, and
#      pkg-config is not needed;
#   2. builds moex with CUDA (Release) in build-gpu/;
#   3. runs tests/gpu/test_cuda_backends, tests/gpu/test_cuda_decoder,
#      tests/gpu/test_cuda_model (whole models, GPU against CPU) and
#      tests/gpu/test_cuda_jit (kernels compiled at run time), then a quick
#      subset of the first two under compute-sanitizer memcheck;
#   4. runs `moex bench --device cuda` (bf16; eager, batched_mm, grouped_mm;
#      CUDA graphs off and on) for qwen3-30b-a3b and deepseek-v3, then again
#      with --cache warm at the peer's token counts (no L2 flush, one routing
#      repeated: the way the peer script times), both shapes in one CSV;
#   5. runs scripts/tf_generate_compare.py (whole-model generation, transformers
#      beside moex generate --device cuda on a random qwen3-30b-a3b-shaped
#      checkpoint written under the build directory), when torch is there;
#   6. runs the peer benchmark (dev/peer/tf_experts_bench.py, transformers'
#      own backends) plain and under torch.compile, when torch is there, into one
#      CSV (its column `compiled` tells the two apart);
#   7. prints a summary, with moex beside the peer case by case (scripts/peer_compare.py).
# Everything is logged to OUT_DIR/suite.log; results are CSV/SVG files in
# OUT_DIR (at most 8 files in all). Exit status: 0 if every step passed.
#
# Environment (all optional):
#   SUITE_BUDGET_S   wall-clock budget of the whole suite in seconds (570; the compiled peer
#                    gets what the other steps leave: on an H200 it needed about 140 s for
#                    qwen3-30b-a3b and more than 141 s for deepseek-v3)
#   BUILD_DIR        build directory (build-gpu)
#   CUDA_ARCH        CMAKE_CUDA_ARCHITECTURES (90a)
#   SUITE_CUDA_FLAGS extra nvcc flags (CMAKE_CUDA_FLAGS; none), e.g. a dev variant's -D switches
#   QWEN_TOKENS      token counts for qwen3-30b-a3b (1,8,64,512,4096,16384)
#   DEEPSEEK_TOKENS  token counts for deepseek-v3 (1,64,512,4096,16384)
#   BENCH_LIMITS     --backend-max-tokens for moex bench (batched_mm=512; e.g. add eager=4096)
#   BENCH_RUNS       timed runs per case (10)
#   PEER_TOKENS      token counts for the peer (1,64,16384)
#   PEER_COMPILE     1: also the torch.compile run of the peer (1)
#   PEER_COMPILED_TOKENS_QWEN, PEER_COMPILED_TOKENS_DEEPSEEK
#                    token counts of the compiled peer (1,16384 and 64,16384)
#   MEMCHECK_RESERVE_S  seconds kept for the memcheck step, which runs last (60)
#   MOEX_DEPS_DIR    where dependency sources are looked for (peer-run/deps, a folder git
#                    ignores): cJSON/cJSON.c and cJSON/cJSON.h, compiled into moex when the
#                    machine has no cJSON installed
#   SUITE_STEPS      the steps to run after the build, comma-separated, from
#                    test,memcheck,bench,compare,peer (all of them). "none" only builds: on a
#                    machine that keeps build-gpu/ between runs, build once with
#                    SUITE_STEPS=none, then run the rest (the build is then incremental)
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
cd "$ROOT" || exit 2

BUDGET=${SUITE_BUDGET_S:-570}
BUILD=${BUILD_DIR:-build-gpu}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
CUDA_ARCH=${CUDA_ARCH:-90a}
QWEN_TOKENS=${QWEN_TOKENS:-1,8,64,512,4096,16384}
DEEPSEEK_TOKENS=${DEEPSEEK_TOKENS:-1,64,512,4096,16384}
BENCH_LIMITS=${BENCH_LIMITS:-batched_mm=512}
BENCH_RUNS=${BENCH_RUNS:-10}
PEER_TOKENS=${PEER_TOKENS:-1,64,16384}
PEER_COMPILE=${PEER_COMPILE:-1}
# the compiled peer is slow to build (max-autotune): by default only the cases the
# issue compares against (qwen3 at 1 and 16384 tokens, deepseek-v3 at 64 and 16384)
PEER_COMPILED_TOKENS_QWEN=${PEER_COMPILED_TOKENS_QWEN:-1,16384}
PEER_COMPILED_TOKENS_DEEPSEEK=${PEER_COMPILED_TOKENS_DEEPSEEK:-64,16384}
MEMCHECK_RESERVE=${MEMCHECK_RESERVE_S:-60}  # seconds the peer leaves for memcheck
DEPS_SRC=${MOEX_DEPS_DIR:-$ROOT/peer-run/deps}
STEPS_WANTED=",${SUITE_STEPS:-test,memcheck,bench,compare,peer},"
START=$(date +%s)
want() { case "$STEPS_WANTED" in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

LOG="$OUT/suite.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

STEPS=()     # "name|status|seconds|note"
FAILED=0

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET - $(elapsed) )); }
say() { echo "[$(date -u +%H:%M:%S) +$(elapsed)s] $*"; }
record() { # name status seconds note
  STEPS+=("$1|$2|$3|$4")
  case "$2" in ok|skipped) ;; *) FAILED=$((FAILED + 1)) ;; esac
}

# run_step NAME MAX_SECONDS CMD...: runs CMD (a command or an exported function, in a bash
# with pipefail) with a timeout of min(MAX, budget left - reserve). Returns CMD's status
# (124 on timeout; 77 means skipped).
RESERVE=15
run_step() {
  local name=$1 max=$2
  shift 2
  local l t0 rc status
  l=$(( $(left) - RESERVE ))
  if [ "$l" -lt 10 ]; then
    say "== $name: skipped, the suite's budget of ${BUDGET}s is spent"
    record "$name" "no time" 0 "budget spent"
    return 125
  fi
  [ "$max" -lt "$l" ] && l=$max
  say "== $name (at most ${l}s): $*"
  t0=$(date +%s)
  timeout --kill-after=10 "$l" bash -c 'set -o pipefail; "$@"' run_step "$@"
  rc=$?
  status=ok
  [ $rc -ne 0 ] && status="FAIL ($rc)"
  [ $rc -eq 124 ] && status="timeout (${l}s)"
  [ $rc -eq 77 ] && status=skipped
  say "== $name: $status in $(( $(date +%s) - t0 ))s"
  record "$name" "$status" $(( $(date +%s) - t0 )) ""
  return $rc
}

# ---------------------------------------------------------------- machine
say "moex GPU suite in $ROOT -> $OUT (budget ${BUDGET}s)"
GPU_NAME=unknown-gpu
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
else
  say "nvidia-smi not found"
fi
GPU_TAG=$(echo "${GPU_NAME:-gpu}" | tr 'A-Z' 'a-z' | sed 's/nvidia//; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
[ -z "$GPU_TAG" ] && GPU_TAG=gpu
DATE=$(date -u +%Y-%m-%d)
command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -2
command -v cmake >/dev/null 2>&1 && cmake --version | head -1
echo "cpus: $(nproc)  git: $(git rev-parse --short HEAD 2>/dev/null || echo none)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"

# ---------------------------------------------------------------- dependencies
# Nothing is made or installed here; CMake is told what to do about what the machine lacks:
#   cJSON:    an installed one (pkg-config's libcjson, or cjson/cJSON.h and the library cjson),
#             else compiled by the build from $DEPS_SRC/cJSON (MIT; cJSON.c and cJSON.h);
#   OpenBLAS: not used (-DMOEX_OPENBLAS=OFF): only `moex bench --device cpu`'s sgemm ceiling
#             needs it; `--device cuda` never does;
#   cmocka:   the tests/test_*.c programs need it; without it the build leaves them out and
#             builds the rest (backend_ops, the GPU programs, the script tests), which ctest runs.
CMAKE_EXTRA=(-DMOEX_OPENBLAS=OFF)
[ -n "${SUITE_CUDA_FLAGS:-}" ] && CMAKE_EXTRA+=("-DCMAKE_CUDA_FLAGS=$SUITE_CUDA_FLAGS")
deps_step() {
  if [ -f "$DEPS_SRC/cJSON/cJSON.c" ] && [ -f "$DEPS_SRC/cJSON/cJSON.h" ]; then
    CMAKE_EXTRA+=("-DMOEX_CJSON_SOURCE_DIR=$DEPS_SRC/cJSON")
    echo "cJSON: sources in $DEPS_SRC/cJSON (compiled when no installed cJSON is found)"
  else
    echo "cJSON: no sources in $DEPS_SRC/cJSON: the build needs an installed cJSON"
  fi
  CMAKE_EXTRA+=(-DMOEX_BUILD_TESTS=ON)
  if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists cmocka; }; then
    say "cmocka not found: the tests/test_*.c programs are not built (ctest runs the others)"
  fi
  echo "OpenBLAS: not used (moex bench --device cuda does not need it)"
  return 0
}

say "== dependencies"
t0=$(date +%s)
if deps_step; then
  record dependencies ok $(( $(date +%s) - t0 )) ""
else
  record dependencies FAIL $(( $(date +%s) - t0 )) "see above"
fi

# ---------------------------------------------------------------- build
BUILD_OK=0
build_step() { # extra cmake arguments
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" "$@" || return 1
  cmake --build "$BUILD" -j"$(nproc)" || return 1
}
# every other test the build has (backend_ops on the CPU and the GPU, the CLI and script tests);
# the GPU programs ran as their own steps
ctest_step() { ctest --test-dir "$BUILD" --output-on-failure -LE gpu 2>&1 | tee "$BUILD/ctest.out"; }
test_step() { "$TEST" 2>&1 | tee "$BUILD/test_cuda_backends.out"; }
decoder_test_step() { "$DECODER_TEST" 2>&1 | tee "$BUILD/test_cuda_decoder.out"; }
model_test_step() { "$MODEL_TEST" 2>&1 | tee "$BUILD/test_cuda_model.out"; }
jit_test_step() { "$JIT_TEST" 2>&1 | tee "$BUILD/test_cuda_jit.out"; }
memcheck_step() {
  "$SANITIZER" --tool memcheck --error-exitcode 3 "$TEST" --quick 2>&1 |
    tee "$BUILD/memcheck.out"
}
decoder_memcheck_step() {
  "$SANITIZER" --tool memcheck --error-exitcode 3 "$DECODER_TEST" --quick 2>&1 |
    tee "$BUILD/memcheck_decoder.out"
}
bench_warm() { # both shapes at the peer's token counts, warm cache, into one CSV
  local f="$OUT/moex_warm_bf16_cuda_${GPU_TAG}_${DATE}.csv" t="$BUILD/bench_warm.csv" shape
  : >"$f"
  for shape in qwen3-30b-a3b deepseek-v3; do
    "$MOEX" bench --device cuda --shape "$shape" --tokens "$PEER_TOKENS" --dtype bf16 \
      --backends batched_mm,grouped_mm --graph both --backend-max-tokens batched_mm=512 \
      --runs "$BENCH_RUNS" --cache warm --reference off --csv "$t" || return 1
    cat "$t" >>"$f"
  done
}
bench_shape() { # shape tokens
  local base="$OUT/moex_${1}_bf16_cuda_${GPU_TAG}_${DATE}"
  "$MOEX" bench --device cuda --shape "$1" --tokens "$2" --dtype bf16 \
    --backends eager,batched_mm,grouped_mm --graph both --backend-max-tokens "$BENCH_LIMITS" \
    --runs "$BENCH_RUNS" --csv "$base.csv" --plot "$base.svg"
}
compare_step() { # the checkpoint (about 6 GB) stays in the build directory
  python3 -u "$ROOT/scripts/tf_generate_compare.py" "$BUILD/compare" --moex "$MOEX" |
    grep -v '^Loading weights\|^Writing model' &&
    cp "$BUILD/compare/compare.json" "$OUT/generate_compare_${GPU_TAG}_${DATE}.json"
}
peer_run() { # compile(0/1) shapes out (appended to) [tokens]
  SHAPES=$2 TOKENS="${4:-$PEER_TOKENS}" COMPILE=$1 \
    COMPILE_MODE=max-autotune-no-cudagraphs python3 -u "$PEER" >>"$3"
}
MOEX="$BUILD/moex"
TEST="$BUILD/tests/gpu/test_cuda_backends"
DECODER_TEST="$BUILD/tests/gpu/test_cuda_decoder"
MODEL_TEST="$BUILD/tests/gpu/test_cuda_model"
JIT_TEST="$BUILD/tests/gpu/test_cuda_jit"
PEER="$ROOT/dev/peer/tf_experts_bench.py"
export ROOT BUILD CUDA_ARCH OUT GPU_TAG DATE BENCH_LIMITS BENCH_RUNS PEER_TOKENS MOEX TEST DECODER_TEST MODEL_TEST JIT_TEST PEER
export -f build_step ctest_step test_step decoder_test_step model_test_step jit_test_step memcheck_step decoder_memcheck_step bench_shape bench_warm compare_step peer_run
if run_step build 300 build_step "${CMAKE_EXTRA[@]}"; then
  BUILD_OK=1
fi

# ---------------------------------------------------------------- tests
TEST_LINE="not run"
if ! want test && ! want memcheck; then
  :
elif [ $BUILD_OK -eq 1 ] && [ -x "$TEST" ]; then
  if want test; then
    run_step test_cuda_backends 200 test_step
    TEST_LINE=$(grep -a '^test_cuda_backends:.*passed\|^SKIP' "$BUILD/test_cuda_backends.out" | tail -1)
    if [ -x "$DECODER_TEST" ]; then
      run_step test_cuda_decoder 120 decoder_test_step
      DECODER_LINE=$(grep -a '^test_cuda_decoder:.*passed\|^SKIP' "$BUILD/test_cuda_decoder.out" | tail -1)
    else
      record test_cuda_decoder "not run" 0 "not built"
    fi
    if [ -x "$MODEL_TEST" ]; then
      run_step test_cuda_model 120 model_test_step
      MODEL_LINE=$(grep -a '^test_cuda_model:.*passed\|^SKIP' "$BUILD/test_cuda_model.out" | tail -1)
    else
      record test_cuda_model "not run" 0 "not built"
    fi
    if [ -x "$JIT_TEST" ]; then
      run_step test_cuda_jit 60 jit_test_step
    else
      record test_cuda_jit "not run" 0 "not built"
    fi
    run_step "ctest (the other tests)" 200 ctest_step
    CTEST_LINE=$(grep -a 'tests passed\|tests failed' "$BUILD/ctest.out" | tail -1)
  fi
else
  record test_cuda_backends "not run" 0 "build failed"
fi

# ---------------------------------------------------------------- moex bench
if ! want bench; then
  :
elif [ $BUILD_OK -eq 1 ] && [ -x "$MOEX" ]; then
  run_step "bench qwen3-30b-a3b" 120 bench_shape qwen3-30b-a3b "$QWEN_TOKENS"
  run_step "bench deepseek-v3" 180 bench_shape deepseek-v3 "$DEEPSEEK_TOKENS"
  run_step "bench warm cache (the peer's token counts)" 120 bench_warm
else
  record "moex bench" "not run" 0 "build failed"
fi

# ---------------------------------------------------------------- whole-model comparison
if ! want compare; then
  :
elif [ $BUILD_OK -eq 1 ] && python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
  run_step "generate compare (transformers)" 240 compare_step
else
  say "generate compare skipped: no build, or python3 without torch/transformers/CUDA"
  record "generate compare" skipped 0 "no torch"
fi

# ---------------------------------------------------------------- peer
if ! want peer; then
  :
elif [ -f "$PEER" ] && python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  PEER_CSV="$OUT/peer_transformers_${GPU_TAG}_${DATE}.csv" # plain, then compiled
  : >"$PEER_CSV"
  run_step "peer (plain)" 120 peer_run 0 qwen3-30b-a3b,deepseek-v3 "$PEER_CSV"
  if [ "$PEER_COMPILE" = 1 ]; then
    # max-autotune compiles are slow: each shape gets half of the time left (the second
    # also what the first left over); rows are written as they finish, so a timeout
    # still leaves the cases done so far. A process's output starts with its own
    # CEILING and header lines.
    n=2
    for shape in qwen3-30b-a3b deepseek-v3; do
      share=$(( ($(left) - RESERVE - MEMCHECK_RESERVE) / n ))
      n=$((n - 1))
      toks=$PEER_COMPILED_TOKENS_QWEN
      [ "$shape" = deepseek-v3 ] && toks=$PEER_COMPILED_TOKENS_DEEPSEEK
      run_step "peer compiled $shape (max-autotune-no-cudagraphs)" "$share" peer_run 1 "$shape" "$PEER_CSV" "$toks"
    done
  fi
else
  say "peer skipped: $PEER missing, or python3 without torch/transformers/CUDA"
  record peer skipped 0 "no peer"
fi

# ---------------------------------------------------------------- summary
# memcheck last: it is the slowest step, and it takes what the budget has left
if want memcheck && [ $BUILD_OK -eq 1 ] && [ -x "$TEST" ]; then
  SANITIZER=$(command -v compute-sanitizer || true)
  for d in "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")" /usr/local/cuda/bin; do
    [ -z "$SANITIZER" ] && [ -x "$d/compute-sanitizer" ] && SANITIZER="$d/compute-sanitizer"
  done
  export SANITIZER
  if [ -n "$SANITIZER" ]; then
    run_step "memcheck (quick)" 120 memcheck_step
    MEMCHECK_LINE=$(grep -a 'ERROR SUMMARY' "$BUILD/memcheck.out" | tail -1)
    if [ -x "$DECODER_TEST" ]; then
      run_step "memcheck decoder (quick)" 90 decoder_memcheck_step
      DECODER_MEMCHECK_LINE=$(grep -a 'ERROR SUMMARY' "$BUILD/memcheck_decoder.out" | tail -1)
    fi
  else
    say "compute-sanitizer not found: memcheck skipped"
    record "memcheck (quick)" skipped 0 "no compute-sanitizer"
  fi
fi

echo
say "summary"
printf '%-50s %-18s %6s\n' step status seconds
for s in "${STEPS[@]}"; do
  IFS='|' read -r n st sec note <<<"$s"
  printf '%-50s %-18s %6s %s\n' "$n" "$st" "$sec" "$note"
done
echo
echo "tests:    ${TEST_LINE:-none}"
echo "decoder:  ${DECODER_LINE:-none}"
echo "model:    ${MODEL_LINE:-none}"
echo "ctest:    ${CTEST_LINE:-none}"
echo "memcheck: ${MEMCHECK_LINE:-none}"
echo "memcheck decoder: ${DECODER_MEMCHECK_LINE:-none}"
for f in "$OUT"/moex_*_cuda_*.csv; do
  [ -f "$f" ] || continue
  echo
  echo "$(basename "$f"):"
  grep '^# ceiling' "$f"
  # shape,backend,device,dtype,experts,threads,tokens,graph,ms,gflops,weight_gbps,max_abs_err,gemm_frac,bw_frac,read_floor_ms,floor_frac
  awk -F, '!/^#/ && $1 != "shape" { printf "  %-13s %-11s graph=%s T=%-6s %10s ms  %8s GB/s  gemm_frac %-8s bw_frac %-8s floor_frac %s\n", $1, $2, $8, $7, $9, $11, $13, $14, $16 }' "$f"
done
for f in "$OUT"/peer_*.csv; do
  [ -f "$f" ] || continue
  echo
  echo "$(basename "$f"):"
  grep -v '^shape,' "$f" | sed 's/^/  /'
done
if [ -n "${PEER_CSV:-}" ] && [ -s "$PEER_CSV" ] && ls "$OUT"/moex_*_cuda_*.csv >/dev/null 2>&1; then
  echo
  echo "moex beside the peer (x = peer ms / moex ms):"
  python3 "$ROOT/scripts/peer_compare.py" "$OUT"/moex_*_cuda_*.csv --peer "$PEER_CSV" || true
fi
echo
echo "files in $OUT:"
ls -la "$OUT"
say "done in $(elapsed)s; $FAILED step(s) not ok"
[ "$FAILED" -eq 0 ]
