#!/usr/bin/env bash
# batch_logits_spread.sh OUT_DIR CHECKPOINT PROMPT_FILE NAME=MOEX [NAME=MOEX ...] — how far an
# order-of-sums change moves a checkpoint's last-prompt logits, to judge whether two builds'
# difference is more than that: each build runs the prompt alone and the same prompt twice in
# one batch (other GEMM shapes: the same sums in another order), bf16 compute on the GPU, one
# new token; then prints, into OUT_DIR/spread.txt, each build's alone-vs-batched distance, the
# batch's two copies' distance, and every build's distance to the first one (prompt alone).
# PROMPT_FILE: comma-separated ids (`scripts/tf_model_speed.py OUT --shape S --checkpoint-only`
# writes a random checkpoint of a model's real sizes and OUT/prompt.txt). SPREAD_DEVICE=cpu runs
# the builds on the CPU instead (to check the script). Needs python3 (no torch).
set -uo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 OUT_DIR CHECKPOINT PROMPT_FILE NAME=MOEX [NAME=MOEX ...]" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
CKPT=$2
P=$(cat "$3") || exit 2
shift 3
names=()
for spec in "$@"; do
  name=${spec%%=*} bin=${spec#*=}
  names+=("$name")
  "$bin" generate "$CKPT" --prompt-ids "$P" --max-new-tokens 1 --device "${SPREAD_DEVICE:-cuda}" --dtype bf16 --ignore-eos --json \
    --logits >"$OUT/$name-1.json" 2>"$OUT/$name-1.err" || { echo "$name: one prompt failed" >&2; exit 1; }
  "$bin" generate "$CKPT" --prompt-ids "$P" --prompt-ids "$P" --max-new-tokens 1 --device "${SPREAD_DEVICE:-cuda}" --dtype bf16 \
    --ignore-eos --json --logits >"$OUT/$name-2.json" 2>"$OUT/$name-2.err" || { echo "$name: two prompts failed" >&2; exit 1; }
done
python3 - "$OUT" "${names[@]}" <<'PY' | tee "$OUT/spread.txt"
import json, sys
out, names = sys.argv[1], sys.argv[2:]
def logits(name, n, i):
    text = open("%s/%s-%d.json" % (out, name, n)).read()
    return json.loads(text[text.index("{"):])["last_prompt_logits"][i]
def dist(a, b):
    d = [abs(x - y) for x, y in zip(a, b)]
    return "max |diff| %.4g, mean %.4g" % (max(d), sum(d) / len(d))
for name in names:
    print("%-12s alone vs batched: %s" % (name, dist(logits(name, 1, 0), logits(name, 2, 0))))
    print("%-12s the batch's two copies: %s" % (name, dist(logits(name, 2, 0), logits(name, 2, 1))))
for name in names[1:]:
    print("%-12s vs %s (alone): %s" % (name, names[0], dist(logits(name, 1, 0), logits(names[0], 1, 0))))
PY
