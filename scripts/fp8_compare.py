#!/usr/bin/env python3
"""fp8_compare.py MOEX_CSV [MOEX_CSV ...] --vllm VLLM_CSV [--vllm VLLM_CSV ...]

moex's quantized experts layer beside the vLLM Triton peer's FP8 (W8A8, 128 x 128 blocks), from
one run's files: per (shape, tokens), moex's fastest FP8 row (any backend, graph off or on) with
its backend, its fraction of the same run's FP8 GEMM ceiling (`gemm_frac`) and of its read floor
in quantized bytes (`floor_frac`), and vLLM's best FP8 row (eager or graph; the fastest over every
VLLM_CSV given). Then the checks the GPU quantization issue asks for, each with its numbers and
"met" or "not met":
  - qwen3-30b-a3b at 1, 8, 64, 512, 4096 and 16384 tokens: moex FP8 faster than vLLM FP8;
  - deepseek-v3 at 1, 64, 512 and 16384 tokens: the same, and at 16384 tokens at least 0.70 of
    the same-run FP8 GEMM ceiling;
  - deepseek-v3 at 64 tokens: FP8 at least 0.90 of its quantized read floor;
  - deepseek-v3 at 1 token: moex's best FP4 row at least 2.8x faster than its best bf16 row.
A case the files lack is reported as not met ("no row").
MOEX_CSV: `moex bench --device cuda --dtype fp8[,bf16,fp4]` CSVs; VLLM_CSV: the vLLM peer
script's rows (peer,shape,dtype,tokens,ms,...). Standard library only.
"""
import argparse
import sys

from bf16_compare import read_vllm_all  # the same directory
from deepgemm_compare import cell, fastest_rows, print_checks
from peer_compare import fnum

SHAPES = ("qwen3-30b-a3b", "deepseek-v3")
TOKENS = (1, 8, 64, 512, 4096, 16384)
PEER_TOKENS = {"qwen3-30b-a3b": (1, 8, 64, 512, 4096, 16384), "deepseek-v3": (1, 64, 512, 16384)}
GEMM_TOKENS, GEMM_MIN = 16384, 0.70
FLOOR_TOKENS, FLOOR_MIN = 64, 0.90
FP4_TOKENS, FP4_MIN = 1, 2.8


def read_moex(paths):
    """(shape, dtype, tokens) -> (ms, backend, graph, gemm_frac, floor_frac) of the fastest row."""
    return fastest_rows(paths, lambda r: (r["shape"], r.get("dtype", "bf16"), int(r["tokens"])),
                        lambda r: (r["backend"], r.get("graph", ""), fnum(r.get("gemm_frac")), fnum(r.get("floor_frac"))))


def frac(v):
    return "%.3f" % v if v == v else "-"


def main(argv):
    ap = argparse.ArgumentParser(description="moex FP8 beside vLLM's FP8 fused_moe, with the quantization issue's checks")
    ap.add_argument("moex", nargs="+")
    ap.add_argument("--vllm", action="append", default=[])
    a = ap.parse_args(argv)
    moex = read_moex(a.moex)
    vl = read_vllm_all(a.vllm)
    print("%-14s %6s  %-11s %5s %10s %6s %6s %10s %9s" % ("shape", "tokens", "backend", "graph", "moex ms", "gemm",
                                                        "floor", "vllm ms", "vllm/moex"))
    checks = []
    for s in SHAPES:
        for t in TOKENS:
            m = moex.get((s, "fp8", t))
            v = vl.get((s, "fp8", t), float("nan"))
            if m is None:
                print("%-14s %6d  %-11s" % (s, t, "no row"))
                if t in PEER_TOKENS[s]:
                    checks.append(("%s %d: moex fp8 no row" % (s, t), False))
                continue
            ms, backend, graph, gemm, floor = m
            print("%-14s %6d  %-11s %5s %10.4g %6s %6s %10s %9s" % (s, t, backend, graph, ms, frac(gemm), frac(floor),
                                                                 cell(v), "%.3f" % (v / ms) if v == v else "-"))
            if t in PEER_TOKENS[s]:
                checks.append(("%s %d: moex fp8 %.4g ms (%s) vs vllm fp8 %s ms" % (s, t, ms, backend, cell(v)),
                               v == v and ms < v))
            if s == "deepseek-v3" and t == GEMM_TOKENS:
                checks.append(("%s %d: %s of the same-run FP8 GEMM, at least %.2f" % (s, t, frac(gemm), GEMM_MIN),
                               gemm == gemm and gemm >= GEMM_MIN))
            if s == "deepseek-v3" and t == FLOOR_TOKENS:
                checks.append(("%s %d: %s of the quantized read floor, at least %.2f" % (s, t, frac(floor), FLOOR_MIN),
                               floor == floor and floor >= FLOOR_MIN))
    f4, b16 = moex.get(("deepseek-v3", "fp4", FP4_TOKENS)), moex.get(("deepseek-v3", "bf16", FP4_TOKENS))
    if f4 and b16:
        checks.append(("deepseek-v3 %d: fp4 %.4g ms (%s) is %.2fx faster than bf16 %.4g ms (%s), at least %.1fx" %
                       (FP4_TOKENS, f4[0], f4[1], b16[0] / f4[0], b16[0], b16[1], FP4_MIN), b16[0] / f4[0] >= FP4_MIN))
    else:
        checks.append(("deepseek-v3 %d: fp4 against bf16: %s" % (FP4_TOKENS, "no fp4 row" if not f4 else "no bf16 row"),
                       False))
    return print_checks(checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
