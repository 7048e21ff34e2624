"""A Session's labelled pools and a health checker on real sshd hosts:
two pools called by name in one session, each on its own host; a pool handed over only once its
node passed its first check; a check failing after warming gets its node replaced, with a
"health check" reason."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from sshhosts import SSHHost, SSHHosts

import skyward as sky

pytestmark = pytest.mark.timeout(400)

hostname = sky.function(socket.gethostname)


def provider(hosts: list[SSHHost]) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts])


def test_two_labelled_pools_in_one_session_on_their_hosts(three_hosts: SSHHosts) -> None:
    first, second = list(three_hosts)[:2]
    with sky.Session(console=False) as session:
        a = session.compute(provider=provider([first]), nodes=1, name="a")
        b = session.compute(provider=provider([second]), nodes=1, name="b")
        assert (a.label, b.label) == ("a", "b")
        assert hostname() >> a == first.name and hostname() >> b == second.name
        session.stop_pool("b")
        assert not b.is_active and hostname() >> a == first.name


def test_warming_then_a_failure_replaces_the_node_with_a_health_check_reason(three_hosts: SSHHosts) -> None:
    def warm_then_fail() -> object:
        calls = {"n": 0}

        def fn(_info: object) -> bool | str:
            calls["n"] += 1
            if calls["n"] < 3:
                return False  # warming
            return True if calls["n"] < 5 else "synthetic failure"

        return fn

    lost: list[sky.InstanceLost] = []
    got = threading.Event()

    def seen(e: sky.Event) -> None:
        if isinstance(e, sky.InstanceLost):
            lost.append(e)
            got.set()

    checker = sky.HealthChecker(fn=warm_then_fail(), interval=0.5, timeout=5.0,  # type: ignore[arg-type]
                                consecutive_failures=3)
    with sky.Session(console=False) as session:
        started = time.monotonic()
        pool = session.compute(provider=provider(list(three_hosts)[:2]), nodes=1, name="checked",
                               options=sky.Options(console=False, health_checker=checker))
        assert time.monotonic() - started >= 1.0  # two failed checks, half a second apart, first
        assert pool.current_nodes() == 1
        unsubscribe = pool.subscribe(seen)
        try:
            assert got.wait(60), "no node was lost to its health check"
        finally:
            unsubscribe()
    reasons = [e.reason for e in lost]
    assert any("health check" in r and "synthetic failure" in r for r in reasons), reasons
