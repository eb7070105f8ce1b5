#!/usr/bin/env python3
"""cover_pick.py — add to a committed corpus the few inputs that cover the most new edges.

    fuzz/cover_pick.py [--max N] [--dry-run] BINARY CORPUS_DIR SCRATCH_DIR...

libFuzzer's -merge=1 keeps every input that adds a feature, in order of size: after a
run of fuzz_model that is a hundred or more files, most of them adding one error branch
each. This asks BINARY for the edges of every input on its own (one -merge=1 run per
file, -use_counters=0, so edges only), then adds to CORPUS_DIR, greedily, the input of
the scratch directories that covers the most edges the corpus does not, until nothing
is left or N files are added (default 30). Files already in CORPUS_DIR are kept.

Environment (ASAN_OPTIONS, ...) is passed to BINARY as it is.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile


def edges(binary, path, work):
    """The set of edges (libFuzzer features with -use_counters=0) of one input."""
    one = os.path.join(work, "one")
    empty = os.path.join(work, "empty")
    ctl = os.path.join(work, "ctl")
    for d in (one, empty):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    shutil.copy(path, one)
    if os.path.exists(ctl):
        os.remove(ctl)  # an existing control file would be resumed, not rewritten
    subprocess.run([binary, "-merge=1", "-use_counters=0", "-merge_control_file=" + ctl, empty, one],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    got = set()
    if os.path.exists(ctl):
        for line in open(ctl):
            if line.startswith("FT "):
                got.update(int(x) for x in line.split()[2:])
    return got


def files_of(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=30, help="add at most this many files (default 30)")
    ap.add_argument("--dry-run", action="store_true", help="only say what would be added")
    ap.add_argument("binary")
    ap.add_argument("corpus")
    ap.add_argument("scratch", nargs="+")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cover_pick-") as work:
        covered = set()
        for f in files_of(a.corpus):
            covered |= edges(a.binary, f, work)
        have = {os.path.basename(f) for f in files_of(a.corpus)}
        cand = {}
        for d in a.scratch:
            for f in files_of(d):
                if os.path.basename(f) not in have:
                    cand[f] = edges(a.binary, f, work) - covered
        start = len(covered)
        added = []
        while len(added) < a.max:
            best = max(cand, key=lambda f: (len(cand[f] - covered), -os.path.getsize(f)), default=None)
            if best is None or not cand[best] - covered:
                break
            added.append((best, len(cand[best] - covered)))
            covered |= cand.pop(best)
        left = len(set().union(*cand.values()) - covered) if cand else 0
        print(f"corpus: {start} edges; added {len(added)} files for {len(covered) - start} more "
              f"({left} edges of the scratch inputs left out)")
        for f, g in added:
            print(f"  +{g:3d}  {f}")
            if not a.dry_run:
                shutil.copy(f, a.corpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
