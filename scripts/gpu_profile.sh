#!/usr/bin/env bash
# gpu_profile.sh OUT_DIR — where the time of the CUDA backends goes, kernel by kernel: runs
# `moex bench --device cuda` under Nsight Compute (ncu) for a few cases and summarises each
# kernel's duration and the throughputs that bound it (dev/notes/cuda-notes.md keeps the results).
#
# Needs build-gpu/moex (scripts/gpu_suite.sh builds it; SUITE_STEPS=none only builds) and
# ncu (on PATH, or in the CUDA toolkit's or Nsight Compute's usual places). Writes, in OUT_DIR:
#   profile_<case>.csv  ncu's raw page as CSV (a row per profiled launch, every metric of the
#                       sections SpeedOfLight, ComputeWorkloadAnalysis, MemoryWorkloadAnalysis
#                       and WarpStateStats; line 2 has the units)
#   profile.txt         per case and kernel (largest total first): launches, median and total
#                       duration, SM clock, SM / L2 / DRAM
#                       throughput and the busiest tensor pipe (% of peak), and the three
#                       largest warp stall reasons (cycles per issued instruction)
#   profile.log         what ran
# Every case is time-limited (PROFILE_CASE_S, 150 s), so one slow case cannot take the run.
#
# Environment: PROFILE_CASES  shape:tokens:backend[:dtype],... (dtype: bf16 unless named, e.g.
#                                qwen3-30b-a3b:512:grouped_mm:fp8; default qwen3-30b-a3b:16384:grouped_mm,
#              deepseek-v3:16384:grouped_mm,deepseek-v3:64:grouped_mm,qwen3-30b-a3b:1:batched_mm)
#              PROFILE_LAUNCHES  most kernel launches profiled per case (200: all of them;
#                                the medians per kernel take in the two warm-up forwards)
#              BUILD_DIR (build-gpu)
#              PROFILE_GENERATE  CHECKPOINT:PROMPT_FILE instead of the bench cases: every kernel of
#                                `moex generate CHECKPOINT --prompt-ids <the file's ids> --max-new-tokens 1
#                                --device cuda --dtype bf16` (the load's kernels too: their names tell
#                                them apart), durations only (one pass a kernel, so a model's
#                                hundreds of launches take seconds), into profile_generate.csv;
#                                PROFILE_GENERATE_FLAGS: more generate options (e.g. --dequantize)
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
cd "$ROOT" || exit 2
BUILD=${BUILD_DIR:-build-gpu}
CASES=${PROFILE_CASES:-qwen3-30b-a3b:16384:grouped_mm,deepseek-v3:16384:grouped_mm,deepseek-v3:64:grouped_mm,qwen3-30b-a3b:1:batched_mm}
LAUNCHES=${PROFILE_LAUNCHES:-200}
CASE_S=${PROFILE_CASE_S:-150}
exec > >(tee "$OUT/profile.log") 2>&1

NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then
  echo "ncu not found"
  exit 1
fi
if [ ! -x "$BUILD/moex" ]; then
  echo "$BUILD/moex not found: build it first (SUITE_STEPS=none scripts/gpu_suite.sh DIR)"
  exit 1
fi
echo "ncu: $NCU ($("$NCU" --version | tail -1))"

# the experts' kernels only (not the bench's ceilings, weight generation or L2 flush), by
# function name (the FP4 kernels' names start with fp4_)
KERNELS='regex:^(fp4_)?(grouped_gemm|experts|routing|gate_up|down|gather|reduce|count|scan|scatter|act_quant|slot_weights|mma)[a-z0-9_]*_kernel$'
IFS=, read -ra list <<<"$CASES"
[ -n "${PROFILE_GENERATE:-}" ] && list=()
status=0
if [ -n "${PROFILE_GENERATE:-}" ]; then
  ckpt=${PROFILE_GENERATE%%:*} prompt_file=${PROFILE_GENERATE#*:}
  echo "== generate $ckpt"
  # shellcheck disable=SC2086
  timeout --kill-after=10 "$CASE_S" "$NCU" --clock-control none --kernel-name-base function \
    --metrics gpu__time_duration.sum --csv --page raw \
    "$BUILD/moex" generate "$ckpt" --prompt-ids "$(cat "$prompt_file")" --max-new-tokens 1 --device cuda \
    --dtype bf16 --ignore-eos ${PROFILE_GENERATE_FLAGS:-} >"$OUT/profile_generate.csv" 2>"$OUT/profile_generate.err"
  rc=$?
  echo "generate: ncu exit $rc"
  [ $rc -ne 0 ] && status=1 && tail -5 "$OUT/profile_generate.err"
  rm -f "$OUT/profile_generate.err"
fi
for c in "${list[@]}"; do
  IFS=: read -r shape tokens backend dtype <<<"$c"
  dtype=${dtype:-bf16}
  name="${shape}_${tokens}_${backend}_${dtype}"
  echo "== $name"
  # --reference off: no eager run for the err column, so every launch is the backend's
  timeout --kill-after=10 "$CASE_S" "$NCU" --clock-control none --kernel-name-base function --kernel-name "$KERNELS" \
    --launch-count "$LAUNCHES" --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section WarpStateStats --csv --page raw \
    "$BUILD/moex" bench --device cuda --shape "$shape" --tokens "$tokens" --dtype "$dtype" --backends "$backend" \
    --graph off --runs 10 --reference off >"$OUT/profile_$name.csv" 2>"$OUT/profile_$name.err"
  rc=$?
  echo "$name: ncu exit $rc"
  [ $rc -ne 0 ] && status=1 && tail -5 "$OUT/profile_$name.err"
  rm -f "$OUT/profile_$name.err"
done

python3 - "$OUT" <<'PYEOF' >"$OUT/profile.txt"
import csv, glob, io, os, re, statistics, sys

out = sys.argv[1]
COLS = [("SM %", r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$"),
        ("L2 %", r"^lts__throughput\.avg\.pct_of_peak_sustained_elapsed$"),
        ("DRAM %", r"^gpu__dram_throughput\.avg\.pct_of_peak_sustained_elapsed$"),
        ("tensor %", r"^sm__pipe_tensor.*cycles_active.*pct_of_peak_sustained_active$")]
STALL = re.compile(r"^smsp__average_warp_latency_issue_stalled_(\w+)\.ratio$|^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


def val(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("void ", "")
    return name.split("(")[0]


for path in sorted(glob.glob(os.path.join(out, "profile_*.csv"))):
    text = open(path, errors="replace").read()
    start = text.find('"ID"')  # ncu prints its own lines before the CSV
    if start < 0:
        print(f"{os.path.basename(path)}: no CSV\n")
        continue
    reader = csv.reader(io.StringIO(text[start:]))
    header, units = next(reader), next(reader)
    rows = [r for r in reader if len(r) == len(header)]
    col = {h: i for i, h in enumerate(header)}
    kcol, dcol = col.get("Kernel Name"), col.get("gpu__time_duration.sum")
    if kcol is None or dcol is None:
        print(f"{os.path.basename(path)}: no kernel name or duration column\n")
        continue
    scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3,
             "s": 1e3}.get(units[dcol], 1.0)
    ccol = col.get("sm__cycles_active.avg")
    groups = {}
    for r in rows:
        groups.setdefault(short(r[kcol]), []).append(r)
    print(os.path.basename(path)[len("profile_"):-4])
    print(f"  {'kernel':44} {'n':>4} {'ms':>8} {'all ms':>8} {'GHz':>5} " + " ".join(f"{c:>8}" for c, _ in COLS) +
          "  top stalls")
    table = []
    for k, rs in groups.items():
        durs = [(val(r[dcol]) or 0) * scale for r in rs]
        dur, total = statistics.median(durs), sum(durs)
        # the SM clock while the kernel ran: active cycles over the duration (power limits lower it)
        ghz = [val(r[ccol]) / (val(r[dcol]) * scale * 1e6) for r in rs
               if ccol is not None and val(r[ccol]) and val(r[dcol])]
        clock = f"{statistics.median(ghz):5.2f}" if ghz else f"{'-':>5}"
        cells = []
        for _, pat in COLS:
            idx = [i for h, i in col.items() if re.match(pat, h)]
            vals = [max(v for v in (val(r[i]) for i in idx) if v is not None) for r in rs
                    if any(val(r[i]) is not None for i in idx)]
            cells.append(f"{statistics.median(vals):8.1f}" if vals else f"{'-':>8}")
        stalls = []
        for h, i in col.items():
            m = STALL.match(h)
            if m:
                vs = [val(r[i]) for r in rs if val(r[i]) is not None]
                if vs:
                    stalls.append((statistics.median(vs), m.group(1) or m.group(2)))
        stalls.sort(reverse=True)
        table.append((total, f"  {k[:44]:44} {len(rs):4d} {dur:8.3f} {total:8.3f} {clock} " + " ".join(cells) + "  " +
                      ", ".join(f"{n} {v:.1f}" for v, n in stalls[:3])))
    for _, line in sorted(table, reverse=True):
        print(line)
    print(f"  all kernels: {sum(t for t, _ in table):.3f} ms in {len(rows)} launches")
    print()
PYEOF
echo "== summary: $OUT/profile.txt"
cat "$OUT/profile.txt"
exit $status
