#!/usr/bin/env bash
# ab_bench.sh OLD_TREE OUT_DIR [TREE ...] — time an older moex (a source tree, e.g. from
# `git archive`) against this one on the GPU, interleaved, in one run: both are built (Release,
# CUDA), then AB_ROUNDS rounds each run `moex bench` of the old and the new binary in turn (the
# order alternates between rounds) at the same cases, and dev/ab_compare.py writes one CSV with
# the median of each case per binary and their ratio. Further TREEs (variants) are built and
# benched in the same rounds (the order rotates), each named by its folder's name (letters,
# digits and '-'), with its own ratio to the old tree.
#
# Environment: AB_ROUNDS (2), AB_RUNS (--runs, 10), AB_SHAPES ("qwen3-30b-a3b deepseek-v3"),
# AB_QWEN_TOKENS (1,64,16384),
# AB_DEEPSEEK_TOKENS (64,16384), AB_BACKENDS (batched_mm,grouped_mm), AB_DTYPES (bf16; a list
# such as bf16,fp8 runs each binary once per dtype, in one moex bench), AB_GRAPH (moex bench's
# --graph: both, on or off; both), AB_OLD_LABEL and AB_NEW_LABEL (what the CSV calls the two
# trees, e.g. their commits: a copy of a tree may not carry its git history), MOEX_DEPS_DIR
# (cJSON sources for every build, peer-run/deps).
# Each tree is built by its own scripts/gpu_suite.sh with SUITE_STEPS=none, all at once.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OLD_TREE OUT_DIR [TREE ...]" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" && OUT=$(cd "$2" && pwd) || exit 2
shift 2
TAGS=(old new)
declare -A TREE=([old]=$OLD [new]=$ROOT)
for t in "$@"; do
  dir=$(cd "$t" && pwd) || exit 2
  tag=$(basename "$dir" | tr -c 'A-Za-z0-9\n-' '-')
  case " ${TAGS[*]} " in *" $tag "*) echo "two trees named $tag" >&2; exit 2 ;; esac
  TAGS+=("$tag")
  TREE[$tag]=$dir
done
ROUNDS=${AB_ROUNDS:-2}
RUNS=${AB_RUNS:-10}
QWEN_TOKENS=${AB_QWEN_TOKENS:-1,64,16384}
DEEPSEEK_TOKENS=${AB_DEEPSEEK_TOKENS:-64,16384}
BACKENDS=${AB_BACKENDS:-batched_mm,grouped_mm}
export MOEX_DEPS_DIR=${MOEX_DEPS_DIR:-$ROOT/peer-run/deps}
WORK=$(mktemp -d)
say() { echo "[$(date -u +%H:%M:%S)] $*"; }

say "building ${TAGS[*]} (all at once)"
for tag in "${TAGS[@]}"; do
  ( cd "${TREE[$tag]}" && BUILD_DIR=build-gpu SUITE_STEPS=none SUITE_BUDGET_S=400 bash scripts/gpu_suite.sh "$WORK/$tag-build" ) \
    >"$WORK/$tag-build.log" 2>&1 || { tail -30 "$WORK/$tag-build.log"; say "$tag build failed"; } &
done
wait
for tag in "${TAGS[@]}"; do
  [ -x "${TREE[$tag]}/build-gpu/moex" ] || { say "missing ${TREE[$tag]}/build-gpu/moex"; exit 1; }
done
say "built"

bench() { # binary shape tokens csv
  "$1" bench --device cuda --shape "$2" --tokens "$3" --dtype "${AB_DTYPES:-bf16}" --backends "$BACKENDS" --graph "${AB_GRAPH:-both}" \
    --backend-max-tokens batched_mm=512 --runs "$RUNS" --reference off --csv "$4" >/dev/null
}
n=${#TAGS[@]}
for r in $(seq 1 "$ROUNDS"); do
  # the order rotates one place a round (two trees alternate)
  order=()
  for i in $(seq 0 $((n - 1))); do order+=("${TAGS[$(( (i + r - 1) % n ))]}"); done
  for tag in "${order[@]}"; do
    bin=${TREE[$tag]}/build-gpu/moex
    for shape in ${AB_SHAPES:-qwen3-30b-a3b deepseek-v3}; do
      toks=$QWEN_TOKENS
      [ "$shape" = deepseek-v3 ] && toks=$DEEPSEEK_TOKENS
      say "round $r: $tag $shape at $toks tokens"
      bench "$bin" "$shape" "$toks" "$WORK/${tag}_${shape}_r${r}.csv" || say "FAILED: $tag $shape round $r"
    done
  done
done
GPU_TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z' 'a-z' |
  sed 's/nvidia//; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
python3 "$ROOT/dev/ab_compare.py" "$WORK" "$OUT/$(date -u +%Y-%m-%d)_cuda-${GPU_TAG:-gpu}_old-vs-new-main.csv" \
  --old "${AB_OLD_LABEL:-old}" --new "${AB_NEW_LABEL:-new}"
