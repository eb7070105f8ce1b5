#!/usr/bin/env python3
"""sonicmoe_compare.py MOEX_CSV [MOEX_CSV ...] [--vllm VLLM_CSV]

The sonicmoe backend beside grouped_mm and the vLLM peer, from one run's files: per (shape,
tokens), bf16, moex's grouped_mm and sonicmoe rows (the faster of graph off / on), sonicmoe's
fraction of the same run's dense bf16 GEMM (`gemm_frac`), each backend's workspace
(`workspace_mib`: its context's, sized for the run's largest token count) and the vLLM Triton
peer's best bf16 row. Then the checks the sonicmoe issue asks for, each with the numbers and
"met" or "not met":
  - 4096 and 16384 tokens: sonicmoe at least 10% faster than grouped_mm;
  - 16384 tokens: sonicmoe at least 0.85 of the dense bf16 GEMM's rate;
  - 512 tokens: sonicmoe faster than vLLM's best bf16 row;
  - the workspace at the run's largest token count: sonicmoe's lower than grouped_mm's by at
    least the gathered copy (tokens x top_k x hidden x 2 bytes; hidden and top_k from the CSV's
    comment line), within the CSV's 6 significant digits.
MOEX_CSV: `moex bench --device cuda --dtype bf16 --backends grouped_mm,sonicmoe` CSVs; VLLM_CSV:
the vLLM peer script's rows (peer,shape,dtype,tokens,ms,...). Standard library only.
"""
import argparse
import re
import sys

from deepgemm_compare import cell, print_checks, read_vllm, rows_of  # the same directory
from peer_compare import fnum


def shape_sizes(paths):
    """shape -> (hidden, top_k), from the `# gpu=... shape=S hidden=H ... top_k=K` comment lines."""
    sizes = {}
    for p in paths:
        with open(p) as f:
            for line in f:
                m = re.match(r"#.* shape=(\S+) hidden=(\d+) .*top_k=(\d+)", line)
                if m:
                    sizes[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return sizes


def read_moex(paths):
    """(backend, shape, tokens) -> (ms, gemm_frac, workspace_mib) of the faster graph row, bf16 only."""
    best = {}
    for p in paths:
        for r in rows_of(p):
            ms = fnum(r.get("ms"))
            if ms != ms or r.get("dtype") != "bf16":
                continue
            key = (r["backend"], r["shape"], int(r["tokens"]))
            if key not in best or ms < best[key][0]:
                best[key] = (ms, fnum(r.get("gemm_frac")), fnum(r.get("workspace_mib")))
    return best


def main(argv):
    ap = argparse.ArgumentParser(description="sonicmoe beside grouped_mm and vLLM's bf16 fused_moe")
    ap.add_argument("moex", nargs="+")
    ap.add_argument("--vllm")
    a = ap.parse_args(argv)
    moex = read_moex(a.moex)
    sizes = shape_sizes(a.moex)
    vl = read_vllm(a.vllm) if a.vllm else {}
    nan = float("nan")
    none = (nan, nan, nan)
    cases = sorted({(s, t) for (b, s, t) in moex if b == "sonicmoe"})
    print("%-14s %6s %10s %10s %7s %9s %11s %11s %10s" % ("shape", "tokens", "grouped_mm", "sonicmoe", "ratio",
                                                         "gemm_frac", "ws grouped", "ws sonic", "vllm bf16"))
    for s, t in cases:
        g, s_ = moex.get(("grouped_mm", s, t), none), moex[("sonicmoe", s, t)]
        print("%-14s %6d %10s %10s %7s %9s %11s %11s %10s" % (
            s, t, cell(g[0]), cell(s_[0]), cell(g[0] / s_[0], "%.3f"), cell(s_[1], "%.3f"), cell(g[2], "%.1f"),
            cell(s_[2], "%.1f"), cell(vl.get((s, "bf16", t), nan))))
    print()
    checks = []
    for s, t in cases:
        g, s_ = moex.get(("grouped_mm", s, t), none), moex[("sonicmoe", s, t)]
        if t in (4096, 16384):
            checks.append(("%s %d: grouped_mm / sonicmoe %s (want >= 1.10)" % (s, t, cell(g[0] / s_[0], "%.3f")),
                           g[0] == g[0] and g[0] / s_[0] >= 1.10))
        if t == 16384:
            checks.append(("%s %d: sonicmoe at %s of the dense bf16 GEMM (want >= 0.85)" % (s, t, cell(s_[1], "%.3f")),
                           s_[1] == s_[1] and s_[1] >= 0.85))
        if t == 512:
            v = vl.get((s, "bf16", t), nan)
            checks.append(("%s %d: sonicmoe %.4g ms vs vllm bf16 %s ms" % (s, t, s_[0], cell(v)), v == v and s_[0] < v))
    for s in sorted({s for s, _ in cases}):
        t = max(t for s2, t in cases if s2 == s)
        g, s_ = moex.get(("grouped_mm", s, t), none), moex[("sonicmoe", s, t)]
        if s not in sizes:
            checks.append(("%s: no hidden/top_k in the CSV's comments" % s, False))
            continue
        hidden, top_k = sizes[s]
        copy = t * top_k * hidden * 2 / 2**20
        checks.append(("%s %d: workspace %s MiB (sonicmoe) vs %s MiB (grouped_mm): %s MiB less, gathered copy %.1f "
                       "MiB" % (s, t, cell(s_[2], "%.1f"), cell(g[2], "%.1f"), cell(g[2] - s_[2], "%.1f"), copy),
                       g[2] == g[2] and g[2] - s_[2] >= copy * (1 - 1e-5)))  # the CSV's 6 digits
    print_checks(checks)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
