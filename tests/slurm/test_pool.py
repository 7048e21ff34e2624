"""sky.Slurm end to end on a real Slurm cluster (tests/slurmcluster.py): one job of N nodes from
the login node, agents started by srun inside it and reached through the login node."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from helpers import Recorder

import skyward as sky

from .conftest import Site

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


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


@sky.function
def environments_holding(secret: str) -> list[str]:
    """Every process of this user on the node whose environment block holds ``secret``."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                block = f.read()
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if secret.encode() in block:
            found.append(f"{pid} {comm}")
    return found


def test_the_pools_secret_is_in_no_environment_of_the_job(site: Site) -> None:
    """The agents' secret reaches them through a 0600 file, never the job's environment, which
    Slurm keeps in the controller and, with AccountingStoreFlags=job_env, in slurmdbd; so no
    process of the job (the batch script, srun's tasks, node.sh, the agent, the worker) holds it
    in its environment block."""
    with sky.Compute(provider=site.provider(), nodes=2, options=QUIET) as pool:
        cluster: Any = pool.cluster
        holders = environments_holding(cluster.token) @ pool
        mode = site.on_login(f"stat -c %a {cluster.folder}/token || echo none").strip()
    assert holders == [[], []]
    assert mode == "600"


def test_submit_srun_asks_for_an_interactive_job_which_starts_at_once(site: Site) -> None:
    """sky.Slurm(submit="srun"): the same job asked for by an srun left running on the login node,
    which Slurm schedules the moment it is asked (a batch job waits for the scheduler's next pass,
    batch_sched_delay); it ends when the pool leaves, and srun with it."""
    with sky.Compute(provider=site.provider(submit="srun"), nodes=3, options=QUIET) as pool:
        answers = where() @ pool
        jobs = pool.cluster.jobs()  # type: ignore[attr-defined]
        job = next(iter(jobs))
        shown = site.cluster.run(["scontrol", "show", "job", job]).stdout
        launcher = site.on_login(f"cat {pool.cluster.folder}/job-0.srun")  # type: ignore[attr-defined]
    assert sorted(a["hostname"] for a in answers) == sorted(h.name for h in site.compute)
    assert len(jobs) == 1 and {a["job"] for a in answers} == {job}
    assert "BatchFlag=0" in shown and "JobState=RUNNING" in shown, shown  # interactive, not batch
    assert "exec srun " in launcher and "--nodes=3" in launcher, launcher
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        states = [j["state"] for j in site.cluster.jobs() if j["id"] == job]
        if all(s in ("COMPLETED", "CANCELLED", "FAILED") for s in states):
            break
        time.sleep(0.2)
    assert all(s in ("COMPLETED", "CANCELLED", "FAILED") for s in states), states
    left = site.on_login("pgrep -u \"$(id -un)\" -x srun || true").split()
    assert left == [], left  # no srun of the pool's outlives it on the login node
    site.cluster.wait_idle()


def test_submit_srun_refusals_are_slurms_words_too(site: Site) -> None:
    with pytest.raises(sky.ProviderError) as info, \
            sky.Compute(provider=site.provider(submit="srun", partition="nosuch"), nodes=1, options=QUIET):
        pass
    said = str(info.value)
    assert "Invalid partition" in said and "can never run it" in said, said
    assert "partition 'nosuch' is not one of this cluster's" in said, said
    assert site.cluster.jobs() == []


def _blocker(site: Site, seconds: int) -> str:
    """A job of root's holding every compute node, as another user's job on a busy cluster does."""
    out = site.cluster.run(["sbatch", "--parsable", "--exclusive", f"-N{len(site.compute)}", "--chdir=/",
                            "-o", "/dev/null", "--job-name=someone-else", "--wrap", f"sleep {seconds}"]).stdout
    return out.strip().split(";")[0]


def test_a_pool_behind_another_job_says_why_it_waits_and_gives_up_after_pending_timeout(site: Site) -> None:
    blocker = _blocker(site, 60)
    rec = Recorder()
    unsubscribe = sky.subscribe(rec)
    try:
        t0 = time.monotonic()
        with pytest.raises(sky.ProviderError) as info, \
                sky.Compute(provider=site.provider(pending_timeout=3), nodes=1, options=QUIET):
            pass
        took = time.monotonic() - t0
        queued = rec.of(sky.JobQueued)
        assert queued and queued[0].state == "PENDING" and queued[0].reason in ("Resources", "Priority")
        job = queued[0].job
        message = str(info.value)
        # The reason as it was last (Priority first, then Resources: updated as Slurm changes it).
        assert job in message and "pending_timeout" in message and queued[-1].reason in message, message
        assert took < 30, took
        # The job that gave up was cancelled; the other one runs on.
        states = {j["id"]: j["state"] for j in site.cluster.jobs()}
        assert states.get(job) in (None, "CANCELLED"), states
        assert states[blocker] == "RUNNING"
    finally:
        unsubscribe()
        site.cluster.run(["scancel", blocker])
        site.cluster.wait_idle()


def test_a_pool_waits_its_turn_and_starts_when_the_nodes_free_up(site: Site) -> None:
    _blocker(site, 3)
    rec = Recorder()
    unsubscribe = sky.subscribe(rec)
    try:
        with sky.Compute(provider=site.provider(), nodes=2, options=QUIET) as pool:
            assert len(where() @ pool) == 2
    finally:
        unsubscribe()
    states = [(e.state, e.reason) for e in rec.of(sky.JobQueued)]
    assert states[0][0] == "PENDING" and states[-1][0] == "RUNNING", states
    site.cluster.wait_idle()


@pytest.mark.parametrize(("kw", "nodes", "words"), [
    ({"partition": "nosuch"}, 1, "Invalid partition"),
    ({}, 9, "PartitionConfig"),  # Slurm queues it, PENDING for a reason that never passes
    ({"options": ["--mem=999999G"]}, 1, "Requested node configuration is not available"),
])
def test_a_request_the_cluster_can_never_satisfy_fails_at_once_in_slurms_words(
        site: Site, kw: dict[str, Any], nodes: int, words: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(sky.ProviderError) as info, sky.Compute(provider=site.provider(**kw), nodes=nodes,
                                                              options=QUIET):
        pass
    assert words.lower() in str(info.value).lower() and "can never run it" in str(info.value), info.value
    assert time.monotonic() - t0 < 20
    assert site.cluster.jobs() == []
    # ...and then in the pool's own terms, naming what is wrong and what the cluster has.
    said = str(info.value)
    if kw.get("partition"):
        assert "partition 'nosuch' is not one of this cluster's" in said and "debug (default)" in said, said
    elif nodes == 9:
        assert "nodes=9 is more than partition 'debug' has (3)" in said, said


def test_a_time_over_the_partitions_maxtime_is_refused_naming_the_limit(site: Site) -> None:
    names = ",".join(h.name for h in site.compute)
    site.cluster.run(["scontrol", "create", "PartitionName=short", f"Nodes={names}", "MaxTime=2",
                      "State=UP"])
    try:
        with pytest.raises(sky.ProviderError) as info, \
                sky.Compute(provider=site.provider(partition="short", time="10:00"), nodes=1, options=QUIET):
            pass
    finally:
        site.cluster.run(["scontrol", "delete", "PartitionName=short"], check=False)
    said = str(info.value)
    assert "can never run it" in said, said
    assert "is over partition 'short''s MaxTime of 2:00" in said, said
    assert site.cluster.jobs() == [] or all(j["state"] != "PENDING" for j in site.cluster.jobs())


def test_a_node_without_vcpus_asks_for_the_partitions_cpus_per_node(site: Site) -> None:
    """A pool's node is a machine: without vcpus= each job asks for all the CPUs of the
    partition's nodes (Slurm would give one, and two one-node jobs of the pool could share a
    host); vcpus= asks for fewer."""
    with sky.Compute(provider=site.provider(), nodes=2, options=QUIET) as pool:
        job = next(iter(pool.cluster.jobs()))  # type: ignore[attr-defined]
        whole = site.cluster.run(["scontrol", "show", "job", job]).stdout
    with sky.Compute(provider=site.provider(), nodes=1, vcpus=1, options=QUIET) as pool:
        job = next(iter(pool.cluster.jobs()))  # type: ignore[attr-defined]
        one = site.cluster.run(["scontrol", "show", "job", job]).stdout
    assert f"NumCPUs={2 * site.cluster.cpus} " in whole and f"CPUs/Task={site.cluster.cpus} " in whole, whole
    assert "NumCPUs=1 " in one, one


def test_time_partition_and_options_reach_sbatch(site: Site) -> None:
    provider = site.provider(time=600, options=["--comment=skyward-test"])
    with sky.Compute(provider=provider, nodes=1, options=QUIET) as pool:
        job = next(iter(pool.cluster.jobs()))  # type: ignore[attr-defined]
        shown = site.cluster.run(["scontrol", "show", "job", job]).stdout
    assert "TimeLimit=00:10:00" in shown and "Comment=skyward-test" in shown, shown
    assert "Partition=debug" in shown


def test_offers_list_the_partitions_from_sinfo_and_a_spec_picks_one_that_fits(site: Site) -> None:
    site.cluster.wait_idle()  # the last test's job may still be completing: its node is not idle yet
    (offer,) = sky.offers(provider=site.provider())
    assert offer.provider == "slurm" and offer.instance_type == "debug" and offer.extra["default"]
    assert offer.extra["nodes"] == 3 and offer.extra["idle"] == 3 and offer.vcpus == site.cluster.cpus
    assert offer.accelerator is None and offer.price() == 0.0
    assert sky.offers("A100:4", provider=site.provider()) == []  # no partition has GPUs
    with pytest.raises(sky.ProviderError) as info, \
            sky.Compute(provider=site.provider(), vcpus=site.cluster.cpus * 8, options=QUIET):
        pass
    assert "no partition" in str(info.value) and "debug (default)" in str(info.value), info.value
    with sky.Compute(provider=site.provider(), vcpus=1, options=QUIET) as pool:
        job = next(iter(pool.cluster.jobs()))  # type: ignore[attr-defined]
        assert "Partition=debug" in site.cluster.run(["scontrol", "show", "job", job]).stdout


@sky.function(timeout=120)
def ddp_step() -> tuple[int, int, float, str, list[Any]]:
    import socket

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)  # different data on every rank
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    return rank, dist.get_world_size(), t.item(), socket.gethostname(), [p.detach().clone() for p in model.parameters()]


def test_torch_ddp_all_reduce_across_the_jobs_two_nodes(site: Site) -> None:
    pytest.importorskip("torch", reason="torch is not installed in this environment (the nodes get the client's)")
    import torch

    # The plugin's rendezvous and process group as they are; its install is the client's own torch
    # from this machine's package sources (the plugin names download.pytorch.org, which neither
    # this machine nor the test hosts reach, as on a site without internet).
    version = torch.__version__.split("+")[0]
    plugin = dataclasses.replace(sky.plugins.torch(backend="gloo"),
                                 transform=lambda image, cluster: dataclasses.replace(
                                     image, pip=(*image.pip, f"torch=={version}")))
    with sky.Compute(provider=site.provider(), nodes=2, plugins=[plugin], options=QUIET) as pool:
        results = ddp_step() @ pool
    assert sorted(r[0] for r in results) == [0, 1] and all(r[1] == 2 and r[2] == 3.0 for r in results), results
    assert len({r[3] for r in results}) == 2  # two compute nodes of the job, not one
    (*_, w0), (*_, w1) = results
    assert all(torch.equal(a, b) for a, b in zip(w0, w1, strict=True))  # DDP synced the gradients
