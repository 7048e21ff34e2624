"""A pool near its max_duration deadline starts no node: no autoscale step, no resize up, no
replacement for a lost node, each said once in a clear line. A cloud pool's cluster carries the
deadline (skyward.providers.cloud sets it from the stack's plan); here a real Local pool is given
one, so that the real membership, autoscaler and healing decide, over real agent processes."""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import wait_gone
from helpers import Recorder, wait_for

import skyward as sky
from skyward.providers.base import GROWTH_MARGIN

pytestmark = pytest.mark.timeout(180)


@sky.function
def nap(seconds: float) -> int:
    time.sleep(seconds)
    return sky.instance_info().node


def _near(pool: sky.Pool) -> None:
    """The pool's deadline a minute away: well inside the margin before it."""
    pool.cluster.deadline = time.time() + 60


def test_no_growth_says_why_only_inside_the_margin() -> None:
    with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
        cluster = pool.cluster
        assert cluster.deadline is None and cluster.no_growth() is None  # Local: no deadline
        cluster.deadline = time.time() + GROWTH_MARGIN + 120
        assert cluster.no_growth() is None
        cluster.deadline = time.time() + 100
        said = cluster.no_growth()
        assert said is not None and "max_duration ends in" in said and f"last {GROWTH_MARGIN:.0f} s" in said
        cluster.deadline = time.time() - 5
        assert "ended" in (cluster.no_growth() or "")


def test_a_lost_node_is_not_replaced_near_the_deadline() -> None:
    recorder = Recorder()
    options = sky.Options(console=False, provision_retry_delay=0.1)
    with sky.Compute(nodes=2, options=options) as pool:
        unsubscribe = pool.subscribe(recorder)
        _near(pool)
        pids = {n["index"]: n["pid"] for n in pool.cluster.describe()["nodes"]}
        lost = pool.members.channels[1].node
        os.kill(pids[lost], signal.SIGKILL)
        wait_for(lambda: any("max_duration" in e.message for e in recorder.of(sky.Error)), timeout=60)
        (error,) = [e for e in recorder.of(sky.Error) if "max_duration" in e.message]
        assert f"node {lost} (rank 1) is not replaced" in error.message and "1 node(s)" in error.message
        assert not recorder.of(sky.InstanceReplaced) and not recorder.of(sky.InstanceRequested)
        assert pool.current_nodes() == 1
        assert nap(0) >> pool == pool.members.channels[0].node  # the node left still works
        unsubscribe()
    assert wait_gone(list(pids.values()), 10) == []


def test_autoscale_and_resize_do_not_grow_near_the_deadline() -> None:
    recorder = Recorder()
    options = sky.Options(console=False, autoscale_cooldown=0, reconcile_tick_interval=0.2)
    with sky.Compute(nodes=sky.Nodes(desired=1, max=3), options=options) as pool:
        unsubscribe = pool.subscribe(recorder)
        _near(pool)
        slots = pool.members.worker.slots
        running = [pool.run_async(nap(1.5)) for _ in range(3 * slots)]  # enough for 3 nodes
        wait_for(lambda: any("stays at 1 node" in e.message for e in recorder.of(sky.Log)), timeout=30)
        [f.result(timeout=60) for f in running]
        assert pool.current_nodes() == 1 and not recorder.of(sky.InstanceRequested)
        said = [e for e in recorder.of(sky.Log) if "stays at 1 node" in e.message]
        assert len(said) == 1 and "max_duration ends in" in said[0].message  # once, not every tick
        with pytest.raises(sky.ProviderError, match=r"does not grow from 1 to 2 node\(s\).*max_duration"):
            pool.resize(2)
        assert pool.members.nodes == sky.Nodes(desired=1, max=3)  # the range is unchanged
        pool.cluster.deadline = None  # and without a deadline the same pool grows
        pool.resize(2)
        assert pool.current_nodes() == 2
        unsubscribe()


def test_a_cloud_pools_cluster_takes_the_deadline_from_its_plan() -> None:
    # What ties a cloud stack to its cluster, created or attached (skyward.providers.cloud): the
    # plan's absolute max_duration deadline (epoch seconds) is the cluster's.
    from types import SimpleNamespace

    from skyward.providers import cloud

    for expires in (int(time.time()) + 7200, None):
        cluster = SimpleNamespace()
        cloud._heal_hook(cluster, SimpleNamespace(SSHHost=dict), SimpleNamespace(plan=SimpleNamespace(expires=expires)))  # type: ignore[arg-type]
        assert cluster.deadline == expires
