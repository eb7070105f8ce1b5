#!/usr/bin/env python3
"""sass_stalls.py FILE.csv [TOP [AROUND]] — one kernel's warp stall samples by SASS instruction, from Nsight
Compute's source page (`ncu --section SourceCounters ... -o R`, then
`ncu -i R.ncu-rep --page source --csv --print-source sass > FILE.csv`).

Prints the kernel's name, its sample and executed-instruction totals, the stall reasons' shares
of all samples, the instruction mix (by executed warp instructions, opcode without modifiers) and
the TOP (default 14) instructions with the most samples, each with its two largest reasons; with
AROUND, then the AROUND instructions before and after each of the five with the most samples (in
the page's order: what a stalled instruction waits for is usually a few lines above it)."""
import collections
import csv
import sys


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) not in (2, 3, 4):
        sys.exit(__doc__)
    top = int(sys.argv[2]) if len(sys.argv) >= 3 else 14
    around = int(sys.argv[3]) if len(sys.argv) == 4 else 0
    rows = list(csv.reader(open(sys.argv[1], errors="replace")))
    if len(rows) < 3 or "Address" not in rows[1]:
        sys.exit(f"{sys.argv[1]}: not an ncu source page (line 2 should name the columns)")
    kernel, header = rows[0][1] if len(rows[0]) > 1 else "?", rows[1]
    data = [r for r in rows[2:] if len(r) == len(header)]
    col = {h: i for i, h in enumerate(header)}
    samples_col, exec_col = col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]
    reasons = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    samples = sum(num(r[samples_col]) for r in data) or 1.0
    executed = sum(num(r[exec_col]) for r in data) or 1.0
    print(f"kernel: {kernel.split('(')[0]}")
    print(f"samples {samples:.0f}, warp instructions executed {executed:.0f}, SASS instructions {len(data)}")
    share = sorted(((sum(num(r[col[h]]) for r in data), h[len("stall_"):]) for h in reasons), reverse=True)
    print("stall reasons: " + ", ".join(f"{name} {100 * s / samples:.1f}%" for s, name in share if s > 0))
    mix = collections.Counter()
    for r in data:
        words = r[col["Source"]].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            mix[words[0].split(".")[0]] += num(r[exec_col])
    print("instruction mix: " + ", ".join(f"{op} {100 * n / executed:.1f}%" for op, n in mix.most_common(12)))
    print(f"top {top} instructions by samples (address, share of samples, times executed, source, two largest reasons):")
    for r in sorted(data, key=lambda r: -num(r[samples_col]))[:top]:
        why = sorted(((num(r[col[h]]), h[len("stall_"):]) for h in reasons), reverse=True)[:2]
        print(f"  {r[col['Address']]} {100 * num(r[samples_col]) / samples:5.1f}% {num(r[exec_col]):9.0f}  "
              f"{' '.join(r[col['Source']].split())[:70]:70}  " + ", ".join(f"{n} {s:.0f}" for s, n in why if s > 0))
    if around:
        hot = sorted(range(len(data)), key=lambda i: -num(data[i][samples_col]))[:5]
        for h in hot:
            print(f"around {data[h][col['Address']]} (executed, samples, source):")
            for i in range(max(0, h - around), min(len(data), h + around + 1)):
                r = data[i]
                print(f"  {'>' if i == h else ' '} {r[col['Address']]} {num(r[exec_col]):9.0f} {num(r[samples_col]):6.0f}  "
                      f"{' '.join(r[col['Source']].split())[:90]}")


if __name__ == "__main__":
    main()
