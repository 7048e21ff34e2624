"""sky.Slurm end to end on a real Slurm cluster (tests/slurmcluster.py): one job of N nodes from
the login node, agents started by srun inside it and reached through the login node."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import skyward as sky

from .conftest import Site

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


class Recorder:
    def __init__(self) -> None:
        self.events: list[sky.Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: sky.Event) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        from skyward.observe import events

        events.bus.flush()
        with self._lock:
            return [e for e in self.events if isinstance(e, kind)]


@sky.function
def where() -> dict[str, Any]:
    import os
    import socket

    info = sky.instance_info()
    return {"hostname": socket.gethostname(), "job": os.environ.get("SLURM_JOB_ID"), "node": info.node,
            "peers": [p.private_ip for p in info.peers]}


def test_a_three_node_pool_runs_on_three_hosts_of_one_job_and_cancels_it_at_exit(site: Site) -> None:
    rec = Recorder()
    unsubscribe = sky.subscribe(rec)
    try:
        with sky.Compute(provider=site.provider(), nodes=3, options=QUIET) as pool:
            answers = where() @ pool
            jobs = pool.cluster.jobs()  # type: ignore[attr-defined]
            queue = site.cluster.jobs()
    finally:
        unsubscribe()
    assert sorted(a["hostname"] for a in answers) == sorted(h.name for h in site.compute)
    assert len(jobs) == 1 and len({a["job"] for a in answers}) == 1
    job = next(iter(jobs))
    assert answers[0]["job"] == job and sorted(jobs[job]) == [0, 1, 2]
    assert [j["state"] for j in queue if j["id"] == job] == ["RUNNING"]
    # The queue was visible: the job's id and its state came as events.
    queued = rec.of(sky.JobQueued)
    assert queued and all(e.job == job for e in queued) and queued[-1].state == "RUNNING"
    # Leaving the pool cancelled the job (or its agents ended it): nothing of it runs.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        states = [j["state"] for j in site.cluster.jobs() if j["id"] == job]
        if all(s in ("COMPLETED", "CANCELLED") for s in states):
            break
        time.sleep(0.2)
    assert all(s in ("COMPLETED", "CANCELLED") for s in states), states
    site.cluster.wait_idle()
