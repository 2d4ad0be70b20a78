"""Training survives a dead rank, torchft style (issue 19): 4 ranks train a model with DDP; rank 2
kills itself with SIGKILL at step K; the survivors catch the failed step, dist.shrink_group with
SHRINK_ABORT, and redo that step on 3 ranks; at step G a replacement process joins through
oxccl's grow (ncclCommGetUniqueId + ncclCommGrow), receives the current parameters by broadcast,
and all 4 train on. Every rank's final parameters equal, bit for bit, a reference computed here
with the same membership history (exact arithmetic: integer data, sums of dyadic values).
Then dist._reconfigure: 3 ranks configured from their handles, one killed, two reconfigured.

Run: python ffi/python/tests/test_torch_elastic.py   (.ci/run does)
"""

import io
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

STEPS, KILL_AT, GROW_AT, LR = 10, 3, 6, 1.0 / 64
DEAD, NEWCOMER_ID = 2, 4


def model():
    m = torch.nn.Linear(6, 3).double()
    with torch.no_grad():
        m.weight.copy_(torch.arange(18, dtype=torch.float64).reshape(3, 6) / 8)
        m.bias.copy_(torch.arange(3, dtype=torch.float64) / 4)
    return m


def batch(member, step):
    """Member `member`'s data at `step` (integers), and the loss weights."""
    g = torch.Generator().manual_seed(1000 * member + step)
    return torch.randint(-4, 5, (5, 6), generator=g).double(), torch.randint(-3, 4, (5, 3), generator=g).double()


def loss_of(m, member, step):
    x, c = batch(member, step)
    return (m(x) * c).sum()


def history(step):
    """The members (original ids) that train at `step`."""
    if step < KILL_AT:
        return [0, 1, 2, 3]
    if step < GROW_AT:
        return [0, 1, 3]
    return [0, 1, 3, NEWCOMER_ID]


def reference():
    m = model()
    for step in range(STEPS):
        grads = [torch.zeros_like(p) for p in m.parameters()]
        for member in history(step):
            m.zero_grad()
            loss_of(m, member, step).backward()
            for g, p in zip(grads, m.parameters()):
                g += p.grad
        with torch.no_grad():
            for g, p in zip(grads, m.parameters()):
                p -= LR * g
    return [p.detach() for p in m.parameters()]


def ddp(m, pg):
    from torch.nn.parallel import DistributedDataParallel as DDP

    d = DDP(m, process_group=pg)

    def sum_hook(group, bucket):  # SUM, no averaging: exact whatever the membership
        return group.allreduce([bucket.buffer()]).get_future().then(lambda f: f.value()[0])

    d.register_comm_hook(pg, sum_hook)
    return d


def step_once(d, m, member, step):
    m.zero_grad()
    loss_of(d, member, step).backward()
    with torch.no_grad():
        for p in m.parameters():
            p -= LR * p.grad


def publish(store, member, m):
    buf = io.BytesIO()
    torch.save([p.detach() for p in m.parameters()], buf)
    store.set(f"final/{member}", buf.getvalue())


def member(rank, port):
    import oxccl.torch

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("oxccl", store=dist.PrefixStore("world/", store), rank=rank, world_size=4,
                            timeout=timedelta(seconds=60))
    m = model()
    pg = dist.group.WORLD
    d = ddp(m, pg)
    step = 0
    while step < STEPS:
        if step == KILL_AT and rank == DEAD:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == GROW_AT and pg.size() == 3:
            mine = pg.rank() == 0
            uid = oxccl.torch.grow_id(pg) if mine else None
            if mine:
                store.set("grow_id", uid)
            t = time.monotonic()
            pg = oxccl.torch.grow_group(4, store, group=pg, unique_id=uid)
            print(f"rank {rank}: grown to {pg.size()} in {(time.monotonic() - t) * 1e3:.0f} ms", flush=True)
            for p in m.parameters():
                pg.broadcast(p.data, 0).wait()
            d = ddp(m, pg)
        saved = [p.detach().clone() for p in m.parameters()]
        try:
            step_once(d, m, rank, step)
        except Exception as e:  # noqa: BLE001 - the dead rank's step
            assert step == KILL_AT, f"rank {rank}: step {step} failed: {e}"
            err = pg._get_backend(torch.device("cpu")).get_error()  # torchft's errored()
            assert err == torch._C._distributed_c10d.ErrorType.REMOTE_ERROR, err
            t = time.monotonic()
            with torch.no_grad():
                for p, s in zip(m.parameters(), saved):
                    p.copy_(s)
            pg = oxccl.torch.shrink_group([DEAD], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
            d = ddp(m, pg)
            print(f"rank {rank}: step {step} failed ({str(e)[:120]}...); shrunk to {pg.size()} ranks "
                  f"in {(time.monotonic() - t) * 1e3:.0f} ms", flush=True)
            continue  # the same step again, on the survivors
        step += 1
    publish(store, rank, m)
    store.wait(["final/done"], timedelta(seconds=120))


def newcomer(port):
    import oxccl.torch

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    store.wait(["grow_id"], timedelta(seconds=120))
    pg = oxccl.torch.join_grown_group(bytes(store.get("grow_id")), 4, 3, store)
    m = torch.nn.Linear(6, 3).double()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    for p in m.parameters():
        pg.broadcast(p.data, 0).wait()
    d = ddp(m, pg)
    for step in range(GROW_AT, STEPS):
        step_once(d, m, NEWCOMER_ID, step)
    publish(store, NEWCOMER_ID, m)
    store.wait(["final/done"], timedelta(seconds=120))


def reconf(rank, port):
    """dist._reconfigure: 3 ranks created with enable_reconfigure, configured with their
    handles in order; rank 2 dies; the other two reconfigure with a set of their handles."""
    import oxccl.torch  # noqa: F401

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("oxccl", store=dist.PrefixStore("reconf/", store), rank=rank, world_size=3,
                            timeout=timedelta(seconds=30), enable_reconfigure=True)
    assert dist.distributed_c10d._supports_reconfigure()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    mine = dist.distributed_c10d._get_reconfigure_handle()
    store.set(f"handle/{rank}", mine)
    store.wait([f"handle/{r}" for r in range(3)], timedelta(seconds=60))
    handles = [store.get(f"handle/{r}").decode() for r in range(3)]
    dist.distributed_c10d._reconfigure(uuid=1, handles=handles).wait()
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), 6.0)), t
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(4)
    try:
        dist.all_reduce(t)
        raise AssertionError("an all-reduce with a dead rank succeeded")
    except RuntimeError as e:
        assert "Connection closed by peer" in str(e) or "died" in str(e), e
    live = set(handles[:2])
    t0 = time.monotonic()
    dist.distributed_c10d._reconfigure(uuid=2, handles=live, timeout=timedelta(seconds=20)).wait()
    took = (time.monotonic() - t0) * 1e3
    want = sorted(live).index(mine)
    assert (backend.rank(), backend.size()) == (want, 2), (backend.rank(), backend.size())
    t = torch.full((3,), float(backend.rank() + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), 3.0)), t
    print(f"rank {rank}: reconfigured without rank 2 in {took:.0f} ms, now rank {backend.rank()} of 2", flush=True)
    store.set(f"reconf_ok/{rank}", "1")


def reconfigure_test(store, env, me):
    procs = [subprocess.Popen([sys.executable, me, "reconf", str(r), str(store.port)], env=env) for r in range(3)]
    deadline = time.monotonic() + 120
    for r, p in enumerate(procs):
        rc = p.wait(timeout=max(1, deadline - time.monotonic()))
        want = -signal.SIGKILL if r == 2 else 0
        assert rc == want, f"reconfigure: process {r} exited with {rc}, expected {want}"
    assert store.check(["reconf_ok/0", "reconf_ok/1"])
    print("reconfigure: 3 ranks configured from handles, rank 2 killed, the others reconfigured to 2")


def main():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    env = dict(os.environ, NCCL_SOCKET_IFNAME=os.environ.get("NCCL_SOCKET_IFNAME", "lo"))
    me = os.path.abspath(__file__)
    procs = {r: subprocess.Popen([sys.executable, me, "member", str(r), str(store.port)], env=env) for r in range(4)}
    procs[NEWCOMER_ID] = subprocess.Popen([sys.executable, me, "newcomer", str(store.port)], env=env)
    survivors = [0, 1, 3, NEWCOMER_ID]
    deadline = time.monotonic() + 240
    while not store.check([f"final/{r}" for r in survivors]):
        for r, p in procs.items():  # a process that failed ends the test at once
            rc = p.poll()
            assert rc is None or (r == DEAD and rc == -signal.SIGKILL), f"process {r} exited with {rc}"
        assert time.monotonic() < deadline, "not finished within 240 s: a hang"
        time.sleep(0.1)
    store.set("final/done", "1")
    deadline = time.monotonic() + 60
    for r, p in procs.items():
        rc = p.wait(timeout=max(1, deadline - time.monotonic()))
        want = -signal.SIGKILL if r == DEAD else 0
        assert rc == want, f"process {r} exited with {rc}, expected {want}"
    ref = reference()
    for r in survivors:
        got = torch.load(io.BytesIO(store.get(f"final/{r}")))
        for a, b in zip(got, ref):
            assert torch.equal(a, b), f"rank {r}: {(a - b).abs().max()}"
    reconfigure_test(store, env, me)
    print(f"elastic training: rank {DEAD} killed at step {KILL_AT}, shrunk to 3, grown back to 4 at step "
          f"{GROW_AT}; {STEPS} steps, every rank's parameters equal the reference bit for bit")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "member":
        member(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "reconf":
        reconf(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "newcomer":
        newcomer(int(sys.argv[2]))
    else:
        main()
