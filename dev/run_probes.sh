#!/usr/bin/env bash
# run_probes.sh OUT_DIR [PROBE ...] — build the diagnostics of bench/probes/ and run them on the
# GPU, each into OUT_DIR/PROBE.csv behind two comment lines (the probe's source, whose header says
# what each column measures; the GPU's name and power limit), the form of
# bench/results/*-probe.csv; what a probe prints on stderr follows its rows as comment lines.
# PROBE: read_floor, stream_read, tma_read, tile_feed, decode_wgmma (default: tma_read and tile_feed). Each run is
# limited to PROBE_S seconds (120). Builds into build-probes/ (BUILD_DIR), CUDA for sm_90a.
# MOEX_DEPS_DIR: cJSON sources where the machine has no cJSON package (peer-run/deps).
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [PROBE ...]" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" && OUT=$(cd "$1" && pwd) || exit 2
shift
probes=("$@")
[ ${#probes[@]} -gt 0 ] || probes=(tma_read tile_feed)
for p in "${probes[@]}"; do
  [ -f "$ROOT/bench/probes/$p.cu" ] || { echo "no probe bench/probes/$p.cu" >&2; exit 2; }
done
BUILD=${BUILD_DIR:-$ROOT/build-probes}
deps=()
[ -n "${MOEX_DEPS_DIR:-}" ] && deps=(-DMOEX_CJSON_SOURCE_DIR="$MOEX_DEPS_DIR/cJSON")
targets=()
for p in "${probes[@]}"; do targets+=("${p}_probe"); done
if ! { cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
         -DMOEX_OPENBLAS=OFF -DMOEX_BUILD_TESTS=OFF "${deps[@]}" &&
       cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]}"; } >"$OUT/probes_build.log" 2>&1; then
  tail -20 "$OUT/probes_build.log" >&2
  echo "building the probes failed (log: $OUT/probes_build.log)" >&2
  exit 1
fi
gpu=$(nvidia-smi --query-gpu=name,power.limit --format=csv,noheader 2>/dev/null | head -1)
status=0
for p in "${probes[@]}"; do
  printf '# bench/probes/%s.cu (its header says what each column measures)\n# %s\n' "$p" "${gpu:-GPU unknown}" \
    >"$OUT/$p.csv"
  timeout --kill-after=10 "${PROBE_S:-120}" "$BUILD/${p}_probe" >>"$OUT/$p.csv" 2>"$OUT/$p.err"
  rc=$?
  sed 's/^/# /' "$OUT/$p.err" >>"$OUT/$p.csv"
  if [ $rc -eq 0 ]; then
    echo "$p: $(grep -vc '^#' "$OUT/$p.csv") lines into $OUT/$p.csv"
  else
    echo "$p failed (exit $rc):" >&2
    tail -5 "$OUT/$p.err" >&2
    status=1
  fi
  rm -f "$OUT/$p.err"
done
exit $status
