#!/usr/bin/env python3
"""deepgemm_compare.py MOEX_CSV [MOEX_CSV ...] --deepgemm DG_CSV [--vllm VLLM_CSV]

The deepgemm backend beside grouped_mm and the peers, from one run's files: per (shape,
format, tokens), moex's grouped_mm and deepgemm rows (the faster of graph off / on), the
deepgemm row's first forward (`first_ms`: where its kernels are compiled), DeepGEMM's two
GEMMs alone (gate/up + down; the faster of its contiguous and masked layouts, and each
layout's own sum), and the vLLM Triton peer's best row (eager or graph). Then the checks the
deepgemm issue asks for, each with the numbers and "met" or "not met":
  - 16384 tokens: the whole deepgemm layer faster than DeepGEMM's two GEMMs alone (contiguous);
  - 4096 and 16384 tokens: deepgemm at least 10% faster than grouped_mm;
  - FP8 at 1, 8, 64, 512 tokens: deepgemm faster than the best of DeepGEMM's masked GEMMs and
    vLLM's best row.
MOEX_CSV: `moex bench --device cuda --backends grouped_mm,deepgemm` CSVs; DG_CSV: the DeepGEMM
peer script's rows (peer,shape,dtype,layout,part,tokens,ms,tflops); VLLM_CSV: the vLLM peer
script's rows (peer,shape,dtype,tokens,ms,...). Standard library only.
"""
import argparse
import csv
import sys

from peer_compare import fnum  # the same directory: a CSV cell as a float, NaN when not a number


def rows_of(path):
    """The data rows of a CSV with '#' comment lines, as dicts keyed by its header."""
    header = None
    with open(path, newline="") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            row = next(csv.reader([line]))
            if header is None:
                header = row
                continue
            if len(row) == len(header):
                yield dict(zip(header, row))


def fastest_rows(paths, key_of, rest_of):
    """key_of(row) -> (ms,) + rest_of(row) of the fastest row with a time, over every file's rows."""
    best = {}
    for p in paths:
        for r in rows_of(p):
            ms = fnum(r.get("ms"))
            if ms != ms:
                continue
            key = key_of(r)
            if key is not None and (key not in best or ms < best[key][0]):
                best[key] = (ms,) + tuple(rest_of(r))
    return best


def read_moex(paths):
    """(backend, shape, dtype, tokens) -> (ms, first_ms), the faster of its graph rows."""
    return fastest_rows(paths, lambda r: (r["backend"], r["shape"], r["dtype"], int(r["tokens"])),
                        lambda r: (fnum(r.get("first_ms")),))


def read_deepgemm(path):
    """(shape, dtype, layout, tokens) -> gate/up + down ms (only when both parts were timed)."""
    parts = {}
    for r in rows_of(path):
        if r.get("part") not in ("gateup", "down"):
            continue
        ms = fnum(r.get("ms"))
        if ms != ms:
            continue
        parts.setdefault((r["shape"], r["dtype"], r["layout"], int(r["tokens"])), {})[r["part"]] = ms
    return {k: v["gateup"] + v["down"] for k, v in parts.items() if len(v) == 2}


def read_vllm(path):
    """(shape, dtype, tokens) -> the fastest vllm row's ms (eager or graph)."""
    best = {}
    for r in rows_of(path):
        if not r.get("peer", "").startswith("vllm"):
            continue
        ms = fnum(r.get("ms"))
        if ms != ms:
            continue
        key = (r["shape"], r["dtype"], int(r["tokens"]))
        best[key] = min(ms, best.get(key, ms))
    return best


def cell(v, fmt="%.4g"):
    return fmt % v if v == v else "-"


def print_checks(checks):
    """Each (text, ok) as "met" or "not met", then how many were met."""
    for text, ok in checks:
        print("%-8s %s" % ("met" if ok else "not met", text))
    print("%d of %d met" % (sum(ok for _, ok in checks), len(checks)))


def main(argv):
    ap = argparse.ArgumentParser(description="deepgemm beside grouped_mm, DeepGEMM's GEMMs and vLLM")
    ap.add_argument("moex", nargs="+")
    ap.add_argument("--deepgemm", required=True)
    ap.add_argument("--vllm")
    a = ap.parse_args(argv)
    moex = read_moex(a.moex)
    dg = read_deepgemm(a.deepgemm)
    vl = read_vllm(a.vllm) if a.vllm else {}
    nan = float("nan")
    cases = sorted({(s, d, t) for (b, s, d, t) in moex if b == "deepgemm"})
    print("%-14s %-5s %6s %10s %10s %9s %10s %10s %10s %10s" % ("shape", "dtype", "tokens", "grouped_mm", "deepgemm",
                                                               "first_ms", "DG contig", "DG masked", "DG best", "vllm"))
    for s, d, t in cases:
        g = moex.get(("grouped_mm", s, d, t), (nan, nan))[0]
        ms, first = moex[("deepgemm", s, d, t)]
        c, m = dg.get((s, d, "contiguous", t), nan), dg.get((s, d, "masked", t), nan)
        best = min(x for x in (c, m, float("inf")) if x == x)
        print("%-14s %-5s %6d %10s %10s %9s %10s %10s %10s %10s" % (
            s, d, t, cell(g), cell(ms), cell(first, "%.1f"), cell(c), cell(m),
            cell(best if best != float("inf") else nan), cell(vl.get((s, d, t), nan))))
    print()
    checks = []
    for s, d, t in cases:
        ms = moex[("deepgemm", s, d, t)][0]
        if t == 16384:
            c = dg.get((s, d, "contiguous", t), nan)
            checks.append(("%s %s %d: deepgemm layer %.4g ms vs DeepGEMM's two GEMMs %s ms" % (s, d, t, ms, cell(c)),
                           c == c and ms < c))
        if t in (4096, 16384):
            g = moex.get(("grouped_mm", s, d, t), (nan, nan))[0]
            checks.append(("%s %s %d: grouped_mm / deepgemm %s (want >= 1.10)" % (s, d, t, cell(g / ms, "%.3f")),
                           g == g and g / ms >= 1.10))
        if d == "fp8" and t in (1, 8, 64, 512):
            m, v = dg.get((s, d, "masked", t), nan), vl.get((s, d, t), nan)
            rivals = [x for x in (m, v) if x == x]
            checks.append(("%s %s %d: deepgemm %.4g ms vs DeepGEMM masked %s, vllm %s" % (s, d, t, ms, cell(m), cell(v)),
                           bool(rivals) and ms < min(rivals)))
    print_checks(checks)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
