"""The "oxccl" backend behaves like a first-party c10d backend (issue 18): Work states, per-group
timeouts, TORCH_DISTRIBUTED_DEBUG=DETAIL, sequence numbers, bitwise ops, non-contiguous and
sparse tensors, coalesced operations, any-source receives, local argument errors, monitored_barrier. Exact values.

Run: python ffi/python/tests/test_torch_c10d.py   (.ci/run does)
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import oxccl.torch

sys.path.insert(0, os.path.dirname(__file__))
from test_torch import run, setup  # noqa: E402


def store():
    return dist.distributed_c10d._get_default_store()


def expect_error(fn, *words):
    try:
        fn()
    except RuntimeError as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return e
    raise AssertionError(f"expected an error containing {words}")


def work_worker(rank, world, port):
    setup(rank, world, port, "oxccl")
    assert "OXCCL_TIMEOUT" not in os.environ, "the backend must not set the process environment"
    t = torch.zeros(3)
    if rank == 1:
        w = dist.irecv(t, src=0)
        assert not w.is_completed() and not w.is_success(), "a receive with no sender yet is pending"
        e = expect_error(lambda: w.wait(timedelta(milliseconds=200)), "Timed out")
        assert isinstance(e, dist.DistBackendError), type(e)
        store().set("checked", "1")
        assert w.wait() and w.is_completed() and w.is_success() and w.exception() is None
        assert torch.equal(t, torch.tensor([1.0, 2.0, 3.0]))
        assert torch.equal(w.result()[0], t) and torch.equal(w.get_future().value()[0], t)
        expect_error(w._source_rank, "any source")
    else:
        store().wait(["checked"])
        dist.send(torch.tensor([1.0, 2.0, 3.0]), dst=1)
    # a group with its own short timeout; the world group keeps its 60 s
    g = dist.new_group([0, 1], timeout=timedelta(seconds=2))
    if rank == 0:
        w = dist.all_reduce(torch.ones(2), group=g, async_op=True)  # rank 1 never joins
        expect_error(w.wait, "Timed out", "ncclTimeout")
        assert w.is_completed() and not w.is_success()
        assert "Timed out" in str(w.exception())
    dist.barrier()  # the world group is unaffected
    seqs = [None] * world
    dist.all_gather_object(seqs, dist.group.WORLD._get_backend(torch.device("cpu"))._get_sequence_number_for_group())
    assert len(set(seqs)) == 1 and seqs[0] > 0, seqs
    dist.destroy_process_group()


def detail_worker(rank, world, port):
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    setup(rank, world, port, "oxccl")
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(world * (world + 1) // 2)))
    outs = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    assert all(torch.equal(o, torch.full((2,), float(q))) for q, o in enumerate(outs))
    sub = dist.new_group(list(range(world)))
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank}, group=sub)
    assert objs == [{"rank": q} for q in range(world)], objs
    # the debug wrapper catches a mismatch before it reaches oxccl
    if rank == 0:
        expect_error(lambda: dist.all_reduce(torch.ones(2)), "mismatch")
    else:
        expect_error(lambda: dist.broadcast(torch.ones(2), src=0), "mismatch")
    dist.destroy_process_group()


def bitwise_checks(rank, world):
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.int8):
        for op, fold in ((dist.ReduceOp.BAND, lambda a, b: a & b), (dist.ReduceOp.BOR, lambda a, b: a | b),
                         (dist.ReduceOp.BXOR, lambda a, b: a ^ b)):
            vals = [torch.tensor([0x5A ^ q, 1 << q, 0x7F - q], dtype=dtype) for q in range(world)]
            want = vals[0]
            for v in vals[1:]:
                want = fold(want, v)
            t = vals[rank].clone()
            dist.all_reduce(t, op=op)
            assert torch.equal(t, want), (dtype, op, t, want)
    b = torch.tensor([True, rank == 0, False])
    dist.all_reduce(b, op=dist.ReduceOp.BOR)
    assert torch.equal(b, torch.tensor([True, True, False]))
    expect_error(lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), "integer")


def layout_checks(rank, world):
    # non-contiguous tensors, in and out
    x = (torch.arange(6, dtype=torch.float32).view(2, 3) * (rank + 1)).t()
    dist.all_reduce(x)
    assert torch.equal(x, (torch.arange(6, dtype=torch.float32).view(2, 3) * (world * (world + 1) // 2)).t())
    outs = [torch.zeros(3, 2).t() for _ in range(world)]
    dist.all_gather(outs, torch.full((2, 3), float(rank)))
    assert all(torch.equal(o, torch.full((2, 3), float(q))) for q, o in enumerate(outs))
    # sparse: the same result as gloo's, bit for bit
    idx = torch.tensor([[rank, 3, rank + 1]])
    sp = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0, 4.0]) * (rank + 1), (world + 4,))
    ref = sp.clone()
    dist.all_reduce(sp)
    dist.all_reduce(ref, group=dist.new_group(backend="gloo"))
    sp, ref = sp.coalesce(), ref.coalesce()
    assert torch.equal(sp.indices(), ref.indices()) and torch.equal(sp.values(), ref.values()), (sp, ref)


def coalesced_checks(rank, world):
    ts = [torch.full((3,), float(rank)), torch.full((5,), 2.0 * rank)]
    dist.all_reduce_coalesced(ts)
    s = float(world * (world - 1) // 2)
    assert torch.equal(ts[0], torch.full((3,), s)) and torch.equal(ts[1], torch.full((5,), 2 * s))
    outs = [[torch.zeros(2), torch.zeros(1)] for _ in range(world)]
    dist.all_gather_coalesced(outs, [torch.full((2,), float(rank)), torch.full((1,), -float(rank))])
    for q, (a, b) in enumerate(outs):
        assert torch.equal(a, torch.full((2,), float(q))) and torch.equal(b, torch.full((1,), -float(q)))
    a, b = torch.ones(4) * rank, torch.ones(2, dtype=torch.int64) * rank
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    assert torch.equal(a, torch.full((4,), s)) and torch.equal(b, torch.full((2,), int(s), dtype=torch.int64))
    # mixed dtypes with PREMUL_SUM: one op per dtype, every one released afterwards (the next
    # two ops made take the first two user op codes again). torch's front end refuses mixed dtypes, so
    # the backend is called directly.
    impl = oxccl.torch.backend_impl()
    x, y = torch.ones(3) * (rank + 1), torch.ones(2, dtype=torch.float64) * (rank + 1)
    for _ in range(3):
        x.fill_(rank + 1), y.fill_(rank + 1)
        impl.allreduce_coalesced([x, y], dist._make_nccl_premul_sum(2.0)).wait()
    want = float(world * (world + 1))
    assert torch.equal(x, torch.full((3,), want)) and torch.equal(y, torch.full((2,), want, dtype=torch.float64))
    comm = impl._comm
    one = torch.ones(1)
    codes = [comm.create_pre_mul_sum(one.data_ptr(), 7) for _ in range(2)]
    for c in codes:
        comm.destroy_op(c)
    assert codes == [5, 6], f"ops leaked: the next two op codes are {codes}, not [5, 6] (ncclNumOps = 5)"


def any_source_checks(rank, world):
    # every other rank sends twice to rank 0, which receives without naming the source
    if rank == 0:
        got = {}
        for _ in range(2 * (world - 1)):
            t = torch.zeros(4, dtype=torch.int64)
            src = dist.recv(t)
            k = got.setdefault(src, 0)
            assert torch.equal(t, torch.full((4,), 100 * src + k)), (src, k, t)
            got[src] = k + 1
        assert got == {q: 2 for q in range(1, world)}, got
    else:
        for k in range(2):
            dist.send(torch.full((4,), 100 * rank + k, dtype=torch.int64), dst=0)
    dist.barrier()
    # irecv without a source into a non-contiguous tensor: the work names the sender once done
    if rank == 0:
        t = torch.zeros(2, 3)
        w = dist.irecv(t.t())
        w.wait()
        assert w._source_rank() == world - 1 and w.is_success()
        assert torch.equal(t.t(), torch.arange(6.0).view(3, 2))
        expect_error(lambda: dist.recv(torch.zeros(0)), "at least one element")
    elif rank == world - 1:
        dist.send(torch.arange(6.0).view(3, 2), dst=0)
    dist.barrier()


def values_worker(rank, world, port):
    setup(rank, world, port, "oxccl")
    bitwise_checks(rank, world)
    layout_checks(rank, world)
    coalesced_checks(rank, world)
    any_source_checks(rank, world)
    # an error in one call's arguments is raised locally and leaves the group usable
    expect_error(lambda: dist.all_gather([torch.zeros(3)] * world, torch.zeros(2)), "the group stays usable")
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), float(world)))
    # monitored_barrier: passes when all arrive; names the rank that does not
    dist.monitored_barrier(timeout=timedelta(seconds=10))
    if rank == 0:
        expect_error(lambda: dist.monitored_barrier(timeout=timedelta(seconds=1)), f"Rank {world - 1} failed to pass monitoredBarrier")
    elif rank != world - 1:
        expect_error(lambda: dist.monitored_barrier(timeout=timedelta(seconds=3)), "successfully reached monitoredBarrier")
    dist.barrier()
    dist.destroy_process_group()


def main():
    run(work_worker, 2)
    print("work: states before and after completion, wait(timeout), failure, per-group timeout", flush=True)
    run(detail_worker, 2)
    print("TORCH_DISTRIBUTED_DEBUG=DETAIL: collectives, subgroups, all_gather_object, mismatch caught", flush=True)
    for world in (2, 3):
        run(values_worker, world)
        print(f"values on {world} ranks: bitwise, non-contiguous, sparse (= gloo), coalesced, any-source recv, local errors, monitored_barrier", flush=True)
    print("torch c10d tests: OK")


if __name__ == "__main__":
    main()
