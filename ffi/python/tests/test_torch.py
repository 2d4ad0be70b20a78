"""PyTorch tests of the "oxccl" backend (CPU): every operation checked exactly, async works and
futures, the group's timeout, abort, an FSDP2-style all_gather_into_tensor/reduce_scatter_tensor round
trip, and DDP training for 20 steps with 2 and 3 ranks compared with Gloo.

Run: python ffi/python/tests/test_torch.py   (.ci/run does, with torch from its venv)
"""

import faulthandler
import os
import socket
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(rank, world, port, backend, timeout=60):
    import oxccl.torch  # noqa: F401  (registers the backend)

    # a rank that dies of a signal prints every thread's Python and C++ stack (CI's only clue)
    faulthandler.enable(all_threads=True)
    torch._C._set_print_stack_traces_on_fatal_signal(True)

    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout),
    )


def ops_worker(rank, world, port):
    setup(rank, world, port, "oxccl")
    n = world
    # all_reduce: every op, integer and float types, exact
    for dtype in (torch.int32, torch.int64, torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.uint8):
        base = torch.arange(1, 8, dtype=torch.int64)
        for op, want in (
            (dist.ReduceOp.SUM, base * n * (n + 1) // 2),
            (dist.ReduceOp.MAX, base * n),
            (dist.ReduceOp.MIN, base * 1),
        ):
            t = (base * (rank + 1)).to(dtype)
            dist.all_reduce(t, op=op)
            assert torch.equal(t, want.to(dtype)), (dtype, op, t, want)
    t = torch.full((5,), float(rank + 1), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    assert torch.equal(t, torch.full((5,), float(torch.arange(1, n + 1).prod()), dtype=torch.float64))
    t = torch.full((4,), float(2 * rank), dtype=torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert torch.equal(t, torch.full((4,), float(n - 1))), t
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
    assert torch.equal(t, torch.full((3,), float(n * (n + 1)))), t
    # all_gather (list and into tensor)
    outs = [torch.zeros(3, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(outs, torch.full((3,), rank, dtype=torch.int64))
    assert all(torch.equal(o, torch.full((3,), q, dtype=torch.int64)) for q, o in enumerate(outs))
    out = torch.zeros(3 * n)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank)))
    assert torch.equal(out, torch.arange(n).repeat_interleave(3).float())
    # reduce_scatter (list and tensor)
    out = torch.zeros(2)
    dist.reduce_scatter(out, [torch.full((2,), float(rank + q)) for q in range(n)])
    assert torch.equal(out, torch.full((2,), float(sum(r + rank for r in range(n)))))
    out = torch.zeros(2, dtype=torch.int32)
    dist.reduce_scatter_tensor(out, torch.arange(2 * n, dtype=torch.int32) + rank)
    want = (torch.arange(2 * n, dtype=torch.int32) * n + n * (n - 1) // 2)[2 * rank : 2 * rank + 2]
    assert torch.equal(out, want), (out, want)
    # broadcast, reduce, gather, scatter
    t = torch.full((6,), float(rank))
    dist.broadcast(t, src=n - 1)
    assert torch.equal(t, torch.full((6,), float(n - 1)))
    t = torch.full((2,), float(rank + 1))
    dist.reduce(t, dst=0)
    if rank == 0:
        assert torch.equal(t, torch.full((2,), float(n * (n + 1) // 2)))
    g = [torch.zeros(2) for _ in range(n)] if rank == 1 else None
    dist.gather(torch.full((2,), float(rank)), gather_list=g, dst=1)
    if rank == 1:
        assert all(torch.equal(x, torch.full((2,), float(q))) for q, x in enumerate(g))
    out = torch.zeros(2)
    dist.scatter(out, [torch.full((2,), float(q * 10)) for q in range(n)] if rank == 0 else None, src=0)
    assert torch.equal(out, torch.full((2,), float(rank * 10)))
    # all_to_all_single: even and uneven splits
    inp = torch.arange(n * 2, dtype=torch.float32) + 100 * rank
    out = torch.zeros(n * 2)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 100 * q for q in range(n)])
    assert torch.equal(out, want), (out, want)
    in_splits = [q + 1 for q in range(n)]  # rank sends q+1 rows to rank q
    inp = torch.full((sum(in_splits), 2), float(rank))
    out_splits = [rank + 1] * n
    out = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    want = torch.cat([torch.full((rank + 1, 2), float(q)) for q in range(n)])
    assert torch.equal(out, want)
    # send/recv and batch_isend_irecv in a ring
    right, left = (rank + 1) % n, (rank - 1) % n
    if rank % 2 == 0:
        dist.send(torch.full((4,), float(rank)), dst=right)
        t = torch.zeros(4)
        dist.recv(t, src=left)
    else:
        t = torch.zeros(4)
        dist.recv(t, src=left)
        dist.send(torch.full((4,), float(rank)), dst=right)
    assert torch.equal(t, torch.full((4,), float(left)))
    r = torch.zeros(3)
    reqs = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.full((3,), float(rank)), right), dist.P2POp(dist.irecv, r, left)]
    )
    for q in reqs:
        q.wait()
    assert torch.equal(r, torch.full((3,), float(left)))
    # async: work.wait and get_future, several in flight
    ts = [torch.full((1000,), float(rank + i)) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    fut = works[-1].get_future()
    for w in works:
        w.wait()
    assert fut.wait()[0] is ts[-1] or torch.equal(fut.wait()[0], ts[-1])
    for i, t in enumerate(ts):
        assert torch.equal(t, torch.full((1000,), float(n * i + n * (n - 1) // 2)))
    dist.barrier()
    # under torch.profiler, each operation is a "nccl:<op>" range in the Chrome trace
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dist.all_reduce(torch.ones(8))
        dist.all_gather_into_tensor(torch.zeros(2 * n), torch.ones(2))
        dist.broadcast(torch.ones(3), src=0)
    trace = os.path.join(tempfile.gettempdir(), f"oxccl-prof-{os.getpid()}.json")
    prof.export_chrome_trace(trace)
    import json

    with open(trace) as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    os.unlink(trace)
    for want in ("nccl:all_reduce", "nccl:_allgather_base", "nccl:broadcast"):
        assert want in names, (want, sorted(x for x in names if x and "nccl" in x))
    dist.destroy_process_group()


def timeout_worker(rank, world, port):
    setup(rank, world, port, "oxccl", timeout=3)
    if rank == 1:
        time.sleep(8)  # never joins the collective in time
        dist.destroy_process_group()
        return
    t0 = time.time()
    try:
        dist.all_reduce(torch.ones(4))
        raise AssertionError("the all_reduce should have timed out")
    except RuntimeError as e:
        took = time.time() - t0
        assert took < 7, f"timeout honoured late: {took:.1f} s"
        msg = str(e)
        assert "ncclTimeout" in msg and " Timed out " in msg, msg  # torch's words, then oxccl's
        if "ncclTimeout" in msg:
            assert "1" in msg.split("ncclTimeout", 1)[1], f"the hang report should name rank 1: {msg}"
        print(f"rank {rank}: timed out after {took:.1f} s: {msg[:300]}", flush=True)


def abort_worker(rank, world, port):
    setup(rank, world, port, "oxccl")
    if rank == 1:
        time.sleep(2)  # never joins the all_reduce
        dist.destroy_process_group()
        return
    import oxccl.torch as ot

    work = dist.all_reduce(torch.ones(4), async_op=True)  # runs on the backend's worker, waits
    time.sleep(0.2)
    impl = ot.backend_impl()
    t0 = time.time()
    impl.abort()
    took = time.time() - t0
    # the worker has handed the failure over and ended: the process may leave at once
    assert not impl._worker.is_alive() and work.is_completed() and not work.is_success()
    try:
        work.wait()
        raise AssertionError("the aborted all_reduce should have failed")
    except RuntimeError as e:
        print(f"rank 0: abort took {took:.2f} s; the all_reduce failed: {str(e)[:200]}", flush=True)


def fsdp_worker(rank, world, port):
    setup(rank, world, port, "oxccl")
    shard = torch.arange(5, dtype=torch.float32) + 10 * rank
    full = torch.empty(5 * world)
    dist.all_gather_into_tensor(full, shard)
    assert torch.equal(full, torch.cat([torch.arange(5, dtype=torch.float32) + 10 * q for q in range(world)]))
    grad = torch.empty(5)
    dist.reduce_scatter_tensor(grad, full)  # every rank contributes the same full tensor
    assert torch.equal(grad, shard * world)
    dist.destroy_process_group()


def ddp_worker(rank, world, port, backend, path):
    setup(rank, world, port, backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(20):
        x = torch.randn(32, 8, generator=gen)
        y = torch.randn(32, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    # integer sums must be equal, not just close
    ints = torch.arange(1000, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(ints)
    if rank == 0:
        torch.save({"params": [p.detach().clone() for p in model.parameters()], "ints": ints}, path)
    dist.destroy_process_group()
    if backend == "gloo":
        # torch's own gloo, not ours: destroy_process_group leaves gloo's worker threads running
        # while DDP still holds the group, and a worker that lets go of the last all_reduce's
        # tensor once the interpreter is finalizing aborts the process ("terminate called without
        # an active exception": runLoop -> TensorImpl::decref_pyobject -> pthread_exit). A short
        # DDP script did so in 5 of 12 runs here (oxccl: 0 of 25), and CI's two aborts of this
        # test (rank 1, that message) fit it. So the reference run skips finalization; ours not.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run(fn, world, *args):
    mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world, join=True, start_method="spawn")


def main():
    for world in (2, 3):
        run(ops_worker, world)
        print(f"ops: every operation exact on {world} ranks", flush=True)
    run(fsdp_worker, 2)
    print("fsdp: all_gather_into_tensor / reduce_scatter_tensor round trip", flush=True)
    run(timeout_worker, 2)
    print("timeout: the group's timeout is honoured", flush=True)
    run(abort_worker, 2)
    print("abort: the running operation fails and the worker has ended when abort returns", flush=True)
    with tempfile.TemporaryDirectory() as d:
        for world in (2, 3):
            res = {}
            for backend in ("oxccl", "gloo"):
                path = os.path.join(d, f"{backend}-{world}.pt")
                run(ddp_worker, world, backend, path)
                res[backend] = torch.load(path)
            assert torch.equal(res["oxccl"]["ints"], res["gloo"]["ints"])
            for a, b in zip(res["oxccl"]["params"], res["gloo"]["params"]):
                assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
            print(f"ddp: 20 steps on {world} ranks match gloo", flush=True)
    print("torch tests: OK")


if __name__ == "__main__":
    main()
