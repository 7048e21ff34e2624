"""Every operator and pool method on a real 2-node Local pool."""

from __future__ import annotations

import contextvars
import os
import pickle
import threading
import time
from concurrent.futures import Future

import pytest

import skyward as sky


@sky.function
def square(x: int) -> int:
    return x * x


@sky.function
def node_index() -> int:
    return sky.instance_info().node


@sky.function
def slow(x: int, seconds: float) -> int:
    time.sleep(seconds)
    return x


def test_rshift_runs_on_one_node(pool: sky.Pool) -> None:
    assert square(7) >> pool == 49


def test_rshift_round_robins(pool: sky.Pool) -> None:
    assert {node_index() >> pool for _ in range(4)} == {0, 1}


def test_rshift_sky_resolves_active_pool() -> None:
    with sky.Compute(nodes=1):
        assert square(3) >> sky == 9
        assert (square(1) & square(2)) >> sky == (1, 4)
        assert square(2) @ sky == [4]
        assert (square(5) > sky).result() == 25


def test_sky_sky_is_the_active_pool_as_the_module_is() -> None:
    # The reference exports a `sky` singleton: code written for it dispatches with `>> sky.sky`.
    target = sky.sky
    with sky.Compute(nodes=1):
        assert square(3) >> target == 9
        assert (square(1) & square(2)) >> target == (1, 4)
        assert square(2) @ target == [4]
        assert (square(5) > target).result() == 25
        assert sorted(sky.gather(square(1), square(2), stream=True) >> target) == [1, 4]
    with pytest.raises(sky.NoActivePoolError, match="none here"):
        # A fresh context: the module's shared `pool` fixture may be the active pool here.
        contextvars.Context().run(lambda: square(3) >> target)
    with pytest.raises(sky.DispatchError, match=r"@sky\.function"):
        9 >> target  # a plain value pushed at it is explained, as with the module
    assert "sky" in sky.__all__ and pickle.loads(pickle.dumps(target)) is target


def test_matmul_broadcasts_in_node_order(pool: sky.Pool) -> None:
    assert node_index() @ pool == [0, 1]


def test_and_group_runs_in_parallel(pool: sky.Pool) -> None:
    start = time.monotonic()
    result = (slow(1, 0.5) & slow(2, 0.5) & square(3)) >> pool
    assert result == (1, 2, 9)
    assert time.monotonic() - start < 0.95  # two nodes, so the sleeps overlapped


def test_gt_is_async(pool: sky.Pool) -> None:
    start = time.monotonic()
    fut = slow(5, 0.4) > pool
    assert isinstance(fut, Future)
    assert time.monotonic() - start < 0.3
    assert fut.result(timeout=10) == 5


def test_gather_tuple_and_stream(pool: sky.Pool) -> None:
    assert sky.gather(square(1), square(2)) >> pool == (1, 4)
    streamed = sky.gather(slow(1, 0.6), slow(2, 0.0), stream=True) >> pool
    assert list(streamed) == [1, 2]  # ordered by submission
    unordered = sky.gather(slow(1, 0.6), slow(2, 0.0), stream=True, ordered=False) >> pool
    assert list(unordered) == [2, 1]  # as they complete


def test_run_with_target(pool: sky.Pool) -> None:
    assert pool.run(node_index(), target="head") == 0
    assert pool.run(node_index(), target=1) == 1
    with pytest.raises(sky.ConfigError, match="target=5"):
        pool.run(node_index(), target=5)


def test_run_async_broadcast_parallel_methods(pool: sky.Pool) -> None:
    assert pool.run_async(square(4), target=1).result() == 16
    assert pool.broadcast(square(2)) == [4, 4]
    assert pool.run_parallel(square(2) & square(3)) == (4, 9)


def test_map_preserves_order_and_accepts_plain_functions(pool: sky.Pool) -> None:
    assert pool.map(lambda x: x + 1, range(1000)) == list(range(1, 1001))
    assert pool.map(square, [3, 1, 2], chunksize=1) == [9, 1, 4]
    assert pool.map(square, []) == []


def test_map_raises_first_error_in_input_order(pool: sky.Pool) -> None:
    def picky(x: int) -> int:
        if x in (7, 50):
            raise ValueError(f"bad {x}")
        return x

    with pytest.raises(ValueError, match="bad 7"):
        pool.map(picky, range(100), chunksize=5)


def test_with_timeout_and_time_helpers() -> None:
    p = square(2).with_timeout(sky.time.minutes(1))
    assert p.timeout == 60.0
    assert square(2).timeout is None


def test_current_nodes(pool: sky.Pool) -> None:
    assert pool.current_nodes() == 2


def test_resize_grows_and_shrinks() -> None:
    with sky.Compute(nodes=1) as p:
        assert node_index() @ p == [0]
        p.resize(3)
        assert p.current_nodes() == 3
        infos = info_all() @ p
        assert [i[0] for i in infos] == [0, 1, 2] and {i[1] for i in infos} == {3}
        p.resize(sky.Nodes(desired=1))
        assert p.current_nodes() == 1
        assert info_all() @ p == [(0, 1)]


@sky.function
def info_all() -> tuple[int, int]:
    info = sky.instance_info()
    return info.node, info.total_nodes


def test_dispatch_from_threads(pool: sky.Pool) -> None:
    results: list[int] = []
    lock = threading.Lock()

    def hammer(k: int) -> None:
        for i in range(50):
            value = square(i + k) >> pool
            with lock:
                results.append(value)

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted((i + k) ** 2 for k in range(4) for i in range(50))


def test_local_function_runs_in_node_working_dir(pool: sky.Pool) -> None:
    cwd = sky.function(os.getcwd)
    dirs = cwd() @ pool
    assert len(set(dirs)) == 2 and all("node-" in d for d in dirs)


def test_elastic_pool_grows_under_load_and_shrinks_when_idle() -> None:
    opts = sky.Options(autoscale_cooldown=0.2, autoscale_idle_timeout=0.5, reconcile_tick_interval=0.1)
    with sky.Compute(nodes=(1, 3), options=opts) as pool:
        assert pool.current_nodes() == 1
        futures = [slow(i, 0.4) > pool for i in range(12)]  # 12 tasks for 1 slot: pressure
        seen = 1
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and seen < 3:
            seen = max(seen, pool.current_nodes())
            time.sleep(0.05)
        assert seen == 3
        assert [f.result(timeout=30) for f in futures] == list(range(12))
        more = pool.map(lambda x: sky.instance_info().node, range(30), chunksize=1)
        assert set(more) == {0, 1, 2}  # the new nodes take their share
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and pool.current_nodes() > 1:
            time.sleep(0.1)
        assert pool.current_nodes() == 1
        assert node_index() @ pool == [0]
