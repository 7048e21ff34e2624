"""pool.serve on real sshd hosts (tests/sshhosts.py): the replicas' packages come from the
wheelhouse the client ships (the hosts have no route out), the app's module from the Image's
includes, and the router reaches each replica's Unix socket through the pool's SSH connection."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import wait_for
from serve import checks
from sshhosts import SSHHost, SSHHosts

import skyward as sky
from skyward.observe import events
from skyward.serve.endpoint import Endpoint

pytestmark = pytest.mark.timeout(600)
QUIET = sky.Options(console=False)


def provider(hosts: list[SSHHost]) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts])


def on_host(host: SSHHost, command: str) -> str:
    argv = [*host.ssh_argv("/dev/null", strict="no"), command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


agent_pid = sky.function(os.getppid)


@pytest.fixture(scope="module")
def served(three_hosts: SSHHosts) -> Iterator[tuple[sky.Pool, Endpoint]]:
    # Two slots a node: one for the replica, one for the tasks the tests run beside it.
    with sky.Compute(provider=provider(list(three_hosts)[:2]), nodes=2, image=checks.image(),
                     worker=sky.Worker(concurrency=2), options=QUIET) as pool, \
            pool.serve("apps:app", ready="/health") as endpoint:
        endpoint.wait_ready(timeout=300)
        yield pool, endpoint


def test_concurrent_requests_are_all_answered_through_two_ssh_nodes(served: tuple[sky.Pool, Endpoint]) -> None:
    _, endpoint = served
    assert [r.state for r in endpoint.replicas] == ["ready", "ready"]
    checks.every_request_is_answered_by_both_nodes(endpoint)


def test_server_sent_events_pass_through_an_ssh_channel_as_they_are_produced(
        served: tuple[sky.Pool, Endpoint]) -> None:
    checks.events_pass_through_as_they_are_produced(*served)


def test_a_killed_agent_fails_no_get_and_its_replica_comes_back(
        served: tuple[sky.Pool, Endpoint], three_hosts: SSHHosts) -> None:
    pool, endpoint = served
    seen: list[Any] = []
    unsubscribe = sky.subscribe(lambda e: seen.append(e) if isinstance(e, sky.ReplicaLost | sky.ReplicaReady) else None)
    try:
        pid = pool.run(agent_pid(), target=1)
        with checks.Load(endpoint) as load:
            wait_for(lambda: len(load.statuses) > 100 and len(load.pids) == 2, 60,
                     "requests on both replicas before the kill")
            before = set(load.pids)  # (the new replica may answer before the wait below returns)
            on_host(three_hosts[1], f"kill -9 {pid}")
            lost = lambda: [e for e in seen if isinstance(e, sky.ReplicaLost)]  # noqa: E731
            wait_for(lambda: events.bus.flush() or lost(), 60, "the replica lost")
            # Healing starts the agent again on its warm host; the endpoint starts the replica there.
            wait_for(lambda: events.bus.flush() or [e for e in seen if isinstance(e, sky.ReplicaReady)], 180,
                     "the replica back after healing")
            wait_for(lambda: load.pids - before, 60, "the new replica answering")
        assert load.statuses and not load.failed(), load.failed()
        assert sorted(r.state for r in endpoint.replicas) == ["ready", "ready"]
    finally:
        unsubscribe()
