#!/usr/bin/env python3
"""streamed_trace_summary.py TRACE [BIN_US] — where the one-launch streamed forward's time goes, item by
item, from the trace that dev/variants/streamed-trace.patch records (`-DMOEX_DIAG_STREAM_TRACE`, then
`MOEX_TRACE_FILE=TRACE moex bench --device cuda ...`: the last launch of experts_mma_kernel).

Prints the launch's sizes and span; per kind of item (x's quantization, gate/up, down) their count,
time and wait; the down items' waits by the hit expert they belong to (in tenths of the hit list),
each against the time its expert's gate/up items were all done; and per BIN_US (default 5) of the
launch the weight bytes streamed (each item's bytes spread over its time after its wait) and the
warps streaming, waiting and finished."""
import statistics
import struct
import sys

HEAD = struct.Struct("<14I")
ITEM = struct.Struct("<QQIIII")
MAGIC = 0x53545231


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    bin_us = float(sys.argv[2]) if len(sys.argv) == 3 else 5.0
    data = open(sys.argv[1], "rb").read()
    if len(data) < HEAD.size:
        sys.exit(f"{sys.argv[1]}: shorter than the trace's head")
    (magic, total, n_x, n_gu, fg_gu, fg_dn, ksplit, hits, H, I, elt, mats, warps, _) = HEAD.unpack_from(data)
    if magic != MAGIC:
        sys.exit(f"{sys.argv[1]}: not a streamed-forward trace (magic {magic:#x})")
    n = (len(data) - HEAD.size) // ITEM.size
    recs = [ITEM.unpack_from(data, HEAD.size + i * ITEM.size) for i in range(n)]
    recs = [r for r in recs if r[1] > 0 and r[4] < total]  # items of this launch that wrote a record
    if not recs:
        sys.exit("no item records")
    t0 = min(r[0] for r in recs)
    t1 = max(r[1] for r in recs)
    # the SM clock: cycles over nanoseconds of the longer items (globaltimer is coarse)
    rates = [r[3] / (r[1] - r[0]) for r in recs if r[1] - r[0] > 2000 and r[3] > 0]
    ghz = statistics.median(rates) if rates else 1.7

    def kind(item):
        return "x" if item < n_x else "gate/up" if item < n_gu else "down"

    def expert(item):
        if item < n_x:
            return -1
        if item < n_gu:
            return (item - n_x) // ksplit // fg_gu
        return (item - n_gu) // fg_dn

    gu_bytes = 16 * mats * H * elt / ksplit
    dn_bytes = 32 * I * elt
    print(f"launch: {total} items ({n_x} x, {n_gu - n_x} gate/up, {total - n_gu} down), {hits} experts hit, "
          f"H {H}, I {I}, {elt} byte(s) a weight, {warps} warps; {len(recs)} records")
    print(f"span {(t1 - t0) / 1e3:.1f} us; SM clock {ghz:.2f} GHz (cycles over ns of the items)")
    by_kind = {}
    for r in recs:
        by_kind.setdefault(kind(r[4]), []).append(r)
    print(f"{'kind':8} {'items':>6} {'median us':>10} {'mean us':>8} {'mean wait us':>13} {'waited >0.5 us':>15}")
    for k in ("x", "gate/up", "down"):
        rs = by_kind.get(k, [])
        if not rs:
            continue
        d = [(r[1] - r[0]) / 1e3 for r in rs]
        w = [r[2] / ghz / 1e3 for r in rs]
        print(f"{k:8} {len(rs):6d} {statistics.median(d):10.2f} {statistics.mean(d):8.2f} {statistics.mean(w):13.2f} "
              f"{sum(x > 0.5 for x in w):15d}")

    # each expert's gate/up items all done (the last one's end) against its down items' claims and waits
    gu_done = {}
    for r in by_kind.get("gate/up", []):
        e = expert(r[4])
        gu_done[e] = max(gu_done.get(e, 0), r[1])
    dn = by_kind.get("down", [])
    if dn and hits:
        print("down items by hit expert (tenths of the hit list): items, mean wait us, claimed before the "
              "expert's gate/up was done, mean (done - claim) us, first claim and gate/up done (us from start)")
        tenth = max(1, (hits + 9) // 10)
        for g in range(0, hits, tenth):
            rs = [r for r in dn if g <= expert(r[4]) < g + tenth]
            if not rs:
                continue
            w = statistics.mean(r[2] / ghz / 1e3 for r in rs)
            early = [r for r in rs if gu_done.get(expert(r[4]), 0) > r[0]]
            lead = statistics.mean((gu_done[expert(r[4])] - r[0]) / 1e3 for r in early) if early else 0.0
            first = (min(r[0] for r in rs) - t0) / 1e3
            done = (max(gu_done.get(e, t0) for e in range(g, min(hits, g + tenth))) - t0) / 1e3
            print(f"  experts {g:4d}-{min(hits, g + tenth) - 1:4d}: {len(rs):5d} {w:8.2f} {len(early):6d} {lead:8.2f}"
                  f"   {first:8.1f} {done:8.1f}")

    # the timeline: bytes streamed (after each item's wait), warps streaming / waiting / finished
    nb = int((t1 - t0) / (bin_us * 1e3)) + 1
    streamed = [0.0] * nb
    busy = [0.0] * nb
    waiting = [0.0] * nb
    last_end = {}
    for r in recs:
        claim, end, wait_clk, busy_clk, item, where = r
        last_end[where] = max(last_end.get(where, 0), end)
        k = kind(item)
        b = gu_bytes if k == "gate/up" else dn_bytes if k == "down" else 0.0
        ready = min(end, claim + wait_clk / ghz)
        for lo, hi, arr, amount in ((claim, ready, waiting, None), (ready, end, busy, b)):
            if hi <= lo:
                continue
            for i in range(int((lo - t0) / (bin_us * 1e3)), int((hi - t0) / (bin_us * 1e3)) + 1):
                a, z = t0 + i * bin_us * 1e3, t0 + (i + 1) * bin_us * 1e3
                part = max(0.0, min(hi, z) - max(lo, a))
                if part <= 0 or i >= nb:
                    continue
                arr[i] += part / (bin_us * 1e3)  # warps (time-averaged over the bin)
                if amount:
                    streamed[i] += amount * part / (hi - lo)
    finished = [sum(1 for e in last_end.values() if e <= t0 + (i + 1) * bin_us * 1e3) for i in range(nb)]
    print(f"per {bin_us:g} us: GB/s streamed (item bytes over their time after the wait), warps streaming, "
          f"waiting, finished (of {len(last_end)} that took items)")
    for i in range(nb):
        print(f"  {i * bin_us:7.1f} {streamed[i] / (bin_us * 1e3):8.1f} {busy[i]:7.0f} {waiting[i]:7.0f} {finished[i]:6d}")


if __name__ == "__main__":
    main()
