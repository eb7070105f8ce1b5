#!/usr/bin/env bash
# ab_bench.sh OLD OUT_DIR [TREE ...] — time an older moex against this one on the GPU,
# interleaved, in one run: every tree is built (Release, CUDA), then AB_ROUNDS rounds each run
# `moex bench` of every tree in turn (the order rotates between rounds) at the same cases, and
# dev/ab_compare.py writes one CSV with the median of each case per tree and its ratio to old.
#
# OLD and each TREE are either a source tree (a folder, e.g. from `git archive`; a TREE is named
# by its folder's name) or NAME=PATCH[+PATCH...][:CUDA_FLAGS]: a copy of this tree with the
# patches applied in order (paths relative to this tree; a leading '-' reverses one, e.g.
# main=-dev/variants/x.patch is this tree without x), built with the extra nvcc flags if given
# (a dev/variants/ diagnostic's -D switches). Names: letters, digits and '-'. OLD "." is this
# tree itself: then there is no separate "new" tree, and the variants' ratios are to this one.
# Patched copies live in AB_TREES_DIR/NAME and are kept there: a later run with the same
# AB_TREES_DIR reuses a copy (and its build) instead of making it again.
#
# Environment: AB_ROUNDS (2), AB_RUNS (--runs, 10), AB_SHAPES ("qwen3-30b-a3b deepseek-v3"),
# AB_QWEN_TOKENS (1,64,16384), AB_DEEPSEEK_TOKENS (64,16384), AB_BACKENDS (batched_mm,grouped_mm),
# AB_DTYPES (bf16; a list such as bf16,fp8 runs each binary once per dtype, in one moex bench),
# AB_GRAPH (moex bench's --graph: both, on or off; both), AB_SKEW (moex bench's --skew: uneven
# routings; none), AB_OLD_LABEL and AB_NEW_LABEL (what
# the CSV calls the two trees, e.g. their commits), AB_TREES_DIR (where patched copies go; a
# temporary folder), AB_BUILD_ONLY (1: build every tree and stop), AB_TEST_TREES (tags whose
# tests/gpu/test_cuda_backends runs after the build, before the rounds, into OUT_DIR/tests.txt;
# AB_TEST_ONLY is its MOEX_GPU_TEST_ONLY, AB_TEST_TIMEOUT_S its limit, 200; a tree whose tests
# fail or time out is left out of the rounds), AB_VLLM (the vLLM harness, beside its
# vllm_moe_configs/: run after each round's moex runs at the same shapes, token counts and
# dtypes, into OUT_DIR/peer_vllm_rN.csv; AB_VLLM_ROUNDS: in the first that many rounds only),
# AB_KEEP_RAW (a tree's tag: its rounds' moex bench CSVs kept in OUT_DIR, one file a shape),
# AB_BENCH_TIMEOUT_S (240: one moex bench run, one tree and shape, is killed after it and
# reported FAILED, so that a variant that hangs does not take the call; a tree that timed out
# is left out of the later rounds),
# AB_BUDGET_S (seconds from the script's start: a round, after the first, starts only if the
# slowest round so far fits in what is left, so that a device call's limit never takes the
# rounds already timed; the files are then written from the rounds that ran; the comparison CSV
# is also rewritten after every round, so a run killed part-way keeps the rounds it finished),
# MOEX_DEPS_DIR (cJSON sources for every build,
# peer-run/deps). Each tree is built by its own scripts/gpu_suite.sh with SUITE_STEPS=none, all
# at once.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OLD OUT_DIR [TREE ...]" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD_ARG=$1
mkdir -p "$2" && OUT=$(cd "$2" && pwd) || exit 2
shift 2
export MOEX_DEPS_DIR=${MOEX_DEPS_DIR:-$ROOT/peer-run/deps}
WORK=$(mktemp -d)
START_S=$(date +%s)
TREES_DIR=${AB_TREES_DIR:-$WORK/trees}
mkdir -p "$TREES_DIR" && TREES_DIR=$(cd "$TREES_DIR" && pwd) || exit 2
say() { echo "[$(date -u +%H:%M:%S)] $*"; }

# patched_tree NAME SPEC: the copy of this tree with SPEC's patches (made once), on stdout
patched_tree() {
  local dir=$TREES_DIR/$1 patches=${2%%:*} p rev
  if [ ! -f "$dir/.ab_patched" ]; then
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    tar -C "$ROOT" --exclude='./build*' --exclude=./peer-run --exclude=./.git -cf - . | tar -C "$dir" -xf - || return 1
    IFS=+ read -ra list <<<"$patches"
    for p in "${list[@]}"; do
      [ -z "$p" ] && continue
      rev=()
      case "$p" in -*) rev=(-R); p=${p#-} ;; esac
      if command -v patch >/dev/null 2>&1; then
        patch -s -p1 "${rev[@]}" -d "$dir" <"$ROOT/$p" >&2
      else
        (cd "$dir" && git apply "${rev[@]}" "$ROOT/$p") >&2
      fi || { echo "patch ${rev[*]} $p failed" >&2; return 1; }
    done
    : >"$dir/.ab_patched"
  fi
  echo "$dir"
}

TAGS=()
declare -A TREE FLAGS
add_tree() { # tag dir [cuda flags]
  case " ${TAGS[*]} " in *" $1 "*) echo "two trees named $1" >&2; exit 2 ;; esac
  TAGS+=("$1")
  TREE[$1]=$2
  FLAGS[$1]=${3:-}
}
# tree_arg TAG ARG: a folder, or NAME=SPEC (TAG empty: the NAME's)
tree_arg() {
  local tag=$1 arg=$2 name spec dir flags=
  if [[ $arg == *=* ]]; then
    name=${arg%%=*} spec=${arg#*=}
    [[ $name =~ ^[A-Za-z0-9-]+$ ]] || { echo "bad tree name '$name'" >&2; exit 2; }
    [[ $spec == *:* ]] && flags=${spec#*:}
    dir=$(patched_tree "$name" "$spec") || { say "could not make tree $name"; exit 1; }
    add_tree "${tag:-$name}" "$dir" "$flags"
  else
    dir=$(cd "$arg" && pwd) || exit 2
    add_tree "${tag:-$(basename "$dir" | tr -c 'A-Za-z0-9\n-' '-')}" "$dir"
  fi
}
if [ "$OLD_ARG" = . ]; then
  add_tree old "$ROOT"
else
  tree_arg old "$OLD_ARG"
  add_tree new "$ROOT"
fi
for t in "$@"; do tree_arg "" "$t"; done
ROUNDS=${AB_ROUNDS:-2}
RUNS=${AB_RUNS:-10}
QWEN_TOKENS=${AB_QWEN_TOKENS:-1,64,16384}
DEEPSEEK_TOKENS=${AB_DEEPSEEK_TOKENS:-64,16384}
BACKENDS=${AB_BACKENDS:-batched_mm,grouped_mm}
DTYPES=${AB_DTYPES:-bf16}
SHAPES=${AB_SHAPES:-qwen3-30b-a3b deepseek-v3}
tokens_of() { if [ "$1" = deepseek-v3 ]; then echo "$DEEPSEEK_TOKENS"; else echo "$QWEN_TOKENS"; fi; }

say "building ${TAGS[*]} (all at once)"
for tag in "${TAGS[@]}"; do
  ( cd "${TREE[$tag]}" && BUILD_DIR=build-gpu SUITE_STEPS=none SUITE_BUDGET_S=400 SUITE_CUDA_FLAGS="${FLAGS[$tag]}" \
      bash scripts/gpu_suite.sh "$WORK/$tag-build" ) >"$WORK/$tag-build.log" 2>&1 ||
    { tail -30 "$WORK/$tag-build.log"; say "$tag build failed"; } &
done
wait
for tag in "${TAGS[@]}"; do
  [ -x "${TREE[$tag]}/build-gpu/moex" ] || { say "missing ${TREE[$tag]}/build-gpu/moex"; exit 1; }
done
say "built"
[ "${AB_BUILD_ONLY:-0}" = 1 ] && exit 0

# drop_tag TAG WHY: TAG leaves the rounds (its CSVs so far stay)
drop_tag() {
  local kept=() t
  for t in "${TAGS[@]}"; do [ "$t" = "$1" ] || kept+=("$t"); done
  TAGS=("${kept[@]}")
  say "$1 left out of the rounds: $2"
}
IFS=, read -ra test_tags <<<"${AB_TEST_TREES:-}"
for tag in "${test_tags[@]}"; do
  [ -n "${TREE[$tag]:-}" ] || { say "AB_TEST_TREES: no tree $tag"; continue; }
  say "test_cuda_backends of $tag${AB_TEST_ONLY:+ ($AB_TEST_ONLY)}"
  { echo "== $tag"; MOEX_GPU_TEST_ONLY=${AB_TEST_ONLY:-} timeout --kill-after=10 "${AB_TEST_TIMEOUT_S:-200}" \
      "${TREE[$tag]}/build-gpu/tests/gpu/test_cuda_backends"
    echo "exit $?"; } >>"$OUT/tests.txt" 2>&1
  say "$tag: $(grep -a '^test_cuda_backends:' "$OUT/tests.txt" | tail -1) ($(tail -1 "$OUT/tests.txt"))"
  [ "$(tail -1 "$OUT/tests.txt")" = "exit 0" ] || drop_tag "$tag" "its tests failed"
done

bench() { # binary shape tokens csv (a hung tree is killed after AB_BENCH_TIMEOUT_S and reported)
  timeout --kill-after=10 "${AB_BENCH_TIMEOUT_S:-240}" "$1" bench --device cuda --shape "$2" --tokens "$3" --dtype "$DTYPES" --backends "$BACKENDS" --graph "${AB_GRAPH:-both}" \
    --backend-max-tokens batched_mm=512 --runs "$RUNS" --reference off ${AB_SKEW:+--skew "$AB_SKEW"} --csv "$4" >/dev/null
}
GPU_TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z' 'a-z' |
  sed 's/nvidia//; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
CSV="$OUT/$(date -u +%Y-%m-%d)_cuda-${GPU_TAG:-gpu}_old-vs-new-main.csv"
# compare: the CSV from the rounds so far (after every round, so that a run killed by a device
# call's limit keeps the rounds it finished)
compare() {
  python3 "$ROOT/dev/ab_compare.py" "$WORK" "$CSV" --old "${AB_OLD_LABEL:-old}" --new "${AB_NEW_LABEL:-new}"
}
n=${#TAGS[@]}
slowest=0
for r in $(seq 1 "$ROUNDS"); do
  round_start=$(date +%s)
  if [ -n "${AB_BUDGET_S:-}" ] && [ "$r" -gt 1 ] && [ $((round_start - START_S + slowest)) -gt "$AB_BUDGET_S" ]; then
    say "AB_BUDGET_S=$AB_BUDGET_S: round $r would end past it (the slowest round took ${slowest} s); stopping after $((r - 1))"
    break
  fi
  # the order rotates one place a round (two trees alternate)
  order=()
  for i in $(seq 0 $((n - 1))); do order+=("${TAGS[$(( (i + r - 1) % n ))]}"); done
  for tag in "${order[@]}"; do
    bin=${TREE[$tag]}/build-gpu/moex
    for shape in $SHAPES; do
      say "round $r: $tag $shape at $(tokens_of "$shape") tokens"
      bench "$bin" "$shape" "$(tokens_of "$shape")" "$WORK/${tag}_${shape}_r${r}.csv" ||
        { rc=$?; say "FAILED: $tag $shape round $r (exit $rc)"; [ "$rc" -ge 124 ] && { drop_tag "$tag" "it hung"; break; }; }
    done
  done
  n=${#TAGS[@]}
  if [ -n "${AB_VLLM:-}" ] && [ "$r" -le "${AB_VLLM_ROUNDS:-$ROUNDS}" ]; then
    if [ -f "$AB_VLLM" ]; then
      for shape in $SHAPES; do
        say "round $r: vLLM $shape at $(tokens_of "$shape") tokens"
        ( cd "$(dirname "$AB_VLLM")" && DTYPES=$DTYPES SHAPES=$shape TOKENS=$(tokens_of "$shape") python3 "$AB_VLLM" ) \
          >>"$OUT/peer_vllm_r$r.csv" 2>"$WORK/vllm.log" || { tail -5 "$WORK/vllm.log"; say "the vLLM peer failed"; }
      done
    else
      say "no vLLM harness at $AB_VLLM: its rows are skipped"
    fi
  fi
  took=$(($(date +%s) - round_start))
  [ "$took" -gt "$slowest" ] && slowest=$took
  [ "$r" -lt "$ROUNDS" ] && compare >/dev/null
done
# AB_KEEP_RAW=TAG: that tree's moex bench CSVs of every round, one file a shape (TAG_SHAPE.csv in OUT_DIR)
if [ -n "${AB_KEEP_RAW:-}" ]; then
  for shape in $SHAPES; do
    cat "$WORK/${AB_KEEP_RAW}_${shape}"_r*.csv >"$OUT/${AB_KEEP_RAW}_${shape}.csv" 2>/dev/null || say "no CSV of $AB_KEEP_RAW $shape"
  done
fi
compare
