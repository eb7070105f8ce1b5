#!/usr/bin/env bash
# vllm_peers.sh OUT_DIR — moex's bf16 and FP8 experts layer beside vLLM's Triton fused_moe, in one run
# on a GPU machine, with the checks of the bf16 and GPU quantization issues: moex is built
# (scripts/gpu_suite.sh, build step only), `moex bench --graph on` runs both shapes in bf16 and FP8
# (batched_mm to 512 tokens, grouped_mm, sonicmoe in bf16) and deepseek-v3 in FP4 at 1 token
# (batched_mm and grouped_mm: the FP4-against-bf16 check), then the vLLM harness in bf16 and FP8 at the same token counts, and
# scripts/bf16_compare.py and scripts/fp8_compare.py write their tables and checks to
# OUT_DIR/compare.txt. Seven files in OUT_DIR: moex_<shape>.csv, moex_fp4.csv, peer_vllm.csv,
# compare.txt, and the runs' logs (moex.log, vllm.log).
#
# Environment: VLLM_HARNESS (the vLLM script, beside its vllm_moe_configs/:
# peer-run/vllm_fused_moe_bench.py), TOKENS (1,8,64,512,4096,16384), MOEX_PREBUILT (peers_build in
# gpu_peers_lib.sh: a moex built elsewhere instead of building), MOEX_DEPS_DIR (cJSON sources,
# peer-run/deps). Without the harness the vLLM rows are skipped and the checks report "no row".
set -uo pipefail
. "$(dirname "$0")/gpu_peers_lib.sh"
peers_start "$@"
TOKENS=${TOKENS:-1,8,64,512,4096,16384}
peers_build
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
for shape in qwen3-30b-a3b deepseek-v3; do
  say "moex bench $shape"
  "$ROOT/build-gpu/moex" bench --device cuda --shape "$shape" --dtype bf16,fp8 --tokens "$TOKENS" \
    --backends batched_mm,grouped_mm,sonicmoe --backend-max-tokens batched_mm=512 --graph on --csv "$OUT/moex_$shape.csv" \
    >/dev/null 2>>"$OUT/moex.log" || say "moex bench $shape failed (see moex.log)"
done
say "moex bench deepseek-v3 fp4 at 1 token"
"$ROOT/build-gpu/moex" bench --device cuda --shape deepseek-v3 --dtype fp4 --tokens 1 \
  --backends batched_mm,grouped_mm --graph on --csv "$OUT/moex_fp4.csv" >/dev/null 2>>"$OUT/moex.log" ||
  say "moex bench fp4 failed (see moex.log)"
peers_vllm "${VLLM_HARNESS:-$ROOT/peer-run/vllm_fused_moe_bench.py}" bf16,fp8 "$TOKENS"
cp "$WORK/vllm.log" "$OUT/vllm.log" 2>/dev/null
{
  python3 "$ROOT/scripts/bf16_compare.py" "$OUT"/moex_qwen3-30b-a3b.csv "$OUT"/moex_deepseek-v3.csv "${VLLM_ARG[@]}"
  echo
  python3 "$ROOT/scripts/fp8_compare.py" "$OUT"/moex_*.csv "${VLLM_ARG[@]}"
} >"$OUT/compare.txt" 2>&1
grep -i "met" "$OUT/compare.txt" | tail -30
rm -rf "$WORK"
say "done: $OUT"
