"""oxccl's torch.distributed backend against gloo, side by side, interleaved rounds.

    python bench/torch_bench.py [ROUNDS=5] [WORLDS=2,4]

Per round and world size, each backend in turn (gloo, oxccl, gloo, ...) measures, through
torch.distributed on CPU tensors:
- 8 B all_reduce latency (median per call of 2000 blocking calls);
- all_reduce busbw at 1 MiB and 64 MiB (2(n-1)/n x bytes / time, median of the iterations);
- a DDP training step (forward, backward with its gradient all-reduces, SGD), for a small MLP
  (0.3M parameters) and a ~25M-parameter one, median of 10 steps after 3 warm-up steps.
Prints a markdown table of medians over the rounds, with oxccl/gloo ratios.
"""

import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, n):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def model(width, depth):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def worker(rank, world, backend, p, out):
    if backend == "oxccl":
        import oxccl.torch  # noqa: F401
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{p}", rank=rank, world_size=world)
    r = {}
    small = torch.ones(2)  # 8 bytes
    for _ in range(200):
        dist.all_reduce(small)
    r["lat8_us"] = timed(lambda: dist.all_reduce(small), 2000) * 1e6
    for name, nbytes, iters in (("bw1M", 1 << 20, 100), ("bw64M", 64 << 20, 8)):
        t = torch.ones(nbytes // 4)
        dist.all_reduce(t)
        r[name] = 2 * (world - 1) / world * nbytes / timed(lambda: dist.all_reduce(t), iters) / 1e9
    for name, width, depth in (("ddp_small_ms", 384, 2), ("ddp_25M_ms", 1580, 10)):
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(model(width, depth))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x = torch.randn(8, width)

        def step():
            opt.zero_grad()
            ddp(x).sum().backward()
            opt.step()

        for _ in range(3):
            step()
        r[name] = timed(step, 10) * 1e3
    if rank == 0:
        torch.save(r, out)
    dist.destroy_process_group()


def run(backend, world):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.pt")
        mp.start_processes(worker, args=(world, backend, port(), out), nprocs=world, start_method="spawn")
        return torch.load(out)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    worlds = [int(w) for w in (sys.argv[2] if len(sys.argv) > 2 else "2,4").split(",")]
    res = {}
    for rnd in range(rounds):
        for world in worlds:
            for backend in ("gloo", "oxccl") if rnd % 2 == 0 else ("oxccl", "gloo"):
                for k, v in run(backend, world).items():
                    res.setdefault((world, k), {}).setdefault(backend, []).append(v)
        print(f"round {rnd + 1}/{rounds} done", file=sys.stderr, flush=True)
    names = {
        "lat8_us": ("8 B all_reduce latency (µs)", False),
        "bw1M": ("1 MiB all_reduce busbw (GB/s)", True),
        "bw64M": ("64 MiB all_reduce busbw (GB/s)", True),
        "ddp_small_ms": ("DDP step, MLP 0.3M params (ms)", False),
        "ddp_25M_ms": ("DDP step, MLP 25M params (ms)", False),
    }
    print("| ranks | measure | gloo | oxccl | oxccl vs gloo |")
    print("|---|---|---|---|---|")
    for (world, k), v in res.items():
        g, o = statistics.median(v["gloo"]), statistics.median(v["oxccl"])
        label, higher = names[k]
        ratio = o / g if higher else g / o
        print(f"| {world} | {label} | {g:.3g} | {o:.3g} | {ratio:.2f}× |")


if __name__ == "__main__":
    main()
