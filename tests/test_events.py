"""The event stream: lifecycle order, tasks, metrics, and subscribers that misbehave."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import skyward as sky
from skyward.observe import events as ev


@sky.function
def work(x: int) -> int:
    return x * 2


@sky.function
def fail() -> None:
    raise ValueError("nope")




def test_lifecycle_events_in_order_and_one_completion_per_task() -> None:
    seen: list[sky.Event] = []
    unsubscribe = sky.subscribe(seen.append)
    try:
        with sky.Compute(nodes=2, options=sky.Options(console="silent")) as pool:
            for i in range(5):
                work(i) >> pool
            with pytest.raises(ValueError):
                fail() >> pool
            pid = pool.id
        ev.bus.flush()
    finally:
        unsubscribe()
    mine = [e for e in seen if e.pool == pid]
    kinds = [type(e).__name__ for e in mine if not isinstance(e, sky.TaskStarted | sky.TaskCompleted | sky.Metric | sky.Log)]
    assert kinds[0] == "ClusterRequested"
    assert kinds.index("ClusterProvisioned") < kinds.index("ClusterReady") < kinds.index("ClusterDestroyed")
    assert kinds[-1] == "ClusterDestroyed"
    assert sorted(e.node for e in mine if isinstance(e, sky.InstanceProvisioned)) == [0, 1]
    assert sorted(e.node for e in mine if isinstance(e, sky.InstanceBootstrapped)) == [0, 1]
    assert sorted(e.node for e in mine if isinstance(e, sky.InstanceDestroyed)) == [0, 1]
    assert kinds.index("InstanceBootstrapped") < kinds.index("ClusterReady")
    completed = [e for e in mine if isinstance(e, sky.TaskCompleted)]
    assert len(completed) == 6
    assert [e.ok for e in completed] == [True] * 5 + [False]
    assert all(e.seconds >= 0 and e.node in (0, 1) and e.name == "work" for e in completed[:5])
    started = {e.task for e in mine if isinstance(e, sky.TaskStarted)}
    assert started == {e.task for e in completed}


def test_map_reports_a_batch_with_item_counts() -> None:
    seen: list[sky.Event] = []
    with sky.Compute(nodes=2, options=sky.Options(console="silent")) as pool:
        unsubscribe = pool.subscribe(seen.append)
        pool.map(work, range(1000), chunksize=100)
        sky.gather(work(1), work(2)) >> pool
        ev.bus.flush()
        unsubscribe()
    batches = [e for e in seen if isinstance(e, sky.BatchStarted)]
    assert [(b.kind, b.total) for b in batches] == [("map", 1000), ("gather", 2)]
    map_done = [e for e in seen if isinstance(e, sky.TaskCompleted) and e.batch == batches[0].batch]
    assert sum(e.items for e in map_done) == 1000 and len(map_done) == 10
    gather_done = [i for i, e in enumerate(seen) if isinstance(e, sky.TaskCompleted) and e.batch == batches[1].batch]
    gather_end = next(i for i, e in enumerate(seen) if isinstance(e, sky.BatchFinished) and e.batch == batches[1].batch)
    assert len(gather_done) == 2 and max(gather_done) < gather_end  # a batch ends after its tasks
    finished = [e for e in seen if isinstance(e, sky.BatchFinished)]
    assert [f.batch for f in finished] == [b.batch for b in batches] and all(f.ok for f in finished)


def test_metrics_arrive_from_every_node_with_plausible_values() -> None:
    image = sky.Image(metrics=[
        sky.metrics.CPU(interval=0.2), sky.metrics.Memory(interval=0.2), sky.metrics.MemoryUsed(interval=0.2),
    ])
    wanted = {(n, m) for n in (0, 1) for m in ("cpu", "memory", "memory_used")}
    with sky.Compute(nodes=2, image=image, options=sky.Options(console="silent")) as pool:
        samples = []
        for event in pool.events():
            if isinstance(event, sky.Metric):
                samples.append(event)
            if {(s.node, s.name) for s in samples} >= wanted:
                break
    total_gb = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20  # MemTotal, kB -> GB
    cpu = [s.value for s in samples if s.name == "cpu"]
    memory = [s.value for s in samples if s.name == "memory"]
    used = [s.value for s in samples if s.name == "memory_used"]
    assert all(0 <= v <= 100 for v in cpu) and all(0 < v < 100 for v in memory)
    assert all(0 < v < total_gb for v in used)
    assert {s.unit for s in samples if s.name == "cpu"} == {"%"}


def test_metrics_off() -> None:
    seen: list[sky.Event] = []
    with sky.Compute(nodes=1, image=sky.Image(metrics=None), options=sky.Options(console="silent")) as pool:
        unsubscribe = pool.subscribe(seen.append)
        time.sleep(1.5)
        unsubscribe()
    assert not [e for e in seen if isinstance(e, sky.Metric)]


def test_a_raising_subscriber_does_not_break_the_pool() -> None:
    def bad(_event: sky.Event) -> None:
        raise RuntimeError("subscriber bug")

    unsubscribe = sky.subscribe(bad)
    try:
        with sky.Compute(nodes=1, options=sky.Options(console="silent")) as pool:
            assert work(2) >> pool == 4
    finally:
        unsubscribe()


def test_flush_waits_for_delivery_and_not_for_itself_on_the_event_thread() -> None:
    """A pool closed from a subscriber (on the event thread) flushes the bus as it closes: that
    flush cannot wait for the events behind the one being delivered, so it returns at once."""
    seen: list[str] = []
    waited: list[float] = []

    def on(event: sky.Event) -> None:
        if isinstance(event, ev.Log) and event.message == "first":
            began = time.monotonic()
            ev.bus.flush(3.0)
            waited.append(time.monotonic() - began)
            time.sleep(0.3)  # the next event waits behind this one
        if isinstance(event, ev.Log):
            seen.append(event.message)

    unsubscribe = ev.bus.subscribe(on, "flush-test")
    try:
        ev.bus.emit(ev.Log(pool="flush-test", level="INFO", message="first"))
        ev.bus.emit(ev.Log(pool="flush-test", level="INFO", message="second"))
        ev.bus.flush(5.0)  # from another thread: waits for both
        assert seen == ["first", "second"]
        assert waited and waited[0] < 1.0, waited
    finally:
        unsubscribe()


def test_events_are_frozen() -> None:
    event = sky.TaskCompleted(pool="p", task=1, name="f", node=0, seconds=0.1, ok=True)
    with pytest.raises(AttributeError):
        event.ok = False  # type: ignore[misc]


def test_nodes_asked_of_the_provider_and_the_shutdown_are_events() -> None:
    import os
    import signal

    seen: list[sky.Event] = []
    unsubscribe = sky.subscribe(seen.append)
    try:
        with sky.Compute(nodes=2, options=sky.Options(console="silent")) as pool:
            pool.resize(3)  # one more node asked of the provider
            lost = pool.members.channels[1].node
            pid = {n["index"]: n["pid"] for n in pool.cluster.describe()["nodes"]}[lost]
            os.kill(pid, signal.SIGKILL)  # and one in its place
            deadline = time.monotonic() + 30
            while not [e for e in seen if isinstance(e, sky.InstanceReplaced) and e.pool == pool.id]:
                assert time.monotonic() < deadline, "the lost node was not replaced"
                time.sleep(0.05)
            pool_id = pool.id
        ev.bus.flush()
    finally:
        unsubscribe()
    mine = [e for e in seen if e.pool == pool_id and not isinstance(e, sky.TaskStarted | sky.TaskCompleted
                                                                       | sky.Metric | sky.Log)]
    kinds = [type(e).__name__ for e in mine]
    asked = [e for e in mine if isinstance(e, sky.InstanceRequested)]
    assert [(e.provider, e.count, e.replacing) for e in asked] == [("local", 2, None), ("local", 1, None),
                                                                      ("local", 1, lost)]
    assert kinds.index("ClusterRequested") < kinds.index("InstanceRequested") < kinds.index("InstanceProvisioned")
    requested = next(e for e in mine if isinstance(e, sky.ShutdownRequested))
    completed = next(e for e in mine if isinstance(e, sky.ShutdownCompleted))
    assert requested.nodes == completed.nodes == 3 and completed.ok and completed.seconds >= 0
    # the teardown's order: asked, each node stopped, done, then the pool is gone
    assert kinds[-6:] == ["ShutdownRequested", "InstanceDestroyed", "InstanceDestroyed", "InstanceDestroyed",
                          "ShutdownCompleted", "ClusterDestroyed"], kinds
