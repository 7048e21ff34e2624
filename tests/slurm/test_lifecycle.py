"""Nothing outlives a Slurm pool, and a lost node comes back: a node whose
agent dies, or whose one-node job's host goes DOWN, is replaced by a new one-node job keeping its
rank (a job scancel'ed is not: tests/slurm/test_citizen.py); a client killed outright
leaves a job that ends by itself within the agents' lease."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import Recorder, wait_for

import skyward as sky

from .conftest import Site

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


@sky.function
def where() -> tuple[int, str, str]:
    import os
    import socket

    return sky.instance_info().node, socket.gethostname(), os.environ.get("SLURM_JOB_ID", "")


@sky.function
def agent_pid() -> int:
    import os

    return os.getppid()


def test_a_lost_node_and_a_cancelled_node_job_are_replaced_by_one_node_jobs_keeping_the_rank(site: Site) -> None:
    rec = Recorder()
    # Whole nodes per job (--exclusive): a one-node job of 1 CPU could share a host with node 0's
    # job, and the host set DOWN below would take both.
    with sky.Compute(provider=site.provider(options=["--exclusive"]), nodes=2, options=QUIET) as pool:
        unsubscribe = pool.subscribe(rec)
        try:
            (first_job,) = pool.cluster.jobs()  # type: ignore[attr-defined]
            ranks = where() @ pool
            assert [r[0] for r in ranks] == [0, 1] and {r[2] for r in ranks} == {first_job}
            # Node 1's agent dies (a crashed process on a compute node): the job keeps node 0.
            host = next(h for h in site.compute if h.name == ranks[1][1])
            pid = pool.run(agent_pid(), target=1)
            subprocess.run(["nsenter", "-t", str(host.pid), "-p", "-m", "--", "kill", "-9", str(pid)], check=True)
            wait_for(lambda: len(rec.of(sky.InstanceReplaced)) == 1 and pool.current_nodes() == 2, 120,
                     "for the first replacement")
            (replaced,) = rec.of(sky.InstanceReplaced)
            assert replaced.rank == 1
            jobs = pool.cluster.jobs()  # type: ignore[attr-defined]
            second_job = next(j for j in jobs if j != first_job)
            assert len(jobs[second_job]) == 1
            after = where() @ pool
            assert [r[0] for r in after] == [0, 1]
            assert after[0][2] == first_job and after[1][2] == second_job
            # That one-node job's node fails (set DOWN: its agent goes with it; a job without
            # --no-kill would end NODE_FAIL): replaced again. A job the user or an admin
            # scancel'ed is not (tests/slurm/test_citizen.py).
            failed = after[1][1]
            site.cluster.run(["scontrol", "update", f"nodename={failed}", "state=down", "reason=skyward-test"])
            try:
                wait_for(lambda: len(rec.of(sky.InstanceReplaced)) == 2 and pool.current_nodes() == 2, 120,
                         "for the second replacement")
                last = where() @ pool
                assert [r[0] for r in last] == [0, 1]
                assert last[1][2] not in (first_job, second_job)  # (the host may be back: ReturnToService=2)
                assert rec.of(sky.InstanceLost)
            finally:
                site.cluster.run(["scontrol", "update", f"nodename={failed}", "state=resume"], check=False)
        finally:
            unsubscribe()
    wait_for(lambda: not [j for j in site.cluster.jobs() if j["state"] in ("RUNNING", "PENDING")], 30,
             "for the pool's jobs to end")
    site.cluster.wait_idle()


CLIENT = textwrap.dedent("""
    import json, sys, time
    import skyward as sky
    args = json.loads(sys.argv[1])
    provider = sky.Slurm(args["login"], key=args["key"], known_hosts=args["known_hosts"])
    pool = sky.Compute(provider=provider, nodes=2, ttl=args["ttl"], options=sky.Options(console=False)).__enter__()
    print(json.dumps(pool.cluster.jobs()), flush=True)
    time.sleep(600)
""")


def test_a_client_killed_outright_leaves_a_job_that_ends_within_the_agents_lease(site: Site, tmp_path: Path) -> None:
    ttl = 8
    args = {"login": f"{site.login.user}@{site.login.address}", "key": str(site.hosts.client_key),
            "known_hosts": site.known_hosts, "ttl": ttl}
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, json.dumps(args)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "SKYWARD_HOME": str(tmp_path)})
    try:
        assert proc.stdout is not None
        jobs = json.loads(proc.stdout.readline())
        (job,) = jobs
        assert {j["id"]: j["state"] for j in site.cluster.jobs()}[job] == "RUNNING"
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: not [j for j in site.cluster.jobs() if j["id"] == job and j["state"] in ("RUNNING", "PENDING")],
             ttl + 30, "for the orphaned job to end")
    took = time.monotonic() - killed
    assert took < ttl + 30, took
    site.cluster.wait_idle()


@sky.function
def hold(seconds: float) -> tuple[int, str]:
    import os
    import time

    time.sleep(seconds)
    return sky.instance_info().node, os.environ.get("SLURM_JOB_ID", "")


def test_an_elastic_pool_grows_and_shrinks_by_jobs_and_sleeps_at_zero(site: Site) -> None:
    rec = Recorder()
    options = sky.Options(console=False, autoscale_idle_timeout=1.0, autoscale_cooldown=0.5,
                          reconcile_tick_interval=0.2)

    def running() -> list[str]:
        return [j["id"] for j in site.cluster.jobs() if j["state"] in ("RUNNING", "PENDING", "CONFIGURING")]

    with sky.Compute(provider=site.provider(), nodes=sky.Nodes(desired=0, max=2), options=options) as pool:
        pool.subscribe(rec)
        assert pool.current_nodes() == 0 and running() == []  # born asleep: no job in the queue
        node, _, first = where() >> pool
        assert node == 0 and running() == [first]  # the first task woke it: a one-node job
        # A burst grows it by one more job, up to max (each node's own job).
        futures = [hold(2.0) > pool for _ in range(4)]
        wait_for(lambda: pool.current_nodes() == 2, 60, "for the pool to grow")
        assert len([f.result() for f in futures]) == 4
        jobs = pool.cluster.jobs()  # type: ignore[attr-defined]
        assert len(jobs) == 2 and sorted(len(n) for n in jobs.values()) == [1, 1], jobs
        both = where() @ pool  # the new node is the second job's
        assert [r[0] for r in both] == [0, 1] and {r[2] for r in both} == set(jobs), both
        # Idle past the timeout: back to zero nodes, and no job of it left in the queue.
        wait_for(lambda: pool.current_nodes() == 0, 60, "for the pool to sleep")
        wait_for(lambda: running() == [], 30, "for its jobs to end")
        assert rec.of(sky.ClusterAsleep)
        # The next task wakes it with a new job.
        node, _, again = where() >> pool
        assert node == 0 and again not in (first, *jobs) and running() == [again]
    wait_for(lambda: running() == [], 30, "for the pool's jobs to end")
    site.cluster.wait_idle()
