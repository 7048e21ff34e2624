"""The pool's collections from the client, on the pool object: ``pool.dict(name)``,
``pool.set``, ``pool.counter``, ``pool.queue``, ``pool.barrier``, ``pool.lock`` are the objects
that pool's tasks get from ``sky.dict(name)``..., whether or not that pool is the active one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import skyward as sky

pytestmark = pytest.mark.timeout(120)
QUIET = sky.Options(console=False)


@pytest.fixture(scope="module")
def pools() -> Iterator[tuple[sky.Pool, sky.Pool]]:
    """Two pools opened without `with`: neither is the active pool here."""
    a = sky.Compute(nodes=1, options=QUIET).open()
    try:
        b = sky.Compute(nodes=1, options=QUIET).open()
        try:
            yield a, b
        finally:
            b.close()
    finally:
        a.close()


@sky.function
def fill(tag: str) -> int:
    sky.dict("d")["by-task"] = tag
    sky.set("s").add(tag)
    c = sky.counter("c")
    for _ in range(5):
        c.increment()
    sky.queue("q").put(f"from {tag}")
    return sky.counter("c").value


def test_tasks_and_the_client_see_the_same_objects_of_their_own_pool(pools: tuple[sky.Pool, sky.Pool]) -> None:
    a, b = pools
    with pytest.raises(sky.NoActivePoolError):
        sky.dict("d")  # no pool is active here: the module-level factory has none to use
    a.dict("d")["by-client"] = "a"
    a.queue("q").put("from the client")
    assert a.run(fill("a")) == 5
    assert b.run(fill("b")) == 5
    assert a.dict("d")["by-task"] == "a" and a.dict("d")["by-client"] == "a"
    assert b.dict("d")["by-task"] == "b" and "by-client" not in b.dict("d")  # pools do not share
    assert "a" in a.set("s") and "b" not in a.set("s")
    assert a.counter("c").value == 5 and b.counter("c").value == 5
    assert a.queue("q").get(timeout=5) == "from the client"
    assert a.queue("q").get(timeout=5) == "from a"


@sky.function
def meet(name: str) -> str:
    sky.barrier(name, 2).wait()
    with sky.lock(f"{name}-lock"):
        return "met"


def test_a_barrier_and_a_lock_join_the_client_to_a_task(pools: tuple[sky.Pool, sky.Pool]) -> None:
    a, _ = pools
    future = a.run_async(meet("bar"))
    a.barrier("bar", 2).wait()  # the client is the second participant
    assert future.result(timeout=30) == "met"
    lock = a.lock("held", timeout=5)
    with lock:
        pass


def test_bad_names_and_arguments_say_what_is_wrong(pools: tuple[sky.Pool, sky.Pool]) -> None:
    a, _ = pools
    with pytest.raises(sky.ConfigError, match="non-empty string"):
        a.dict("")
    with pytest.raises(sky.ConfigError, match="number of participants"):
        a.barrier("b", 0)
    with pytest.raises(sky.ConfigError, match="consistency"):
        a.counter("c", consistency="weak")  # type: ignore[arg-type]
