"""A DDP training step with CUDA tensors, for cuda/gpu-check.sh (run under torchrun).

--backend oxccl: oxccl's torch.distributed backend (import oxccl.torch);
--backend nccl:  PyTorch's ProcessGroupNCCL, with oxccl's libnccl.so.2 put in front by LD_PRELOAD.
Ranks may share one GPU. Checks: parameters identical on every rank after 5 steps, and an exact
all-reduce of integer-valued floats.
"""

import argparse
import faulthandler
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="oxccl")
    args = ap.parse_args()
    # a hang shows where each rank stands before gpu-check.sh's box for the step ends
    faulthandler.dump_traceback_later(45, exit=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    if args.backend == "oxccl":
        import oxccl.torch  # noqa: F401 - registers the backend
    dist.init_process_group(args.backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator(device="cpu").manual_seed(rank)
    for _ in range(5):
        x = torch.randn(32, 64, generator=g).to(dev)
        y = torch.randn(32, 8, generator=g).to(dev)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, dist.ReduceOp.MAX)
    dist.all_reduce(lo, dist.ReduceOp.MIN)
    assert torch.equal(hi, lo), "parameters differ across ranks"
    t = torch.arange(100_000, device=dev, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    want = torch.arange(100_000, device=dev, dtype=torch.float32) * (world * (world + 1) // 2)
    torch.cuda.synchronize()
    assert torch.equal(t, want), "all-reduce of CUDA tensors is wrong"
    if rank == 0:
        print(f"DDP over {args.backend} ({world} ranks, CUDA tensors): 5 steps, parameters identical, exact all-reduce OK")
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
