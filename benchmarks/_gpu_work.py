"""Task functions for benchmarks/gpu.py, importable on the nodes as ``_gpu_work`` (the Local
provider hands the client's sys.path, which holds this folder, to the nodes). Nothing here prints.
"""

from __future__ import annotations

import os
import socket
from typing import Any

# What a node made once and returns each time: timing ``make_*`` measures the transfer only.
_CACHE: dict[Any, Any] = {}


def echo(x: Any) -> Any:
    return x


def size_of(x: Any) -> int:
    """Receives a tensor or an array, returns a tiny result: the client -> node direction."""
    nbytes = getattr(x, "nbytes", None)
    return int(nbytes if nbytes is not None else x.numel() * x.element_size())


def make_numpy(n: int) -> Any:
    import numpy as np

    key = ("numpy", n)
    if key not in _CACHE:
        _CACHE[key] = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8)
    return _CACHE[key]


def make_cuda(n: int) -> Any:
    import torch

    key = ("cuda", n)
    if key not in _CACHE:
        _CACHE[key] = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    return _CACHE[key]


def make_cuda_parts(n: int) -> Any:
    """Ten CUDA tensors of n/10 bytes each, each on a storage of its own (as a state_dict's
    are; ``chunk`` alone would give views of one storage, which travels once)."""
    import torch

    key = ("cuda parts", n)
    if key not in _CACHE:
        whole = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
        _CACHE[key] = {f"layer{i}.weight": t.clone() for i, t in enumerate(whole.chunk(10))}
    return _CACHE[key]


def size_of_all(parts: dict[str, Any]) -> int:
    """The bytes of every tensor of a dict: the client -> node direction of a state_dict."""
    return sum(size_of(t) for t in parts.values())


def _process_group() -> None:
    """A one-rank NCCL process group in this process (the same set-up in the client and on the node)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", rank=0, world_size=1)


def ddp_step(batch: int = 256) -> float:
    """One forward, backward and optimizer step of a DDP-wrapped MLP on cuda:0 (built once per
    process); returns the loss."""
    import torch

    state = _CACHE.get("ddp")
    if state is None:
        _process_group()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        x = torch.randn(batch, 1024, device="cuda")
        state = _CACHE["ddp"] = (ddp, opt, x)
    ddp, opt, x = state
    opt.zero_grad(set_to_none=True)
    loss = (ddp(x) - x).pow(2).mean()
    loss.backward()
    opt.step()
    return float(loss.item())  # waits for the GPU
