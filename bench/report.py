#!/usr/bin/env python3
"""report.py OUT_DIR BENCH_DIR - turn bench/compare.sh runs into bench/RESULTS.md and SVG charts.
report.py --cells OUT_DIR - print each configuration's median and range per size (no files written).

Each OUT_DIR/<config>.run<N>.txt is one run. Data lines of oxccl-perf, mpi_allreduce_bench and
gloo_allreduce_bench share the nccl-tests columns (size count type redop X time_us algbw busbw ...);
the ideal probe prints "<size> B median <t> us busbw <x> GB/s"; iperf3 a receiver line; membw its
table. Medians are taken per config and size across rounds; ratios compare medians of one run of
the script (interleaved rounds), never numbers from different runs.
"""
import glob
import os
import re
import statistics
import sys
from collections import defaultdict

SIZES = [8, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def nccl_row(p):
    """A data line of the nccl-tests columns, split: (size, (time_us, busbw) out of place,
    (time_us, busbw) in place or None), or None if it is not one."""
    if not (len(p) >= 8 and p[0].isdigit() and p[2] in ("float", "float32")):
        return None
    try:
        in_place = (float(p[9]), float(p[11])) if len(p) >= 12 else None
        return int(p[0]), (float(p[5]), float(p[7])), in_place
    except ValueError:
        return None


def parse(out):
    data = defaultdict(lambda: defaultdict(list))  # cfg -> size -> [(time_us, busbw)]
    extra = defaultdict(list)  # cfg -> [floats] (iperf Gbit/s, membw memcpy GB/s)
    for path in glob.glob(os.path.join(out, "*.run*.txt")):
        cfg = re.sub(r"\.run\d+\.txt$", "", os.path.basename(path))
        for line in open(path, errors="replace"):
            p = line.split()
            m = re.match(r"\s*(\d+) B\s+median\s+([\d.]+) us\s+busbw\s+([\d.]+) GB/s", line)
            if m:
                data[cfg][int(m.group(1))].append((float(m.group(2)), float(m.group(3))))
            elif (row := nccl_row(p)) is not None:
                size, out_of_place, in_place = row
                data[cfg][size].append(out_of_place)
                if cfg.startswith("oxccl") and in_place:  # oxccl-perf's in-place columns
                    data[cfg + "-inplace"][size].append(in_place)
            elif "receiver" in line:
                m = re.search(r"([\d.]+) (G|M)bits/sec", line)
                if m:
                    extra[cfg].append(float(m.group(1)) / (1000 if m.group(2) == "M" else 1))
            elif len(p) >= 5 and p[0] == "memcpy" and p[1] == "1":
                extra["memcpy1"].append(float(p[3]))
    return data, extra


def med(data, cfg, size, idx):
    rows = data.get(cfg, {}).get(size)
    return statistics.median(r[idx] for r in rows) if rows else None


def fmt(x, unit=""):
    return "–" if x is None else (f"{x:.2f}{unit}" if x < 100 else f"{x:.0f}{unit}")


def ratio(a, b):
    return "–" if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def table(data, n, kind, peers):
    """Rows per size: oxccl busbw (or 8 B latency) and each peer, plus ratios; oxccl's in-place
    numbers in a last column."""
    ox = f"oxccl-{kind}-{n}"
    head = ["size", f"oxccl {kind}"] + [p for p, _ in peers] + [f"oxccl / {p}" for p, _ in peers] + ["oxccl in-place"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in SIZES:
        if s == 8:
            vals = [med(data, ox, s, 0)] + [med(data, c, s, 0) for _, c in peers]
            # latency: lower is better, so the ratio is peer / oxccl
            rs = [ratio(v, vals[0]) for v in vals[1:]]
            cells = [f"8 B latency (µs)"] + [fmt(v) for v in vals] + [r + " faster" if r != "–" else r for r in rs] + [fmt(med(data, ox + "-inplace", s, 0))]
        else:
            vals = [med(data, ox, s, 1)] + [med(data, c, s, 1) for _, c in peers]
            cells = [human(s) + " busbw (GB/s)"] + [fmt(v) for v in vals] + [ratio(vals[0], v) for v in vals[1:]] + [fmt(med(data, ox + "-inplace", s, 1))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def svg(data, series, title, path):
    import math
    W, H, L, B = 720, 420, 70, 50
    pts = {name: [(s, med(data, cfg, s, 1)) for s in SIZES if s > 8 and med(data, cfg, s, 1)] for name, cfg in series}
    ymax = max([v for p in pts.values() for _, v in p] + [1.0])
    xs = [math.log2(s) for s in SIZES if s > 8]
    x0, x1 = min(xs), max(xs)
    X = lambda s: L + (math.log2(s) - x0) / (x1 - x0) * (W - L - 20)
    Y = lambda v: H - B - v / ymax * (H - B - 40)
    colors = ["#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#7f7f7f"]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
         f'<line x1="{L}" y1="{H - B}" x2="{W - 20}" y2="{H - B}" stroke="black"/>',
         f'<line x1="{L}" y1="{H - B}" x2="{L}" y2="30" stroke="black"/>',
         f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">message size</text>',
         f'<text x="15" y="{H / 2}" transform="rotate(-90 15 {H / 2})" text-anchor="middle">busbw (GB/s, median)</text>']
    for s in SIZES[1:]:
        o.append(f'<text x="{X(s):.1f}" y="{H - B + 16}" text-anchor="middle">{human(s)}</text>')
    for i in range(6):
        v = ymax * i / 5
        o.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
        o.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W - 20}" y2="{Y(v):.1f}" stroke="#ddd"/>')
    for i, (name, p) in enumerate(pts.items()):
        if not p:
            continue
        c = colors[i % len(colors)]
        o.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="' + " ".join(f"{X(s):.1f},{Y(v):.1f}" for s, v in p) + '"/>')
        o.append(f'<text x="{L + 10}" y="{40 + 16 * i}" fill="{c}">{name}</text>')
    o.append("</svg>")
    open(path, "w").write("\n".join(o))


SECTION = re.compile(r"<!-- section:(\w+) -->.*?<!-- /section:\1 -->\n?", re.S)


def sections(text):
    """Marked sections of a RESULTS.md ({name: text}); each comes from its own run (a later,
    narrower run of compare.sh, or hand-kept notes) and survives regeneration of the rest."""
    return {m.group(1): m.group(0).rstrip("\n") for m in SECTION.finditer(text)}


def net_section(data, machine, rounds):
    """The RDMA protocol over libfabric against oxccl's TCP and Open MPI's ofi and tcp paths."""
    md = ["<!-- section:ofi -->", "## RDMA protocol over libfabric (`OXCCL_NET=ofi`, provider `tcp;ofi_rxm`), network-namespace hosts", "",
          f"From one run of `bench/compare.sh REPS ofi` ({rounds} interleaved rounds; medians): oxccl over libfabric,",
          "oxccl's own TCP, Open MPI with `pml cm` + `mtl ofi` on the same provider, and Open MPI's TCP BTL.",
          "The provider is libfabric's software emulation over TCP sockets, so this measures the protocol's",
          "cost (one write carrying its notification per chunk, a CREDIT per half ring, manual progress), not RDMA hardware.", "", machine]
    for n in (2, 4):
        if not data.get(f"oxccl-ofi-{n}"):
            continue
        md += [f"### {n} hosts", "", table(data, n, "ofi", [("oxccl TCP", f"oxccl-tcp-{n}"), ("Open MPI ofi", f"ompi-ofi-{n}"), ("Open MPI tcp", f"ompi-tcp-{n}")]), ""]
    md.append("<!-- /section:ofi -->")
    return "\n".join(md)


def spreads(out):
    """Each configuration's median and range per size (8 B: time in µs; larger: busbw in GB/s)
    over the rounds in `out`, for a run of chosen configurations (compare.sh with CONFIGS)."""
    data, _ = parse(out)
    print("| config | size | rounds | median | min | max |")
    print("|---|---|---|---|---|---|")
    for cfg in sorted(data):
        for size in sorted(data[cfg]):
            idx = 0 if size <= 8 else 1
            vals = sorted(r[idx] for r in data[cfg][size])
            unit = " µs" if idx == 0 else " GB/s"
            print(f"| {cfg} | {human(size)} | {len(vals)} | {fmt(statistics.median(vals), unit)} | "
                  f"{fmt(vals[0])} | {fmt(vals[-1])} |")


def main():
    if sys.argv[1] == "--cells":
        spreads(sys.argv[2])
        return
    out, bench = sys.argv[1], sys.argv[2]
    results = os.path.join(bench, "RESULTS.md")
    old = open(results).read() if os.path.exists(results) else ""
    kept = sections(old)
    data, extra = parse(out)
    rounds = max((len(v) for d in data.values() for v in d.values()), default=0)
    machine = open(os.path.join(out, "machine.txt")).read() if os.path.exists(os.path.join(out, "machine.txt")) else ""
    md = ["# Benchmark results", "",
          "Produced by `bench/compare.sh` (then `bench/report.py`): oxccl-perf and the peers' anchors from",
          "`../shared/anchors/`, run interleaved in the same session (every configuration once per round),",
          f"{rounds} rounds; cells are medians; float32 sum allreduce unless named; ratios are oxccl over the",
          "peer (for 8 B latency: the peer's time over oxccl's). Numbers from different runs of the script",
          "are never mixed. oxccl-perf is built with the `perf` profile (fat LTO; Cargo.toml). Machine:", "",
          machine]
    if data.get("oxccl-ofi-2") and not data.get("oxccl-shm-2"):
        # a network-only run: replace its section, keep the rest of RESULTS.md as it is
        kept["ofi"] = net_section(data, machine, rounds)
        text = SECTION.sub("", old).rstrip("\n") + "\n\n" + "\n\n".join(kept.values()) + "\n"
        open(results, "w").write(text)
        print(kept["ofi"])
        return
    if extra.get("memcpy1"):
        md.append(f"memcpy bandwidth (1 thread, 256 MiB, read+write counted): median {statistics.median(extra['memcpy1']):.1f} GB/s\n")
    if data.get("oxccl-shm-2"):
        md += ["## Shared memory, 2 ranks", "",
               table(data, 2, "shm", [("Open MPI", "ompi-shm-2"), ("MPICH", "mpich-shm-2"), ("Gloo", "gloo-lo-2"), ("ideal probe", "ideal-shm-2")]), "",
               "![shm 2 ranks](shm2.svg)", ""]
        svg(data, [("oxccl", "oxccl-shm-2"), ("ideal probe", "ideal-shm-2"), ("Open MPI", "ompi-shm-2"), ("MPICH", "mpich-shm-2"), ("Gloo", "gloo-lo-2")], "allreduce busbw, 2 ranks, shared memory", os.path.join(bench, "shm2.svg"))
        md += ["### Other collectives, 2 ranks (busbw GB/s, out of place; goal: within 10% of allreduce and ≥ 2× Open MPI)", "",
               "Open MPI's numbers come from `bench/peers/mpi_colls_bench.c` and Gloo's from",
               "`bench/peers/gloo_colls_bench.py` (the anchors measure all-reduce only), with nccl-tests' size and",
               "busbw conventions; – where Gloo lacks the collective.",
               "Broadcast is compared in place: `MPI_Bcast` and Gloo's broadcast have one buffer, while",
               "oxccl's out-of-place broadcast (shown beside it) also copies the root's input to its output,",
               "a step neither peer takes.", ""]
        head, rule = "| size | allreduce", "|---|---"
        for name in ("allgather", "reducescatter", "broadcast (in place)"):
            extra_col = " | out of place" if name.startswith("broadcast") else ""
            head += f" | {name}{extra_col} | Open MPI | ratio | Gloo | ratio | / allreduce"
            rule += "|---|---|---|---|---|---" + ("|---" if extra_col else "")
        md += [head + " |", rule + "|"]
        for s in SIZES[1:]:
            ar = med(data, "oxccl-shm-2", s, 1)
            cells = [fmt(ar)]
            for c in ("ag", "rs", "bc"):
                ours = med(data, f"oxccl-{c}-shm-2" + ("-inplace" if c == "bc" else ""), s, 1)
                mpi, gloo = med(data, f"ompi-{c}-shm-2", s, 1), med(data, f"gloo-{c}-lo-2", s, 1)
                cells += [fmt(ours)] + ([fmt(med(data, "oxccl-bc-shm-2", s, 1))] if c == "bc" else [])
                cells += [fmt(mpi), ratio(ours, mpi), fmt(gloo), ratio(ours, gloo), ratio(ours, ar)]
            md.append(f"| {human(s)} | " + " | ".join(cells) + " |")
        md.append("")
        if glob.glob(os.path.join(out, "floor-shm-2.run*.txt")):
            import floor  # (bench/floor.py, beside this file)
            md += ["### 8 B–64 KiB against the bare data movement, 2 ranks (µs; `bench/floor.py`)", "",
                   "The floor is the best of `bench/probes/block_exchange.c`'s three ways to move the bytes each",
                   "collective needs between the two processes, measured in the same rounds, with no reduction and no",
                   "local copy counted (a lower bound). Times are per call, oxccl's the better of out of place and in",
                   "place. `floor / ask` above 1: the goal (4–64 KiB ≥ 2× Open MPI, 8 B ≤ Open MPI) asks for less time",
                   "than the bare movement takes on this machine.", "", floor.table(out), ""]
    for n in (4, 8):
        if data.get(f"oxccl-shm-{n}"):
            peers = [("Open MPI", f"ompi-shm-{n}"), ("MPICH", f"mpich-shm-{n}"), ("Gloo", f"gloo-lo-{n}")]
            peers = [(name, cfg) for name, cfg in peers if data.get(cfg)]
            md += [f"## Shared memory, {n} ranks on 2 cores (oversubscribed)", "", table(data, n, "shm", peers), ""]
    for n in (2, 4):
        if data.get(f"oxccl-tcp-{n}"):
            md += [f"## TCP, {n} network-namespace hosts", "",
                   table(data, n, "tcp", [("Open MPI", f"ompi-tcp-{n}"), ("Gloo", f"gloo-tcp-{n}")]), ""]
            if n == 2:
                svg(data, [("oxccl", "oxccl-tcp-2"), ("Open MPI", "ompi-tcp-2"), ("Gloo", "gloo-tcp-2")], "allreduce busbw, 2 hosts, TCP", os.path.join(bench, "tcp2.svg"))
                md += ["![tcp 2 hosts](tcp2.svg)", ""]
                if extra.get("iperf-tcp-2"):
                    raw = statistics.median(extra["iperf-tcp-2"]) / 8
                    big = med(data, "oxccl-tcp-2", 256 << 20, 1)
                    md.append(f"Raw single-stream TCP between the two hosts (iperf3): median {raw:.2f} GB/s; oxccl busbw at 256 MiB is "
                              f"{fmt(big)} GB/s = {ratio(big, raw)} of it.\n")
    if data.get("oxccl-ofi-2"):
        kept["ofi"] = net_section(data, machine, rounds)
    if os.path.exists(os.path.join(bench, "ANALYSIS.md")):
        # one copy: the analysis is linked, not pasted
        md += ["", "The analysis of these figures (what each goal's gap is, and why) is kept in bench/ANALYSIS.md."]
    md += [""] + list(kept.values())
    open(results, "w").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
