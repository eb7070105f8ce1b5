#!/usr/bin/env bash
# deepgemm_peers.sh OUT_DIR — the deepgemm backend beside grouped_mm, DeepGEMM's GEMMs and vLLM's
# FP8 fused_moe, in one run on a GPU machine: moex is built (scripts/gpu_suite.sh, build step
# only), `moex bench --backends grouped_mm,deepgemm --graph on` runs at 1-16384 tokens on both
# shapes in bf16 and FP8, then DeepGEMM's GEMMs (dev/peer/deepgemm/deepgemm_bench.py without its
# slow whole-layer rows) and the vLLM harness, and scripts/deepgemm_compare.py writes the table
# and the deepgemm issue's checks to OUT_DIR/compare.txt.
#
# Environment: DG_PAYLOAD_DIR (the DeepGEMM package, peer-run/deepgemm), VLLM_HARNESS (the vLLM
# script, beside its vllm_moe_configs/: peer-run/vllm_fused_moe_bench.py), DG_BUDGET_S (105),
# TOKENS (1,8,64,512,4096,16384), MOEX_DEPS_DIR (cJSON sources, peer-run/deps). A peer that is
# missing is skipped with a line saying so.
set -uo pipefail
. "$(dirname "$0")/gpu_peers_lib.sh"
peers_start "$@"
TOKENS=${TOKENS:-1,8,64,512,4096,16384}
DG=${DG_PAYLOAD_DIR:-$ROOT/peer-run/deepgemm}
peers_build
for shape in qwen3-30b-a3b deepseek-v3; do
  say "moex bench $shape"
  "$ROOT/build-gpu/moex" bench --device cuda --shape "$shape" --dtype bf16,fp8 --tokens "$TOKENS" \
    --backends grouped_mm,deepgemm --graph on --csv "$OUT/moex_$shape.csv" >/dev/null 2>"$OUT/moex_$shape.log" ||
    say "moex bench $shape failed (see moex_$shape.log)"
done
if [ -f "$DG/deepgemm-pkg.tar.xz" ]; then
  say "DeepGEMM's GEMMs"
  sed -e 's/^T_LAYER = .*/T_LAYER = []/' "$ROOT/dev/peer/deepgemm/deepgemm_bench.py" >"$WORK/dg_gemms.py"
  DG_PAYLOAD_DIR="$DG" DG_MASKED_EXPECTED_M=sglang BUDGET_S=${DG_BUDGET_S:-105} python3 "$WORK/dg_gemms.py" \
    >"$OUT/peer_deepgemm.csv" 2>"$OUT/peer_deepgemm.log" || say "the DeepGEMM peer failed (see peer_deepgemm.log)"
else
  say "no DeepGEMM package in $DG: its rows are skipped"
fi
peers_vllm "${VLLM_HARNESS:-$ROOT/peer-run/vllm_fused_moe_bench.py}" fp8 "$TOKENS"
if [ -s "$OUT/peer_deepgemm.csv" ]; then
  python3 "$ROOT/scripts/deepgemm_compare.py" "$OUT"/moex_*.csv --deepgemm "$OUT/peer_deepgemm.csv" "${VLLM_ARG[@]}" \
    >"$OUT/compare.txt" && tail -3 "$OUT/compare.txt"
fi
rm -rf "$WORK"
say "done: $OUT"
