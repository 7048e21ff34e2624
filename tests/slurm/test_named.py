"""A named pool on Slurm (issue 35, item 4): `skyward up` with provider = "slurm", two programs
attach and use it, `ls`/`status`/`exec`/`logs` see the job and its nodes, `down` cancels it; the
record keeps the job ids, the sbatch script and the node list."""

from __future__ import annotations

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
    assert logs.code == 0 and "serving on 127.0.0.1" in logs.out, logs

    down = cli("down", "lab", timeout=120)
    assert down.code == 0, down
    assert not [j for j in site.cluster.jobs() if j["id"] == job and j["state"] in ("RUNNING", "PENDING")]
    assert cli("ls", "--json").json() == []
    site.cluster.wait_idle()
    left = site.on_login("ls ~/.skyward/slurm 2>/dev/null; true")
    assert left.strip() == "", left
