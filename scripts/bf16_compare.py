#!/usr/bin/env python3
"""bf16_compare.py MOEX_CSV [MOEX_CSV ...] --vllm VLLM_CSV [--vllm VLLM_CSV ...]

moex's bf16 experts layer beside the vLLM Triton peer, from one run's files: per (shape, tokens),
moex's fastest bf16 row (any backend, graph off or on) with its backend, the same run's read
floor (`read_floor_ms`: one kernel reading the distinct experts' weights once) and the fraction
of it reached (floor / ms), and the vLLM peer's best bf16 row (eager or graph; the fastest over
every VLLM_CSV given, e.g. one a round). Then the checks the bf16 issue asks for, each with the
numbers and "met" or "not met":
  - qwen3-30b-a3b and deepseek-v3 at 1, 8, 64, 512, 4096 and 16384 tokens: moex's best faster
    than vLLM's best row;
  - at 8, 64 and 512 tokens: moex's best at least 0.90 of the same run's read floor.
A case the files lack is reported as not met ("no row").
MOEX_CSV: `moex bench --device cuda --dtype bf16` CSVs; VLLM_CSV: the vLLM peer script's rows
(peer,shape,dtype,tokens,ms,...). Standard library only.
"""
import argparse
import sys

from deepgemm_compare import cell, fastest_rows, print_checks, read_vllm  # the same directory
from peer_compare import fnum

SHAPES = ("qwen3-30b-a3b", "deepseek-v3")
TOKENS = (1, 8, 64, 512, 4096, 16384)
FLOOR_TOKENS = (8, 64, 512)
FLOOR_MIN = 0.90


def read_moex(paths):
    """(shape, tokens) -> (ms, backend, graph, read_floor_ms) of the fastest bf16 row."""
    return fastest_rows(paths, lambda r: (r["shape"], int(r["tokens"])) if r.get("dtype", "bf16") == "bf16" else None,
                        lambda r: (r["backend"], r.get("graph", ""), fnum(r.get("read_floor_ms"))))


def read_vllm_all(paths):
    """(shape, dtype, tokens) -> the fastest vllm row over all the files."""
    best = {}
    for p in paths:
        for k, v in read_vllm(p).items():
            best[k] = min(v, best.get(k, v))
    return best


def main(argv):
    ap = argparse.ArgumentParser(description="moex bf16 beside vLLM's bf16 fused_moe, with the bf16 issue's checks")
    ap.add_argument("moex", nargs="+")
    ap.add_argument("--vllm", action="append", default=[])
    a = ap.parse_args(argv)
    moex = read_moex(a.moex)
    vl = read_vllm_all(a.vllm)
    print("%-14s %6s  %-11s %5s %10s %10s %6s %10s %9s" % ("shape", "tokens", "backend", "graph", "moex ms",
                                                          "floor ms", "floor", "vllm ms", "vllm/moex"))
    checks = []
    for s in SHAPES:
        for t in TOKENS:
            m = moex.get((s, t))
            v = vl.get((s, "bf16", t), float("nan"))
            if m is None:
                print("%-14s %6d  %-11s" % (s, t, "no row"))
                checks.append(("%s %d: moex no row" % (s, t), False))
                continue
            ms, backend, graph, floor = m
            frac = floor / ms if floor == floor else float("nan")
            print("%-14s %6d  %-11s %5s %10.4g %10s %6s %10s %9s" % (s, t, backend, graph, ms, cell(floor),
                                                                   "%.3f" % frac if frac == frac else "-", cell(v),
                                                                   "%.3f" % (v / ms) if v == v else "-"))
            checks.append(("%s %d: moex %.4g ms (%s) vs vllm bf16 %s ms" % (s, t, ms, backend, cell(v)),
                           v == v and ms < v))
            if t in FLOOR_TOKENS:
                checks.append(("%s %d: %s of the read floor (%s ms), at least %.2f" %
                               (s, t, "%.3f" % frac if frac == frac else "-", cell(floor), FLOOR_MIN),
                               frac == frac and frac >= FLOOR_MIN))
    return print_checks(checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
