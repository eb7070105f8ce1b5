# gpu_peers_lib.sh — sourced by dev/deepgemm_peers.sh and dev/sonicmoe_peers.sh: their one
# argument, the work folder, moex's build and the vLLM harness's run.

say() { echo "[$(date -u +%H:%M:%S)] $*"; }

# peers_start "$@": OUT (the one argument, made), ROOT (the tree), WORK (a temporary folder),
# MOEX_DEPS_DIR (cJSON sources; peer-run/deps unless set); exit 2 on a bad call.
peers_start() {
  if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
  fi
  ROOT=$(cd "$(dirname "$0")/.." && pwd)
  mkdir -p "$1" && OUT=$(cd "$1" && pwd) || exit 2
  export MOEX_DEPS_DIR=${MOEX_DEPS_DIR:-$ROOT/peer-run/deps}
  WORK=$(mktemp -d)
}

# peers_build: moex with CUDA in build-gpu/ (scripts/gpu_suite.sh's build step), or exit 1; with
# MOEX_PREBUILT (a folder holding a moex built for this GPU elsewhere) that binary is copied there
# instead; the shared libraries it was linked with that the GPU machine lacks (cJSON, utf8proc,
# PCRE2, libgomp: `ldd moex` on the machine that built it) go in MOEX_PREBUILT/lib, which is put on
# LD_LIBRARY_PATH.
peers_build() {
  if [ -n "${MOEX_PREBUILT:-}" ]; then
    say "moex from $MOEX_PREBUILT"
    export LD_LIBRARY_PATH="$MOEX_PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    mkdir -p "$ROOT/build-gpu" && cp "$MOEX_PREBUILT/moex" "$ROOT/build-gpu/moex" || exit 1
    return
  fi
  say "building moex"
  ( cd "$ROOT" && BUILD_DIR=build-gpu SUITE_STEPS=none bash scripts/gpu_suite.sh "$WORK/build" ) >"$WORK/build.log" 2>&1 ||
    { tail -30 "$WORK/build.log"; say "build failed"; exit 1; }
}

# peers_vllm HARNESS DTYPES TOKENS: the vLLM harness (beside its vllm_moe_configs/) on both shapes
# into $OUT/peer_vllm.csv, and VLLM_ARG set to the compare scripts' --vllm argument; a missing
# harness is skipped with a line saying so (VLLM_ARG empty).
peers_vllm() {
  VLLM_ARG=()
  if [ ! -f "$1" ]; then
    say "no vLLM harness at $1: its rows are skipped"
    return
  fi
  say "vLLM's $2 fused_moe"
  ( cd "$(dirname "$1")" && DTYPES=$2 SHAPES=qwen3-30b-a3b,deepseek-v3 TOKENS="$3" python3 "$1" ) \
    >"$OUT/peer_vllm.csv" 2>"$WORK/vllm.log" || { tail -5 "$WORK/vllm.log"; say "the vLLM peer failed"; }
  VLLM_ARG=(--vllm "$OUT/peer_vllm.csv")
}
