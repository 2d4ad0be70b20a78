#!/usr/bin/env python3
"""floor.py OUT_DIR - the 2-rank shared-memory cells of 8 B-64 KiB against the floor that
bench/probes/block_exchange.c measured in the same rounds (compare.sh config floor-shm-2).

A cell's floor is the bare data movement its collective needs between two processes, the best
of the probe's three ways (two copies through shared memory, per-line flags, one copy by
process_vm_readv), with no reduction and no local copy counted, so a lower bound:
  all-gather of S bytes: each rank's block of S/2 to the other: exchange(S/2);
  reduce-scatter of S: each rank's other half to the other: exchange(S/2);
  all-reduce of S: the whole buffer each way, or half each way twice (reduce-scatter then
  all-gather): min(exchange(S), 2 * exchange(S/2)); at 8 B exchange(8).
Per round: the floor, oxccl's time (the better of out of place and in place), Open MPI's, and
what the goal asks: 4-64 KiB at least 2x Open MPI (half its time), 8 B at most Open MPI's time. `floor / ask` above 1 means the goal is below what
the bare movement takes here: out of reach by measurement, not by argument. Medians over the
rounds; the last column counts the rounds in which the floor was above the ask.
"""
import glob
import os
import re
import statistics
import sys
from collections import defaultdict

from report import human, nccl_row  # (bench/report.py, beside this file)

CELLS = [  # (collective, oxccl config, Open MPI config)
    ("all-reduce", "oxccl-shm-2", "ompi-shm-2"),
    ("all-gather", "oxccl-ag-shm-2", "ompi-ag-shm-2"),
    ("reduce-scatter", "oxccl-rs-shm-2", "ompi-rs-shm-2"),
]
LINE = re.compile(r"\s*(\d+) B\s+stage ([\d.]+) .*?ll ([\d.]+) .*?cma ([\d.]+)")


def runs(out, cfg):
    """Round number -> path of each run of `cfg`."""
    pat = os.path.join(out, f"{cfg}.run*.txt")
    return {int(re.search(r"\.run(\d+)\.txt$", p).group(1)): p for p in glob.glob(pat)}


def exchanges(path):
    """Block size -> (best µs, way) of one probe run."""
    best = {}
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if m:
            ways = {"stage": float(m.group(2)), "ll": float(m.group(3)), "cma": float(m.group(4))}
            w = min(ways, key=ways.get)
            best[int(m.group(1))] = (ways[w], w)
    return best


def times(path):
    """Size -> best µs of one nccl-tests style run (the better of the out-of-place and in-place
    columns where there are both)."""
    t = {}
    for line in open(path, errors="replace"):
        row = nccl_row(line.split())
        if row is not None:
            size, out_of_place, in_place = row
            t[size] = min(out_of_place[0], in_place[0]) if in_place else out_of_place[0]
    return t


def floor_of(coll, size, ex):
    """The floor of `coll` at `size` bytes from one round's exchanges and the way that gave
    it, or None."""
    half = ex.get(size // 2) if size >= 16 else None
    whole = ex.get(size)
    if coll == "all-reduce":
        options = ([(whole[0], whole[1])] if whole else []) + ([(2 * half[0], f"2x {half[1]}")] if half else [])
        return min(options) if options else None
    return half


def ask(size, ompi):
    """The time the goal allows a cell whose Open MPI time is `ompi`."""
    return ompi if size <= 8 else ompi / 2


def rows(out):
    """One row per (collective, size) with a floor, oxccl and Open MPI in the same rounds."""
    probe = {r: exchanges(p) for r, p in runs(out, "floor-shm-2").items()}
    result = []
    for coll, ox, mpi in CELLS:
        oxr = {r: times(p) for r, p in runs(out, ox).items()}
        mpir = {r: times(p) for r, p in runs(out, mpi).items()}
        per = defaultdict(list)  # size -> [(floor, oxccl, ompi, way)]
        for r, ex in probe.items():
            for size in set(oxr.get(r, {})) & set(mpir.get(r, {})):
                f = floor_of(coll, size, ex)
                if f is not None and size <= 64 << 10:
                    per[size].append((f[0], oxr[r][size], mpir[r][size], f[1]))
        for size in sorted(per):
            v = per[size]
            f, o, m = (statistics.median(x[i] for x in v) for i in range(3))
            above = sum(1 for x in v if x[0] > ask(size, x[2]))
            ways = [x[3] for x in v]
            result.append((coll, size, f, max(set(ways), key=ways.count), o, m, len(v), above))
    return result


def table(out):
    lines = ["| cell | floor µs (way) | oxccl µs | Open MPI µs | the goal asks µs | floor / ask | oxccl / floor | rounds floor > ask |",
             "|---|---|---|---|---|---|---|---|"]
    for coll, size, f, way, o, m, n, above in rows(out):
        lines.append(f"| {coll} {human(size)} | {f:.3f} ({way}) | {o:.3f} | {m:.3f} | {ask(size, m):.3f} | {f / ask(size, m):.2f} | "
                     f"{o / f:.2f} | {above} of {n} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1]))
