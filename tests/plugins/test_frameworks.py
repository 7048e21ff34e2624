"""torch (gloo), jax and keras on real 2-node Local pools (CPU)."""

from __future__ import annotations

import pytest

import skyward as sky

QUIET = sky.Options(console="silent")


@sky.function(timeout=120)
def all_reduce_and_ddp_step():
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group(backend="gloo")  # as reference examples do: must be harmless
    rank = dist.get_rank()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)  # different data on every rank
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    weights = [p.detach().clone() for p in model.parameters()]
    dist.destroy_process_group()  # also harmless: the plugin owns the group
    return rank, dist.get_world_size(), t.item(), weights


def test_torch_all_reduce_and_ddp_on_two_nodes() -> None:
    pytest.importorskip("torch")
    import torch

    with sky.Compute(nodes=2, plugins=[sky.plugins.torch()], options=QUIET) as pool:
        results = all_reduce_and_ddp_step() @ pool
        again = all_reduce_and_ddp_step() @ pool  # the group survives the user's destroy call
    assert sorted(r[0] for r in results) == [0, 1]
    assert all(r[1] == 2 and r[2] == 3.0 for r in results + again)  # 1 + 2
    (_, _, _, w0), (_, _, _, w1) = results
    assert all(torch.equal(a, b) for a, b in zip(w0, w1, strict=True))  # DDP synced gradients


@sky.function(timeout=60)
def torch_rank():
    import os

    import torch.distributed as dist

    return dist.get_rank(), os.environ["WORLD_SIZE"], os.environ["OMP_NUM_THREADS"]


def test_torch_one_node_task_does_not_hang_the_rendezvous() -> None:
    pytest.importorskip("torch")
    with sky.Compute(nodes=2, plugins=[sky.plugins.torch()], options=QUIET) as pool:
        assert pool.run(torch_rank(), target=1)[:2] == (1, "2")


def test_torch_ranks_with_the_process_executor() -> None:
    pytest.importorskip("torch")
    worker = sky.Worker(concurrency=2, executor="process")
    with sky.Compute(nodes=2, worker=worker, plugins=[sky.plugins.torch()], options=QUIET) as pool:
        ranks = {pool.map(lambda _: torch_rank.fn(), range(16), chunksize=1)[i][0] for i in range(16)}
    assert ranks <= {0, 1, 2, 3} and len(ranks) >= 2


@sky.function(timeout=120)
def jax_collective():
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(jnp.array([jax.process_index() + 1.0]))
    return jax.process_index(), jax.process_count(), float(gathered.sum())


def test_jax_distributed_on_two_processes() -> None:
    pytest.importorskip("jax")
    with sky.Compute(nodes=2, plugins=[sky.plugins.jax()], options=QUIET) as pool:
        results = sorted(jax_collective() @ pool)
    assert results == [(0, 2, 3.0), (1, 2, 3.0)]


@sky.function(timeout=120)
def keras_fit():
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5], dtype="float32"))[:, None]
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(x, y, epochs=20, batch_size=16, verbose=0)
    return keras.backend.backend(), history.history["loss"][0], history.history["loss"][-1]


def test_keras_with_jax_fits_a_tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERAS_BACKEND", "jax")  # keras defaults to tensorflow on import
    pytest.importorskip("jax")
    pytest.importorskip("keras")
    plugins = [sky.plugins.jax(), sky.plugins.keras(backend="jax")]
    with sky.Compute(nodes=2, plugins=plugins, options=QUIET) as pool:
        results = keras_fit() @ pool
    for backend, first, last in results:
        assert backend == "jax" and last < first / 10
    assert all(last < 1e-3 for _, _, last in results)
