#!/usr/bin/env python3
"""ab_compare.py DIR OUT.csv — the CSVs of dev/ab_bench.sh (TAG_SHAPE_rN.csv in DIR; TAG old, new and
any variant's name) as one table: per (shape, dtype, backend, tokens, graph) the median ms of each
binary over the rounds, every round's value, and each binary's ratio to old. Prints the table and
says which cases differ by more than 3%."""
import argparse, csv, glob, os, re, statistics, sys

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("out")
ap.add_argument("--old", default="old")
ap.add_argument("--new", default="new")
a = ap.parse_args()

runs = {}  # (shape, dtype, backend, tokens, graph) -> {tag: [...]}
tags = []
comments = []
for path in sorted(glob.glob(os.path.join(a.dir, "*_r*.csv"))):
    m = re.match(r"([A-Za-z0-9-]+)_(.+)_r(\d+)\.csv$", os.path.basename(path))
    if not m:
        continue
    tag = m.group(1)
    if tag not in tags:
        tags.append(tag)
    with open(path) as f:
        lines = f.read().splitlines()
    comments += ["# %s round %s: %s" % (tag, m.group(3), l[2:]) for l in lines if l.startswith("# ceiling")]
    for row in csv.DictReader(l for l in lines if not l.startswith("#")):
        try:
            ms = float(row["ms"])
        except (KeyError, ValueError):
            continue
        if ms != ms:  # nan: a case the limits leave out
            continue
        key = (row["shape"], row.get("dtype", "bf16"), row["backend"], int(row["tokens"]), int(row["graph"]))
        runs.setdefault(key, {}).setdefault(tag, []).append(ms)

if not runs or "old" not in tags:
    sys.exit("ab_compare: no results of the old tree in %s" % a.dir)
# old first, new second, then the variants by name; two trees keep the old_/new_ column names
others = sorted(t for t in tags if t not in ("old", "new"))
tags = ["old"] + (["new"] if "new" in tags else []) + others
worst = 0.0
with open(a.out, "w", newline="") as f:
    names = " ".join("%s=%s" % (t, {"old": a.old, "new": a.new}.get(t, t)) for t in tags)
    f.write("# %s; ms = median over rounds of moex bench's median of its runs; ratio = TAG/old\n" % names)
    for c in comments:
        f.write(c + "\n")
    w = csv.writer(f)
    rest = tags[1:]
    if rest == ["new"]:
        w.writerow(["shape", "dtype", "backend", "tokens", "graph", "old_ms", "new_ms", "ratio", "old_rounds_ms",
                    "new_rounds_ms"])
    else:
        w.writerow(["shape", "dtype", "backend", "tokens", "graph"] + ["%s_ms" % t for t in tags] +
                   ["%s_ratio" % t for t in rest] + ["%s_rounds_ms" % t for t in tags])
    for key in sorted(runs):
        if any(not runs[key].get(t) for t in tags):
            continue
        med = {t: statistics.median(runs[key][t]) for t in tags}
        ratios = [med[t] / med["old"] for t in rest]
        worst = max([worst] + [abs(r - 1) for r in ratios])
        w.writerow(list(key) + ["%.6g" % med[t] for t in tags] + ["%.4f" % r for r in ratios] +
                   [" ".join("%.6g" % x for x in runs[key][t]) for t in tags])
        flag = "" if all(abs(r - 1) <= 0.03 for r in ratios) else "  <-- more than 3%"
        print("%-14s %-5s %-11s %6d graph=%d " % key +
              "  ".join("%s %.4f" % (t, med[t]) for t in tags) + "  " +
              "  ".join("%s/old %.3f" % (t, r) for t, r in zip(rest, ratios)) + flag)
print("largest difference: %.1f%%" % (100 * worst))
