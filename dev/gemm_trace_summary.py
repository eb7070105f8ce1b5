#!/usr/bin/env python3
"""gemm_trace_summary.py TRACE [STAGE_BYTES [both]] — summarise the grouped GEMM's event trace (the
diagnostic of dev/variants/gemm-trace.patch, written to $MOEX_TRACE_FILE by a build with
-DMOEX_DIAG_TRACE): for the last gate/up and down launch, where each block's producer and
consumer warpgroups spent their time, the latency from a stage's issue to its consumer finding
it full, how long epilogues take against k-loops, and the bytes delivered over time.

Events (thread 0 of each role; role 0 the producer, 1 and 2 the consumer warpgroups):
  1/2 producer waits for an empty stage / issues it, 3/4 producer's find_tile begin / end,
  5/6 consumer waits for a full stage / has it, 7/8 turn wait begin / end,
  9/10 epilogue begin / end (9 carries the tile's rows).
"""
import struct
import sys

TR_BLOCKS, TR_EVENTS = 160, 1024
EV = struct.Struct("<QQII")
BOTH = False  # FP8: both consumer warpgroups take every stage


def load(path):
    data = open(path, "rb").read()
    ncount = 2 * TR_BLOCKS * 3
    counts = struct.unpack_from("<%dI" % ncount, data, 0)
    off = ncount * 4
    out = {}
    for d in range(2):
        blocks = []
        for b in range(TR_BLOCKS):
            roles = []
            for r in range(3):
                n = counts[(d * TR_BLOCKS + b) * 3 + r]
                base = off + (((d * TR_BLOCKS + b) * 3 + r) * TR_EVENTS) * EV.size
                evs = []
                for i in range(min(n, TR_EVENTS)):
                    ns, clk, tag, smid = EV.unpack_from(data, base + i * EV.size)
                    evs.append((ns, clk, tag >> 24, tag & 0xFFFFFF))
                roles.append(evs)
            if any(roles):
                blocks.append(roles)
        out[d] = blocks
    return out


def pct(a, b):
    return 100.0 * a / b if b else 0.0


def pairs(evs, t0, t1):
    """durations (ns) between each event of type t0 and the next of type t1"""
    out, start = [], None
    for ns, clk, ty, kb in evs:
        if ty == t0:
            start = ns
        elif ty == t1 and start is not None:
            out.append(ns - start)
            start = None
    return out


def summary(name, blocks, stage_bytes):
    if not blocks:
        print(f"== {name}: no events")
        return
    starts = [min(e[0] for r in b for e in r[:1]) for b in blocks]
    ends = [max(r[-1][0] for r in b if r) for b in blocks]
    t0, t1 = min(starts), max(ends)
    span = t1 - t0
    print(f"== {name}: {len(blocks)} blocks, span {span / 1000:.1f} us (first event to last)")
    print(f"   block start spread {(max(starts) - t0) / 1000:.2f} us; block end: earliest "
          f"{(min(ends) - t0) / 1000:.1f} us, median {(sorted(ends)[len(ends) // 2] - t0) / 1000:.1f}, last {span / 1000:.1f}")
    tot = {k: 0.0 for k in ("p_empty", "p_find", "c_full", "c_turn", "c_epi", "busy")}
    kloops, epis, lat = [], [], []
    nkb = 0
    for b, (bs, be) in zip(blocks, zip(starts, ends)):
        prod, c1, c2 = b
        blk = be - bs
        tot["busy"] += blk
        tot["p_empty"] += sum(pairs(prod, 1, 2))
        tot["p_find"] += sum(pairs(prod, 3, 4))
        for c in (c1, c2):
            tot["c_full"] += sum(pairs(c, 5, 6)) / 2
            tot["c_turn"] += sum(pairs(c, 7, 8)) / 2
            e = pairs(c, 9, 10)
            epis += e
            tot["c_epi"] += sum(e) / 2
            kloops += pairs(c, 8, 9)
        # issue -> ready latency: the producer's k-th issue against the k-th full stage a consumer
        # found (both consumers' waits merged in time order; FP8 consumers both take every stage)
        issues = [e[0] for e in prod if e[2] == 2]
        if BOTH:  # both warpgroups wait for every stage: the first's finds
            ready = sorted(e[0] for e in c1 if e[2] == 6)
        else:  # the warpgroups take turns: their finds merged in time order
            ready = sorted(e[0] for c in (c1, c2) for e in c if e[2] == 6)
        for k in range(min(len(issues), len(ready))):
            lat.append(ready[k] - issues[k])
        nkb += len(issues)
    print(f"   per block, share of its span: producer waiting for an empty stage {pct(tot['p_empty'], tot['busy']):.1f}%, "
          f"in find_tile {pct(tot['p_find'], tot['busy']):.1f}%")
    print(f"   consumer warpgroup (mean of the two): waiting for a full stage {pct(tot['c_full'], tot['busy']):.1f}%, "
          f"turn wait {pct(tot['c_turn'], tot['busy']):.1f}%, epilogue {pct(tot['c_epi'], tot['busy']):.1f}%")
    if kloops:
        kloops.sort()
        print(f"   k-loop (turn to epilogue) median {kloops[len(kloops) // 2] / 1000:.2f} us; epilogue median "
              f"{sorted(epis)[len(epis) // 2] / 1000:.2f} us, max {max(epis) / 1000:.2f} us")
    elif epis:
        print(f"   epilogue median {sorted(epis)[len(epis) // 2] / 1000:.2f} us, max {max(epis) / 1000:.2f} us")
    if lat:
        lat.sort()
        q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] / 1000
        print(f"   issue -> consumer has the stage: p10 {q(0.1):.2f} us, median {q(0.5):.2f}, p90 {q(0.9):.2f}, "
              f"max {q(1.0):.2f} ({len(lat)} stages; {nkb} issued)")
    # bytes delivered over time (by the producer's issue of the next stage: a stage's bytes are
    # counted when the consumer finds it full)
    bins = {}
    w = 10000  # 10 us
    for b in blocks:
        for e in (b[1] if BOTH else b[1] + b[2]):
            if e[2] == 6:
                bins.setdefault((e[0] - t0) // w, 0)
                bins[(e[0] - t0) // w] += stage_bytes
    line = []
    for k in sorted(bins):
        line.append(f"{k * 10}-{k * 10 + 10}us {bins[k] / w:.0f}")
    print("   GB/s delivered to consumers per 10 us (counted when a warpgroup finds a stage full):")
    print("     " + ", ".join(line))


NAMES = {1: "P wait-empty", 2: "P issue", 3: "P find", 4: "P found", 5: "C wait-full", 6: "C full",
         7: "C turn-wait", 8: "C turn", 9: "C epi", 10: "C epi-end"}


def timeline(name, blocks, limit):
    """one block's events in time order (the block of the median end time)"""
    if not blocks:
        return
    b = blocks[len(blocks) // 2]
    evs = sorted((e[0], r, e[2], e[3]) for r in range(3) for e in b[r])
    t0 = evs[0][0]
    print(f"-- {name}: block {len(blocks) // 2}'s first {limit} events (us from its first; role; kb or rows)")
    prev = t0
    for ns, r, ty, kb in evs[:limit]:
        print(f"   {(ns - t0) / 1000:8.2f} (+{(ns - prev) / 1000:6.2f}) r{r} {NAMES.get(ty, ty)} {kb}")
        prev = ns


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    global BOTH
    stage = int(sys.argv[2]) if len(sys.argv) > 2 else 40960
    BOTH = len(sys.argv) > 3 and sys.argv[3] == "both"
    t = load(sys.argv[1])
    summary("gate/up", t[0], stage)
    summary("down", t[1], stage)
    lim = int(__import__("os").environ.get("TRACE_EVENTS", "120"))
    timeline("gate/up", t[0], lim)
    timeline("down", t[1], lim)
    return 0


if __name__ == "__main__":
    sys.exit(main())
