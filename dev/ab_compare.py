#!/usr/bin/env python3
"""ab_compare.py DIR OUT.csv — the CSVs of dev/ab_bench.sh ({old,new}_SHAPE_rN.csv in DIR) as one
table: per (shape, backend, tokens, graph) the median ms of each binary over the rounds, every
round's value, and new/old. Prints the table and says which cases differ by more than 3%."""
import argparse, csv, glob, os, re, statistics, sys

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("out")
ap.add_argument("--old", default="old")
ap.add_argument("--new", default="new")
a = ap.parse_args()

runs = {}  # (shape, backend, tokens, graph) -> {"old": [...], "new": [...]}
comments = []
for path in sorted(glob.glob(os.path.join(a.dir, "*_r*.csv"))):
    m = re.match(r"(old|new)_(.+)_r(\d+)\.csv$", os.path.basename(path))
    if not m:
        continue
    tag = m.group(1)
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
        runs.setdefault(key, {"old": [], "new": []})[tag].append(ms)

if not runs:
    sys.exit("ab_compare: no results in %s" % a.dir)
worst = 0.0
with open(a.out, "w", newline="") as f:
    f.write("# old=%s new=%s; ms = median over rounds of moex bench's median of its runs; ratio = new/old\n" % (a.old, a.new))
    for c in comments:
        f.write(c + "\n")
    w = csv.writer(f)
    w.writerow(["shape", "dtype", "backend", "tokens", "graph", "old_ms", "new_ms", "ratio", "old_rounds_ms",
                "new_rounds_ms"])
    for key in sorted(runs):
        o, n = runs[key]["old"], runs[key]["new"]
        if not o or not n:
            continue
        om, nm = statistics.median(o), statistics.median(n)
        ratio = nm / om
        worst = max(worst, abs(ratio - 1))
        w.writerow(list(key) + ["%.6g" % om, "%.6g" % nm, "%.4f" % ratio, " ".join("%.6g" % x for x in o),
                                " ".join("%.6g" % x for x in n)])
        flag = "" if abs(ratio - 1) <= 0.03 else "  <-- more than 3%"
        print("%-14s %-5s %-11s %6d graph=%d  old %9.4f ms  new %9.4f ms  new/old %.3f%s" % (key + (om, nm, ratio, flag)))
print("largest difference: %.1f%%" % (100 * worst))
