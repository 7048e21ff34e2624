"""The pool's secret is not in any environment block a task can read on an SSH node:
the agent gets it on its stdin through SSH and in its environment from the shell that
starts it, and scrubs it from its environment block (bootstrap/envblock.py) before serving.
Real sshd hosts (tests/sshhosts.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sshhosts import SSHHosts

import skyward as sky

pytestmark = pytest.mark.timeout(300)


@sky.function
def holders(token: str) -> dict[str, Any]:
    """On the node: the pids whose /proc/PID/environ holds ``token``, among all readable here,
    and whether this worker's and its agent's could be read at all."""
    import os

    wanted = token.encode()
    found: list[int] = []
    read: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                block = f.read()
        except OSError:
            continue
        read.add(int(entry))
        if wanted in block:
            found.append(int(entry))
    return {"found": found, "self": os.getpid() in read, "agent": os.getppid() in read}


def test_tasks_on_an_ssh_node_do_not_find_the_pools_secret(ssh_hosts: Callable[..., SSHHosts]) -> None:
    hosts = ssh_hosts(1)
    h = hosts[0]
    provider = sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))])
    with sky.Compute(provider=provider, nodes=1, options=sky.Options(console=False)) as pool:
        token = pool.cluster.token
        seen = holders(token) >> pool
    assert seen["self"] and seen["agent"], seen  # both blocks were read...
    assert seen["found"] == [], seen  # ...and neither, nor any other, holds the secret
