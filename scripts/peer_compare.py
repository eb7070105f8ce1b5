#!/usr/bin/env python3
"""peer_compare.py MOEX_CSV [MOEX_CSV ...] --peer PEER_CSV

moex beside the peer, case by case, from one run's files: for every (shape, tokens)
that both timed, moex's fastest row (backend, graph capture) against the peer's
fastest backend other than eager, plain and compiled (column `compiled` of the peer
script's CSV), as times and ratios (peer time / moex time: above 1, moex is faster),
and moex's row as fractions of its run's ceilings. Where the CSV has the read floor
(cuda: one kernel reading the distinct experts' weights once, timed like the forward),
"floor ms" is it and "max x" is the peer's best time over it: the ratio a forward
would show if it cost no more than reading its weights. Rows of a warm-cache moex CSV
(`--cache warm`, comment `timing=cuda_events_warm_l2_one_routing`) are labelled
"warm"; the peer script itself neither flushes L2 nor changes the routing.
Standard library only.
"""
import argparse
import csv
import sys


def read_moex(path):
    """(shape, tokens, cache) -> fastest row as a dict; cache is 'flushed' or 'warm'."""
    best = {}
    cache = "flushed"
    header = None
    with open(path, newline="") as f:
        for line in f:
            if line.startswith("#"):
                if "timing=" in line:
                    cache = "warm" if "warm" in line.split("timing=")[1] else "flushed"
                continue
            row = next(csv.reader([line]))
            if row and row[0] == "shape":
                header = row
                continue
            if not header or len(row) != len(header):
                continue
            r = dict(zip(header, row))
            try:
                ms = float(r["ms"])
            except ValueError:
                continue
            if ms != ms:  # nan: not run
                continue
            key = (r["shape"], int(r["tokens"]), cache)
            if key not in best or ms < float(best[key]["ms"]):
                best[key] = r
    return best


def fnum(v):
    """float of a CSV cell; NaN when absent or empty."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def read_peer(path):
    """(shape, tokens, compiled) -> (ms, backend), the fastest backend other than eager."""
    best = {}
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) < 5 or row[0] in ("CEILING", "shape") or row[1] == "eager":
                continue
            try:
                ms = float(row[4])
                key = (row[0], int(row[3]), int(row[2]))
            except ValueError:  # skip-oom, error:...
                continue
            if key not in best or ms < best[key][0]:
                best[key] = (ms, row[1])
    return best


def main():
    ap = argparse.ArgumentParser(description="moex beside the peer, from one run's CSV files")
    ap.add_argument("moex", nargs="+", help="moex bench CSV files")
    ap.add_argument("--peer", required=True, help="the peer script's CSV (plain and compiled rows)")
    a = ap.parse_args()
    moex = {}
    for p in a.moex:
        try:
            moex.update(read_moex(p))
        except OSError as e:
            sys.exit(f"peer_compare.py: {p}: {e.strerror}")
    try:
        peer = read_peer(a.peer)
    except OSError as e:
        sys.exit(f"peer_compare.py: {a.peer}: {e.strerror}")
    print(f"{'shape':<14} {'T':>6} {'cache':<8} {'moex ms':>9} {'moex best':<16} "
          f"{'peer plain':>18} {'x':>6} {'peer compiled':>22} {'x':>6} {'gemm_frac':>9} {'bw_frac':>8} "
          f"{'floor ms':>9} {'max x':>6}")
    shown = 0
    for (shape, tokens, cache) in sorted(moex, key=lambda k: (k[0], k[1], k[2])):
        plain, comp = peer.get((shape, tokens, 0)), peer.get((shape, tokens, 1))
        if not plain and not comp:
            continue
        r = moex[(shape, tokens, cache)]
        ms = float(r["ms"])
        who = f"{r['backend']} g{r['graph']}"

        def cell(p, width):
            if not p:
                return f"{'-':>{width}} {'-':>6}"
            return f"{p[0]:>{width - 12}.4f} {p[1]:<11} {p[0] / ms:>6.2f}"

        floor = fnum(r.get("read_floor_ms"))
        peer_best = min(p[0] for p in (plain, comp) if p)
        floor_cells = (f"{floor:>9.4f} {peer_best / floor:>6.2f}" if floor == floor and floor > 0
                       else f"{'-':>9} {'-':>6}")
        print(f"{shape:<14} {tokens:>6} {cache:<8} {ms:>9.4f} {who:<16} {cell(plain, 18)} "
              f"{cell(comp, 22)} {float(r['gemm_frac']):>9.3f} {float(r['bw_frac']):>8.3f} {floor_cells}")
        shown += 1
    if not shown:
        sys.exit("peer_compare.py: no case timed by both")


if __name__ == "__main__":
    main()
