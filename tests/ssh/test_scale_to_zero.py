"""Scale to zero on real sshd hosts: a pool born with no node starts one on a host
at its first task, an idle one gives its hosts back (head included) and the next task wakes it
on a host again."""

from __future__ import annotations

import time

import pytest
from sshhosts import SSHHosts

import skyward as sky

pytestmark = pytest.mark.timeout(300)


@sky.function
def where() -> tuple[int, str]:
    import socket

    return sky.instance_info().node, socket.gethostname()


def _wait(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_an_ssh_pool_born_asleep_wakes_on_a_host_sleeps_and_wakes_again(three_hosts: SSHHosts) -> None:
    hosts = list(three_hosts)[:2]
    provider = sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                              for h in hosts])
    seen: list[sky.Event] = []
    options = sky.Options(console=False, autoscale_idle_timeout=1.0, reconcile_tick_interval=0.2)
    with sky.Compute(provider=provider, nodes=(0, 2), options=options) as pool:
        pool.subscribe(seen.append)
        assert pool.current_nodes() == 0
        node, host = where() >> pool  # the first task starts the head node on a host
        assert node == 0 and host in {h.name for h in hosts}
        assert [type(e) for e in seen if isinstance(e, sky.ClusterWoke)] == [sky.ClusterWoke]

        _wait(lambda: pool.current_nodes() == 0, 60)  # idle: every host given back
        _wait(lambda: any(isinstance(e, sky.ClusterAsleep) for e in seen), 10)

        node, host = where() >> pool  # a host again: the ones given back are free
        assert node == 0 and host in {h.name for h in hosts}
        assert len([e for e in seen if isinstance(e, sky.ClusterWoke)]) == 2


def test_an_ssh_pool_of_min_zero_starts_its_nodes_reaps_to_zero_and_wakes(three_hosts: SSHHosts) -> None:
    hosts = list(three_hosts)[:2]
    provider = sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                              for h in hosts])
    seen: list[sky.Event] = []
    options = sky.Options(console=False, autoscale_idle_timeout=1.0, autoscale_cooldown=0.5,
                          reconcile_tick_interval=0.2)
    with sky.Compute(provider=provider, nodes=sky.Nodes(desired=2, min=0, max=2), options=options) as pool:
        pool.subscribe(seen.append)
        _wait(lambda: pool.current_nodes() == 2, 120)
        _wait(lambda: pool.current_nodes() == 0, 60)  # idle: both hosts given back, head included
        _wait(lambda: any(isinstance(e, sky.ClusterAsleep) for e in seen), 10)
        node, host = where() >> pool  # the next task wakes it on a host
        assert node == 0 and host in {h.name for h in hosts}
