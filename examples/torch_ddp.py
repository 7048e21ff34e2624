"""PyTorch DistributedDataParallel on 2 nodes with gloo (CPU), so it runs on sky.Local().

The torch plugin sets MASTER_ADDR/PORT, RANK, WORLD_SIZE and initialises the process group
on every node before the first task; `@` runs the training function on every rank.
"""

import skyward as sky


@sky.function(timeout=300)
def train(steps: int = 50) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights everywhere
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)  # each rank its own shard of data
    true_w = torch.arange(8.0)
    for _ in range(steps):
        x = torch.randn(32, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), (x @ true_w)[:, None])
        opt.zero_grad()
        loss.backward()  # gradients are averaged over the ranks here
        opt.step()
    checksum = sum(p.detach().sum().item() for p in model.parameters())
    return {"rank": rank, "world": world, "loss": loss.item(), "checksum": round(checksum, 6)}


if __name__ == "__main__":
    with sky.Compute(nodes=2, plugins=[sky.plugins.torch()]) as pool:
        results = train() @ pool
    for r in results:
        print(r)
    print("identical weights on every rank:", len({r["checksum"] for r in results}) == 1)
