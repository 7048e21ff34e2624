"""Pools that heal, on sky.Local(): lost nodes are replaced keeping their rank, their tasks
run again, health checks replace unwell nodes, and the pool gives up cleanly when it must."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import alive, wait_gone
from helpers import Recorder, wait_for

import skyward as sky

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


def agent_pids(pool: sky.Pool) -> dict[int, int]:
    """rank -> agent pid of a Local pool's nodes."""
    by_index = {n["index"]: n["pid"] for n in pool.cluster.describe()["nodes"]}
    return {rank: by_index[ch.node] for rank, ch in enumerate(pool.members.channels)}


@sky.function
def rank_and_pid() -> tuple[int, int]:
    info = sky.instance_info()
    return info.node, os.getppid()


@sky.function
def slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


def test_a_killed_node_is_replaced_with_its_rank_and_its_task_runs_again() -> None:
    recorder = Recorder()
    with sky.Compute(nodes=3, options=QUIET) as pool:
        unsubscribe = pool.subscribe(recorder)
        pids = agent_pids(pool)
        old_node = pool.members.channels[1].node
        running = [pool.run_async(slow_square(i)) for i in range(12)]
        os.kill(pids[1], signal.SIGKILL)
        assert [f.result(timeout=60) for f in running] == [i * i for i in range(12)]
        wait_for(lambda: pool.current_nodes() == 3 and recorder.of(sky.InstanceReplaced))
        (replaced,) = recorder.of(sky.InstanceReplaced)
        assert (replaced.node, replaced.rank) == (old_node, 1)
        assert replaced.new_node not in (ch.node for ch in pool.members.channels if ch.node != replaced.new_node)
        assert 0 < replaced.seconds < 30
        assert [e.node for e in recorder.of(sky.InstanceLost)] == [old_node]
        ranks = rank_and_pid() @ pool
        assert [r for r, _ in ranks] == [0, 1, 2]  # ranks stay 0..N-1
        assert ranks[1][1] != pids[1] and ranks[0][1] == pids[0]
        assert not recorder.of(sky.ClusterProvisioned)  # a replacement is not a resize
        unsubscribe()
    assert wait_gone(list(pids.values()), 10) == []


def test_a_node_its_provider_took_back_is_reported_preempted() -> None:
    # Local nodes are never spot instances: stand in for a provider that says this one was taken
    # back (the clouds answer from the refreshed stack, tests/stacks/test_replace.py).
    recorder = Recorder()
    with sky.Compute(nodes=2, options=QUIET) as pool:
        unsubscribe = pool.subscribe(recorder)
        taken = pool.members.channels[1].node
        pool.cluster.preempted = lambda index: "spot capacity reclaimed" if index == taken else None  # type: ignore[method-assign]
        os.kill(agent_pids(pool)[1], signal.SIGKILL)
        wait_for(lambda: recorder.of(sky.InstanceReplaced))
        (preempted,) = recorder.of(sky.InstancePreempted)
        assert (preempted.node, preempted.reason) == (taken, "spot capacity reclaimed")
        assert [e.node for e in recorder.of(sky.InstanceLost)] == [taken]
        unsubscribe()


def test_a_replaced_head_is_the_head_again() -> None:
    with sky.Compute(nodes=2, options=QUIET) as pool:
        pids = agent_pids(pool)
        head = pool.members.channels[0]
        os.kill(pids[0], signal.SIGKILL)
        wait_for(lambda: head.lost is not None)
        rank, pid = pool.run(rank_and_pid(), target="head")  # waits for the new head
        assert rank == 0 and pid != pids[0]
        assert sky.function(lambda: sky.instance_info().is_head)() @ pool == [True, False]


def test_a_one_node_pool_waits_for_its_replacement() -> None:
    with sky.Compute(nodes=1, options=QUIET) as pool:
        (pid,) = agent_pids(pool).values()
        os.kill(pid, signal.SIGKILL)
        assert slow_square(7) >> pool == 49
        assert pool.map(lambda x: x + 1, range(100)) == list(range(1, 101))


def test_chaos_a_node_killed_every_two_seconds() -> None:
    """A 20,000-item map and 200 `>>` calls in flight while a node's agent is SIGKILLed every
    2 s: every result is correct and in order, the pool is back at N nodes, one replacement
    per kill, and no process is left afterwards."""
    recorder = Recorder()
    nodes = 3
    seen: set[int] = set()
    kills: list[int] = []
    stop = threading.Event()

    @sky.function
    def work(x: int) -> int:
        time.sleep(0.0015)
        return x * 3

    # Seven kills in about 14 s: a call may meet more dying nodes than the default 3 retries.
    options = dataclasses.replace(QUIET, retry_on_interruption=10)
    with sky.Compute(nodes=nodes, options=options) as pool:
        unsubscribe = pool.subscribe(recorder)

        def killer() -> None:
            rng = random.Random(12)
            while not stop.wait(2.0):
                pids = agent_pids(pool)
                seen.update(pids.values())
                live = [pid for rank, pid in pids.items() if pool.members.channels[rank].lost is None]
                if live:
                    victim = rng.choice(live)
                    os.kill(victim, signal.SIGKILL)
                    kills.append(victim)

        seen.update(agent_pids(pool).values())
        thread = threading.Thread(target=killer)
        thread.start()
        try:
            calls = [pool.run_async(slow_square(i)) for i in range(200)]
            result = pool.map(work, range(20_000))
            answers = [f.result(timeout=120) for f in calls]
        finally:
            stop.set()
            thread.join()
        assert result == [x * 3 for x in range(20_000)]
        assert answers == [i * i for i in range(200)]
        assert len(kills) >= 2, "the work ended before the chaos began"
        wait_for(lambda: pool.current_nodes() == nodes and len(recorder.of(sky.InstanceReplaced)) == len(kills), 60)
        replaced = recorder.of(sky.InstanceReplaced)
        assert len(replaced) == len(kills)
        assert sorted(r for r, _ in rank_and_pid() @ pool) == list(range(nodes))
        seen.update(agent_pids(pool).values())
        unsubscribe()
    assert wait_gone(sorted(seen), 15) == []


def test_a_failing_health_check_gets_its_node_replaced(tmp_path: Path) -> None:
    flag = tmp_path / "sick"

    def healthy(info: sky.InstanceInfo) -> bool | str:
        if info.node == 1 and os.path.exists(flag) and os.getpid() == int(flag.read_text()):
            return "disk full"
        return True

    recorder = Recorder()
    checker = sky.HealthChecker(healthy, interval=0.2, timeout=5, consecutive_failures=2)
    with sky.Compute(nodes=2, options=sky.Options(console=False, health_checker=checker)) as pool:
        unsubscribe = pool.subscribe(recorder)
        pids = agent_pids(pool)
        wait_for(lambda: pool.current_nodes() == 2)
        flag.write_text(str(pids[1]))  # the agent of rank 1 turns sick
        wait_for(lambda: recorder.of(sky.InstanceReplaced), 60)
        (replaced,) = recorder.of(sky.InstanceReplaced)
        assert replaced.rank == 1 and "disk full" in replaced.reason
        (lost,) = recorder.of(sky.InstanceLost)
        assert "disk full" in lost.reason and "2 health check" in lost.reason
        wait_for(lambda: pool.current_nodes() == 2)
        assert agent_pids(pool)[1] != pids[1]
        unsubscribe()
    assert wait_gone(list(pids.values()), 10) == []


def test_a_pool_is_handed_over_once_its_node_passed_its_first_check(tmp_path: Path) -> None:
    # Warming gates readiness: the pool opens once the check passes, not before.
    gate = tmp_path / "open"

    def healthy(info: sky.InstanceInfo) -> bool:
        return os.path.exists(gate)

    opened = [0.0]

    def open_later() -> None:
        time.sleep(1.0)
        opened[0] = time.time()
        gate.write_text("")

    checker = sky.HealthChecker(healthy, interval=0.1, timeout=5, consecutive_failures=1000)
    thread = threading.Thread(target=open_later)
    thread.start()
    try:
        with sky.Compute(nodes=1, options=sky.Options(console=False, health_checker=checker)) as pool:
            entered = time.time()
            assert pool.current_nodes() == 1
            assert sky.function(time.time)() >> pool >= opened[0]
    finally:
        thread.join()
    assert entered >= opened[0] > 0


def test_give_up_after_max_provision_attempts() -> None:
    checker = sky.HealthChecker(lambda info: "broken", interval=0.1, timeout=5, consecutive_failures=1)
    recorder = Recorder()
    unsubscribe = sky.subscribe(recorder)  # (every pool's events: undone below, for the tests after)
    options = sky.Options(console=False, health_checker=checker, max_provision_attempts=2,
                          provision_retry_delay=0.1)
    try:
        # No node ever warms: opening the pool says so (its nodes are gone with it).
        with pytest.raises(sky.NodeLostError, match=r"could not be replaced after 2 attempt\(s\).*max_provision_attempts"):
            sky.Compute(nodes=1, options=options).__enter__()
        deadline = time.monotonic() + 5  # events reach subscribers in bursts, after the raise maybe
        while not any("could not be replaced" in e.message for e in recorder.of(sky.Error)):
            assert time.monotonic() < deadline, recorder.of(sky.Error)
            time.sleep(0.05)
        assert len(recorder.of(sky.InstanceReplaced)) == 1
    finally:
        unsubscribe()


def test_elastic_pools_heal_without_scaling() -> None:
    recorder = Recorder()
    with sky.Compute(nodes=sky.Nodes(desired=2, max=4), options=QUIET) as pool:
        unsubscribe = pool.subscribe(recorder)
        pids = agent_pids(pool)
        os.kill(pids[1], signal.SIGKILL)
        wait_for(lambda: recorder.of(sky.InstanceReplaced) and pool.current_nodes() == 2)
        assert len(pool.members.channels) == 2 and not recorder.of(sky.ClusterProvisioned)
        pool.resize(3)  # and they still resize
        assert pool.current_nodes() == 3
        unsubscribe()
    assert not any(alive(p) for p in pids.values())


def test_partial_readiness_on_local_starts_every_node() -> None:
    with sky.Compute(nodes=sky.Nodes(desired=3, min=1), options=QUIET) as pool:
        wait_for(lambda: pool.current_nodes() == 3)
        assert sorted(r for r, _ in rank_and_pid() @ pool) == [0, 1, 2]


def test_health_checker_validation() -> None:
    with pytest.raises(sky.ConfigError, match="consecutive_failures"):
        sky.HealthChecker(lambda info: True, consecutive_failures=0)
    with pytest.raises(sky.ConfigError, match="interval"):
        sky.HealthChecker(lambda info: True, interval=0)
    with pytest.raises(sky.ConfigError, match="HealthChecker"):
        sky.Options(health_checker=lambda info: True)
    with pytest.raises(sky.ConfigError, match="max_provision_attempts"):
        sky.Options(max_provision_attempts=0)
