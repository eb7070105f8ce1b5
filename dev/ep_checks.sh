#!/usr/bin/env bash
# ep_checks.sh OUT_DIR — expert parallelism on this machine's GPUs in one call: the test programs
# (tests/gpu/test_cuda_ep, test_cuda_ep_forward with deepgemm_megamoe's pieces, test_cuda_model with
# its expert-parallel part, backend_ops' group of 3 through deepgemm_megamoe and grouped_mm), then
# test_cuda_ep_forward --quick under compute-sanitizer memcheck (--target-processes all), then
# `moex bench --ep 2` on deepseek-v3 (grouped_mm and deepgemm_megamoe beside one GPU; bf16 and FP8;
# 64 and 16384 tokens), the ranks on cuda:0 and cuda:1 when there are two GPUs, else both on cuda:0
# (a correctness run: they share the GPU). Files in OUT_DIR: tests.log, bench_ep_bf16.csv,
# bench_ep_fp8.csv, bench.log.
#
# Environment: EP_PREBUILT (a folder with moex, test_cuda_ep, test_cuda_ep_forward, test_cuda_model and
# backend_ops built for this GPU elsewhere, and in lib/ the shared libraries they need that this
# machine lacks), else built here (scripts/gpu_suite.sh's build step; MOEX_DEPS_DIR as there);
# EP_TOKENS (64,16384); EP_STEP_S (the limit of each test step, 300 s).
set -uo pipefail
. "$(dirname "$0")/gpu_peers_lib.sh"
peers_start "$@"
STEP_S=${EP_STEP_S:-300}
if [ -n "${EP_PREBUILT:-}" ]; then
  BIN=$EP_PREBUILT
  export LD_LIBRARY_PATH="$EP_PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  peers_build
  BIN=$ROOT/build-gpu
fi
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
DEVS=cuda:0
[ "$ngpu" -ge 2 ] && DEVS=cuda:0,1
say "$ngpu GPU(s); the ranks on $DEVS" | tee "$OUT/tests.log"
step() { # name, command...
  local name=$1 t0=$SECONDS rc
  shift
  say "$name" >>"$OUT/tests.log"
  timeout "$STEP_S" "$@" >>"$OUT/tests.log" 2>&1
  rc=$?
  say "$name: exit $rc in $((SECONDS - t0)) s" | tee -a "$OUT/tests.log"
}
step test_cuda_ep "$BIN/test_cuda_ep"
step test_cuda_ep_forward "$BIN/test_cuda_ep_forward"
step "backend_ops deepgemm_megamoe" "$BIN/backend_ops" -b deepgemm_megamoe
step "backend_ops grouped_mm" "$BIN/backend_ops" -b grouped_mm
step test_cuda_model "$BIN/test_cuda_model"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$SAN" ] && step "memcheck test_cuda_ep_forward --quick" "$SAN" --tool memcheck --target-processes all \
  --error-exitcode 3 "$BIN/test_cuda_ep_forward" --quick
grep -E "FAIL|checks, [1-9][0-9]* failed|passed /|exit [0-9]+ in" "$OUT/tests.log" | tail -40
for dt in bf16 fp8; do
  say "moex bench --ep 2 deepseek-v3 $dt"
  "$BIN/moex" bench --ep 2 --device "$DEVS" --shape deepseek-v3 --dtype "$dt" --tokens "${EP_TOKENS:-64,16384}" \
    --backends grouped_mm,deepgemm_megamoe --runs 10 --csv "$OUT/bench_ep_$dt.csv" 2>>"$OUT/bench.log" |
    tee -a "$OUT/bench.log"
done
rm -rf "$WORK"
say "done: $OUT"
