"""A pool of a Local group and an SSH group (netns hosts, tests/sshhosts.py): work routed by
group, the pool's collections reached from both, and the SSH group's own world."""

from __future__ import annotations

import os
from typing import Any

import pytest
from sshhosts import SSHHosts

import skyward as sky

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


def provider(hosts: SSHHosts) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts])


@sky.function
def where() -> dict[str, Any]:
    info = sky.instance_info()
    sky.counter("seen").increment()
    return {"group": info.group, "rank": info.group_rank, "node": info.node, "total": info.total_nodes,
            "ip": info.group_peers[info.group_rank].private_ip, "world": [p.private_ip for p in info.group_peers],
            "pid": os.getpid()}


@sky.function
def ip_of(_: object) -> str:
    info = sky.instance_info()
    return info.group_peers[info.group_rank].private_ip


def test_a_local_group_and_an_ssh_group_in_one_pool(ssh_hosts: Any) -> None:
    hosts = ssh_hosts(2)
    addresses = sorted(h.address for h in hosts)
    groups = {"here": sky.Spec(nodes=1), "hosts": sky.Spec(provider=provider(hosts), nodes=2)}
    # The SSH hosts cannot reach this machine's loopback: the collections live on their group.
    with sky.Compute(groups=groups, head="hosts", options=QUIET) as pool:
        everywhere = where() @ pool
        assert [(w["group"], w["rank"], w["node"], w["total"]) for w in everywhere] == [
            ("here", 0, 0, 3), ("hosts", 0, 1, 3), ("hosts", 1, 2, 3)]
        assert everywhere[0]["ip"] == "127.0.0.1"
        assert sorted(w["ip"] for w in everywhere[1:]) == addresses
        assert sorted(everywhere[1]["world"]) == addresses  # the group's world is its own nodes
        assert sorted(set(pool["hosts"].map(ip_of, range(40)))) == addresses
        assert set(pool["here"].map(ip_of, range(10))) == {"127.0.0.1"}
        assert pool.counter("seen").value == 3  # the here group's node reached the hosts' head
        assert {(where() >> pool)["group"] for _ in range(12)} == {"here", "hosts"}
        assert pool.counter("seen").value == 15
