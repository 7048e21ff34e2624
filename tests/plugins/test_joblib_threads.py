"""``Parallel(backend="skyward")`` without the joblib plugin: inside tasks on every node, and
from the program's own threads inside the pool's `with` block."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import skyward as sky

joblib = pytest.importorskip("joblib")
from joblib import Parallel, delayed, parallel_config  # noqa: E402

QUIET = sky.Options(console="silent")


@sky.function
def nested_on_a_node() -> tuple[int, set[int]]:
    out = Parallel(n_jobs=-1, backend="skyward")(delayed(os.getpid)() for _ in range(8))
    return os.getpid(), set(out)


@pytest.fixture(scope="module")
def plain_pool():
    with sky.Compute(nodes=2, options=QUIET) as p:
        yield p


def test_nested_parallel_runs_on_every_node_without_the_plugin(plain_pool) -> None:
    results = nested_on_a_node() @ plain_pool
    assert len(results) == 2
    for _, pids in results:
        assert pids and os.getpid() not in pids  # on the pool, not here


def in_a_thread() -> list[int]:
    return Parallel(n_jobs=2, backend="skyward")(delayed(os.getpid)() for _ in range(4))


def test_threads_of_the_program_find_the_pool(plain_pool) -> None:
    with ThreadPoolExecutor(2) as ex:
        pids = ex.submit(in_a_thread).result()
    assert pids and os.getpid() not in pids
    # joblib's threading backend around an inner skyward Parallel
    outer = Parallel(n_jobs=2, backend="threading")(delayed(in_a_thread)() for _ in range(2))
    assert all(p != os.getpid() for pids in outer for p in pids)
    # and `>> sky` from a plain thread
    box: list[int] = []
    t = threading.Thread(target=lambda: box.append(nested_on_a_node() >> sky))
    t.start()
    t.join()
    assert box and box[0][0] != os.getpid()


def test_a_thread_with_two_pools_open_is_told_to_pass_the_pool(plain_pool) -> None:
    with sky.Compute(nodes=1, options=QUIET) as other, ThreadPoolExecutor(1) as ex:
        with pytest.raises(sky.NoActivePoolError, match=r"2 pools are open.*pool=pool"):
            ex.submit(in_a_thread).result()

        def named() -> list[int]:
            with parallel_config(backend="skyward", pool=other):
                return Parallel(n_jobs=2)(delayed(os.getpid)() for _ in range(2))

        assert ex.submit(named).result()
