"""CPU data-parallel training with the "oxccl" backend, for torchrun:

    pip install ./ffi/python
    torchrun --nproc-per-node 2 ffi/python/examples/train_cpu.py

It uses the installed `oxccl` package (not the source tree).
"""
import torch
import torch.distributed as dist

import oxccl
import oxccl.torch  # noqa: F401  (registers "oxccl")


def main():
    dist.init_process_group("oxccl")  # rank, world size and store from torchrun's environment
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    w_true = torch.arange(10, dtype=torch.float32) / 10
    for step in range(50):
        x = torch.randn(64, 10, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), x @ w_true)
        opt.zero_grad()
        loss.backward()
        opt.step()
    t = torch.tensor([loss.item()])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    if rank == 0:
        print(f"world {world}: mean final loss {t.item():.5f} (oxccl from {oxccl.__file__})")
        assert t.item() < 0.05, "training did not converge"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
