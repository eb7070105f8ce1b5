#!/usr/bin/env bash
# sonicmoe_peers.sh OUT_DIR — the sonicmoe backend beside grouped_mm and vLLM's bf16 fused_moe, in
# one run on a GPU machine: moex is built (scripts/gpu_suite.sh, build step only); with TESTS=1
# test_cuda_backends runs whole, then its sonicmoe test under compute-sanitizer memcheck; then
# `moex bench --dtype bf16 --backends grouped_mm,sonicmoe --graph on` on both shapes, the vLLM
# harness in bf16 at the same token counts, and scripts/sonicmoe_compare.py writes the table and
# the sonicmoe issue's checks to OUT_DIR/compare.txt.
#
# Environment: TESTS (0), TOKENS (512,4096,16384), VLLM_HARNESS (the vLLM script, beside its
# vllm_moe_configs/: peer-run/vllm_fused_moe_bench.py; skipped with a line when missing),
# MOEX_DEPS_DIR (cJSON sources, peer-run/deps).
set -uo pipefail
. "$(dirname "$0")/gpu_peers_lib.sh"
peers_start "$@"
TOKENS=${TOKENS:-512,4096,16384}
peers_build
if [ "${TESTS:-0}" = 1 ]; then
  say "test_cuda_backends"
  timeout 300 "$ROOT/build-gpu/tests/gpu/test_cuda_backends" >"$OUT/tests.txt" 2>&1
  say "test_cuda_backends exit $? ($(tail -1 "$OUT/tests.txt"))"
  grep -E "^\[FAIL\]|FAIL" "$OUT/tests.txt" | head -20
  say "compute-sanitizer memcheck, sonicmoe test (quick)"
  MOEX_GPU_TEST_ONLY=sonicmoe timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$ROOT/build-gpu/tests/gpu/test_cuda_backends" --quick >"$OUT/memcheck.txt" 2>&1
  say "memcheck exit $? ($(grep -E "ERROR SUMMARY" "$OUT/memcheck.txt" | tail -1))"
fi
for shape in qwen3-30b-a3b deepseek-v3; do
  say "moex bench $shape"
  "$ROOT/build-gpu/moex" bench --device cuda --shape "$shape" --dtype bf16 --tokens "$TOKENS" \
    --backends grouped_mm,sonicmoe --graph on --csv "$OUT/moex_$shape.csv" >/dev/null 2>"$WORK/moex_$shape.log" ||
    { tail -5 "$WORK/moex_$shape.log"; say "moex bench $shape failed"; }
done
peers_vllm "${VLLM_HARNESS:-$ROOT/peer-run/vllm_fused_moe_bench.py}" bf16 "$TOKENS"
python3 "$ROOT/scripts/sonicmoe_compare.py" "$OUT"/moex_*.csv "${VLLM_ARG[@]}" >"$OUT/compare.txt" && cat "$OUT/compare.txt"
rm -rf "$WORK"
say "done: $OUT"
