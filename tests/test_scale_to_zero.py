"""Scale to zero on real Local pools: a pool born with no node provisions on its
first task; an idle one shrinks to zero, head included, and the next task wakes it, with the
collections saying their state is gone, as after a lost head."""

from __future__ import annotations

import time

import pytest

import skyward as sky

pytestmark = pytest.mark.timeout(120)


@sky.function
def where() -> int:
    return sky.instance_info().node


@sky.function
def bump(name: str) -> int:
    return sky.counter(name).increment()


def _wait(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_nodes_zero_needs_a_max() -> None:
    with pytest.raises(sky.ConfigError, match=r"max must be an int >= 1.*nodes=\(0, 4\)"):
        sky.Nodes(desired=0)
    assert sky.Nodes(desired=0, max=3).max == 3
    assert sky.Nodes.of((0, 2)) == sky.Nodes(desired=0, max=2)
    assert sky.Nodes(desired=2, min=0).min == 0  # work may start before any node is ready
    with pytest.raises(sky.ConfigError, match="at least 1 node"):
        sky.Nodes.of(0)


def test_a_pool_born_asleep_wakes_on_its_first_task_and_sleeps_again_when_idle() -> None:
    seen: list[sky.Event] = []
    options = sky.Options(console=False, autoscale_idle_timeout=1.0, reconcile_tick_interval=0.2)
    started = time.monotonic()
    with sky.Compute(nodes=sky.Nodes(desired=0, max=2), options=options) as pool:
        opened = time.monotonic() - started
        pool.subscribe(seen.append)
        assert pool.current_nodes() == 0 and pool.snapshot().nodes == ()
        assert where() >> pool == 0  # the first task starts the head node
        woke = [e for e in seen if isinstance(e, sky.ClusterWoke)]
        assert len(woke) == 1 and woke[0].nodes == 1 and woke[0].seconds > 0
        assert pool.current_nodes() == 1
        assert bump("c") >> pool == 1 and pool.counter("c").value == 1

        _wait(lambda: pool.current_nodes() == 0, 30)  # idle past the timeout: asleep, head included
        _wait(lambda: any(isinstance(e, sky.ClusterAsleep) for e in seen), 5)
        asleep = next(e for e in seen if isinstance(e, sky.ClusterAsleep))
        assert asleep.idle_seconds >= 1.0

        assert where() >> pool == 0  # woken again, by a new head
        assert len([e for e in seen if isinstance(e, sky.ClusterWoke)]) == 2
        with pytest.raises(sky.CollectionError, match="scaled to zero nodes"):
            pool.counter("c").value  # noqa: B018 - the client is told once: no silent 0
        assert pool.counter("c").increment() == 1  # then a fresh state on the new head
    assert opened < 5  # no node was started at open


def test_broadcast_and_map_wake_an_asleep_pool() -> None:
    options = sky.Options(console=False)
    with sky.Compute(nodes=(0, 2), options=options) as pool:
        assert (where() @ pool) == [0]  # every node: the one it woke
    with sky.Compute(nodes=(0, 2), options=options) as pool:
        assert pool.map(lambda x: x * 2, range(5)) == [0, 2, 4, 6, 8]


def test_min_zero_starts_desired_nodes_reaps_to_zero_and_wakes_on_the_next_task() -> None:
    # The reference project's own scale-to-zero test, on Local.
    seen: list[sky.Event] = []
    options = sky.Options(console=False, autoscale_idle_timeout=1.5, autoscale_cooldown=0.5,
                          reconcile_tick_interval=0.2)
    with sky.Compute(nodes=sky.Nodes(desired=2, min=0, max=2), options=options) as pool:
        pool.subscribe(seen.append)
        _wait(lambda: pool.current_nodes() == 2, 30)  # desired nodes start, min=0 or not
        assert where() >> pool in (0, 1)
        _wait(lambda: pool.current_nodes() == 0, 30)  # idle: reaped to zero, head included
        _wait(lambda: any(isinstance(e, sky.ClusterAsleep) for e in seen), 5)
        assert where() >> pool == 0  # the next task wakes it
        assert pool.current_nodes() >= 1
        assert any(isinstance(e, sky.ClusterWoke) for e in seen)
