#!/usr/bin/env python3
"""gloo_colls_bench.py - Gloo's all-gather, reduce-scatter and broadcast through torch.distributed,
for bench/compare.sh: the Gloo cells of oxccl's other-collectives table (the anchors in
../shared/anchors measure all-reduce only). Output format and conventions as
bench/peers/mpi_colls_bench.c (nccl-tests'): size = the whole buffer (all-gather: output,
reduce-scatter: input, broadcast: buffer); busbw = algbw * (n-1)/n for all-gather and
reduce-scatter, algbw for broadcast. Results are checked (exact values); a collective this
torch's Gloo lacks prints one "# unsupported" line instead of rows.

Run: python3 gloo_colls_bench.py -c allgather|reducescatter|broadcast [--nproc 2] [--sizes 8,4K,1M]
"""
import argparse
import datetime
import socket
import sys
import time


def parse_size(s):
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def one_call(dist, coll, world, rank, src, dst):
    """One call on `src`/`dst` (float32); returns how many results are wrong."""
    if coll == "allgather":
        dist.all_gather_into_tensor(dst, src)
        chunk = src.numel()
        return sum(int((dst[r * chunk:(r + 1) * chunk] != r + 1).sum()) for r in range(world))
    if coll == "reducescatter":
        dist.reduce_scatter_tensor(dst, src)
        return int((dst != world * (world + 1) / 2).sum())
    dist.broadcast(src, src=0)
    return int((src != 1).sum())


def bench(rank, world, port, args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    sizes = [max(4 * world, parse_size(s) // (4 * world) * 4 * world) for s in args.sizes.split(",")]
    factor = 1.0 if args.coll == "broadcast" else (world - 1) / world
    if rank == 0:
        print(f"# gloo_colls_bench: {args.coll}, nranks {world}, torch {torch.__version__}, float32, loopback",
              flush=True)
    for nbytes in sizes:
        total = nbytes // 4
        per = total // world
        src = torch.full((per if args.coll == "allgather" else total,), float(rank + 1))
        dst = torch.empty(total if args.coll == "allgather" else per)
        try:
            wrong = one_call(dist, args.coll, world, rank, src, dst)
        except (RuntimeError, NotImplementedError) as e:
            if rank == 0:
                print(f"# unsupported: {args.coll} on gloo in torch {torch.__version__}: {str(e).splitlines()[0]}")
            break
        if args.coll == "broadcast":
            src.fill_(float(rank + 1))
        call = lambda: one_call(dist, args.coll, world, rank, src, dst)  # noqa: E731
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(3):
            call()
        probe = (time.perf_counter() - t0) / 3
        it = torch.tensor([min(100000, max(3, int(args.target / max(probe, 1e-9))))], dtype=torch.int64)
        dist.broadcast(it, src=0)
        iters = int(it.item())
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            if args.coll == "allgather":
                dist.all_gather_into_tensor(dst, src)
            elif args.coll == "reducescatter":
                dist.reduce_scatter_tensor(dst, src)
            else:
                dist.broadcast(src, src=0)
        dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(dt)
        w = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(w)
        tm = dt.item() / world
        algbw = nbytes / tm / 1e9
        if rank == 0:
            print(f" {nbytes:>12} {total:>12} {'float':>6} {'sum':>6} {iters:>8} {tm * 1e6:>12.2f} "
                  f"{algbw:>12.3f} {algbw * factor:>12.3f} {int(w.item()):>7}", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", "--coll", choices=["allgather", "reducescatter", "broadcast"], required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--sizes", default="8,4K,64K,1M,16M,64M,256M")
    ap.add_argument("--target", type=float, default=0.25)
    args = ap.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(bench, args=(args.nproc, port, args), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    sys.exit(main())
