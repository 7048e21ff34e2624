"""A pool of a Local group and a Slurm group (tests/slurmcluster.py): routing by group, each
group's own ranks, and the pool's collections reached from both."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import skyward as sky

from .conftest import Site

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


@sky.function
def where() -> dict[str, Any]:
    info = sky.instance_info()
    sky.counter("slurm-groups").increment()
    return {"group": info.group, "rank": info.group_rank, "size": info.group_size, "node": info.node,
            "host": socket.gethostname(), "ip": info.group_peers[info.group_rank].private_ip}


def test_a_local_group_and_a_slurm_group_in_one_pool(site: Site) -> None:
    groups = {"here": sky.Spec(nodes=1), "job": sky.Spec(provider=site.provider(), nodes=2)}
    # the collections live on the Slurm group: its nodes cannot reach this machine's loopback
    with sky.Compute(groups=groups, head="job", options=QUIET) as pool:
        everywhere = where() @ pool
        assert [(w["group"], w["rank"], w["size"], w["node"]) for w in everywhere] == [
            ("here", 0, 1, 0), ("job", 0, 2, 1), ("job", 1, 2, 2)]
        assert everywhere[0]["ip"] == "127.0.0.1"
        job_hosts = {w["host"] for w in everywhere[1:]}
        assert len(job_hosts) == 2 and socket.gethostname() not in job_hosts  # two compute nodes
        assert {w["host"] for w in [where() >> pool["job"] for _ in range(6)]} <= job_hosts
        assert pool.counter("slurm-groups").value == 9
