"""A named pool on Slurm: `skyward up` with provider = "slurm", two programs
attach and use it, `ls`/`status`/`exec`/`logs` see the job and its nodes, `down` cancels it; the
record keeps the job ids, the sbatch script and the node list."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli.conftest import CLI

from .conftest import Site

pytestmark = pytest.mark.timeout(300)

CLIENT = """
    import json, os, socket
    import skyward as sky

    @sky.function
    def where():
        return socket.gethostname(), os.environ.get("SLURM_JOB_ID")

    with sky.Compute(name="lab", options=sky.Options(console="silent")) as pool:
        print(json.dumps(where() @ pool))
"""


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[CLI]:
    helper = CLI(tmp_path)
    yield helper
    helper("down", "--all", "--force")


def test_a_named_pool_up_used_by_two_programs_and_down(site: Site, cli: CLI) -> None:
    login = f"{site.login.user}@{site.login.address}"
    cli.toml(f'[pools.lab]\nprovider = "slurm"\nnodes = 2\nttl = 120\n\n'
             f'[pools.lab.slurm]\nlogin = "{login}"\nkey = "{site.hosts.client_key}"\n'
             f'known_hosts = "{site.known_hosts}"\ntime = 900\n')
    up = cli("up", "lab", timeout=180)
    assert up.code == 0, up
    record = cli.record("lab")["cluster"]
    (job,) = record["jobs"]
    assert record["jobs"][job]["nodes"] == [0, 1] and "#SBATCH --nodes=2" in record["jobs"][job]["script"]
    assert [n["job"] for n in record["nodes"]] == [job, job]
    # Each agent's identity, as its start-up line said it: the programs below attach holding the
    # nodes to it (a wrong one would be refused as "another agent of this pool").
    assert len({n["agent_id"] for n in record["nodes"]}) == 2 and all(len(n["agent_id"]) == 24 for n in record["nodes"])
    assert {j["id"]: j["state"] for j in site.cluster.jobs()}[job] == "RUNNING"

    for _ in range(2):  # two programs, one after the other, on the same job
        client = cli.python(CLIENT)
        assert client.code == 0, client
        answers = client.json()
        assert len({h for h, _ in answers}) == 2 and {j for _, j in answers} == {job}

    (row,) = cli("ls", "--json").json()
    assert (row["name"], row["provider"], row["nodes"], row["state"]) == ("lab", "slurm", 2, "running")
    ran = cli("exec", "lab", "--json", "--", "hostname")
    assert ran.code == 0, ran
    assert sorted(r["stdout"].strip() for r in ran.json()) == sorted(h for h, _ in answers)
    logs = cli("logs", "lab")
    assert logs.code == 0 and "agent: serving on " in logs.out, logs

    pool_id = cli.record("lab")["id"]
    kept = json.loads((cli.home / "records" / f"{pool_id}.json").read_text())["slurm"]
    assert kept["jobs"][job]["pool_nodes"] == [0, 1] and "#SBATCH --nodes=2" in kept["jobs"][job]["script"]
    assert sorted(kept["jobs"][job]["nodes"]) == sorted(h for h, _ in answers)

    down = cli("down", "lab", timeout=120)
    assert down.code == 0, down
    # The job's accounting went into the pool's record and the trail. This cluster keeps no
    # accounting storage (sacct says so): the figures come from the controller, marked so.
    kept = json.loads((cli.home / "records" / f"{pool_id}.json").read_text())["slurm"]
    usage = kept["jobs"][job]["usage"]
    assert usage["state"].startswith("CANCELLED") and usage["elapsed_seconds"] >= 1, kept
    cpus = 2 * site.cluster.cpus  # two nodes, each its node's CPUs (no vcpus=: the partition's per node)
    assert usage["cpus"] == cpus and usage["cpu_hours"] == round(cpus * usage["elapsed_seconds"] / 3600, 4), kept
    assert usage["gpu_hours"] == 0 and kept["cpu_hours"] == usage["cpu_hours"], kept
    assert "accounting storage is disabled" in kept["accounting"] and "scontrol" in kept["accounting"], kept
    destroyed = [json.loads(line) for line in (cli.home / "audit" / "lab.jsonl").read_text().splitlines()][-1]
    assert destroyed["event"] == "destroyed" and destroyed["slurm"]["cpu_hours"] == usage["cpu_hours"], destroyed
    assert destroyed["slurm"]["jobs"][job]["nodelist"] == usage["nodelist"], destroyed
    assert cli("history", "--verify").code == 0  # the amended record is one the trail vouches for
    assert not [j for j in site.cluster.jobs() if j["id"] == job and j["state"] in ("RUNNING", "PENDING")]
    assert cli("ls", "--json").json() == []
    site.cluster.wait_idle()
    left = site.on_login("ls ~/.skyward/slurm 2>/dev/null; true")
    assert left.strip() == "", left


def test_a_named_pool_whose_job_ended_is_judged_by_the_job_not_its_ttl(site: Site, cli: CLI) -> None:
    login = f"{site.login.user}@{site.login.address}"
    cli.toml(f'[pools.gone]\nprovider = "slurm"\nnodes = 1\nttl = 3600\n\n'
             f'[pools.gone.slurm]\nlogin = "{login}"\nkey = "{site.hosts.client_key}"\n'
             f'known_hosts = "{site.known_hosts}"\n')
    assert cli("up", "gone", timeout=180).code == 0
    (job,) = cli.record("gone")["cluster"]["jobs"]
    (row,) = cli("ls", "--json").json()
    assert row["state"] == "running" and row["nodes_down"] == [], row
    site.cluster.run(["scancel", job])  # the site ends it (an admin, preemption, the time limit)
    site.cluster.wait_no_jobs()
    # Its ttl has an hour to go, but its job is over: the pool is gone, and ls removes it.
    (row,) = cli("ls", "--json").json()
    assert row["state"] == "expired" and row["removed"], row
    assert cli("ls", "--json").json() == []
