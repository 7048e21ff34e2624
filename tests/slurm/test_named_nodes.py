"""A named Slurm pool's nodes from the terminal: `skyward ssh` and `skyward cp`
reach each node through the login node (``srun --overlap`` inside the pool's job: never a login
to a compute node), with what the node's tasks see; `ls`/`status` show the job, its state and
its nodes; `down` puts the job's accounting into the record and the trail.

One pool for the module (it starts in a few seconds on the shared home)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli.conftest import CLI

from .conftest import Site

pytestmark = pytest.mark.timeout(300)

TASK = """
    import json, os, socket
    import skyward as sky

    @sky.function
    def look():
        data = open("shipped.txt").read() if os.path.exists("shipped.txt") else None
        return {"host": socket.gethostname(), "cwd": os.getcwd(), "data": data}

    with sky.Compute(name="lab", options=sky.Options(console="silent")) as pool:
        print(json.dumps(look() @ pool))
"""


@pytest.fixture(scope="module")
def lab(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CLI]:
    cli = CLI(tmp_path_factory.mktemp("slurm-named"))
    login = f"{site.login.user}@{site.login.address}"
    cli.toml(f'[pools.lab]\nprovider = "slurm"\nnodes = 2\nttl = 300\n\n'
             f'[pools.lab.slurm]\nlogin = "{login}"\nkey = "{site.hosts.client_key}"\n'
             f'known_hosts = "{site.known_hosts}"\ntime = 900\n')
    try:
        up = cli("up", "lab", timeout=180)
        assert up.code == 0, up
        yield cli
    finally:
        cli("down", "--all", "--force", timeout=120)
        site.cluster.wait_no_jobs()


def _record(cli: CLI) -> dict[str, Any]:
    return cli.record("lab")["cluster"]


def _job(cli: CLI) -> str:
    (job,) = _record(cli)["jobs"]
    return str(job)


def test_ssh_runs_a_command_on_the_node_inside_the_pools_job(site: Site, lab: CLI) -> None:
    nodes = _record(lab)["nodes"]
    tasks = lab.python(TASK)
    assert tasks.code == 0, tasks
    seen = tasks.json()
    for rank in (0, 1):
        ran = lab("ssh", "lab", "--node", str(rank), "--",
                  'echo "$(hostname)|$SLURM_JOB_ID|$PWD|$(command -v python)"')
        assert ran.code == 0, ran
        host, job, cwd, python = ran.out.strip().splitlines()[-1].split("|")
        # The node itself (not the login node), inside the pool's job, where its tasks run,
        # with the pool's Python first on PATH.
        assert host == nodes[rank]["hostname"] == seen[rank]["host"] != site.login.name, ran
        assert job == _job(lab) and cwd == seen[rank]["cwd"], ran
        assert python.startswith(_record(lab)["sky"]) and python.endswith("/bin/python"), ran
    # The command's exit status is this command's.
    failed = lab("ssh", "lab", "--node", "1", "--", "exit 7")
    assert failed.code == 7, failed


def test_ssh_reads_a_script_from_stdin_when_it_is_not_a_terminal(lab: CLI) -> None:
    node1 = _record(lab)["nodes"][1]["hostname"]
    proc = subprocess.run([sys.executable, "-m", "skyward", "ssh", "lab", "--node", "1"], cwd=lab.cwd,
                          env=lab.env, input="read -r line <<< 'from-stdin'\necho \"$line on $(hostname)\"\n",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"from-stdin on {node1}", proc


def test_cp_uploads_to_each_node_and_downloads_from_each(lab: CLI, tmp_path: Path) -> None:
    payload = "".join(f"line {i}\n" for i in range(20000))  # ~200 KB, beyond one srun I/O buffer
    src = tmp_path / "shipped.txt"
    src.write_text(payload)
    up = lab("cp", str(src), "lab:", "--json")
    assert up.code == 0, up
    assert sorted(d["node"] for d in up.json()) == [0, 1]
    # Each node's own disk has it (the pool's working directory is node-local, not the shared home).
    tasks = lab.python(TASK)
    assert tasks.code == 0, tasks
    assert [t["data"] for t in tasks.json()] == [payload, payload]
    for i in range(4):  # srun's I/O could lose the end of a stream: every byte, every time
        down = lab("cp", "lab:shipped.txt", str(tmp_path / f"back{i}"), "--json")
        assert down.code == 0, down
        for rank in (0, 1):
            assert (tmp_path / f"back{i}" / f"node-{rank}" / "shipped.txt").read_text() == payload


def test_ls_and_status_show_the_job_its_state_and_nodes(lab: CLI) -> None:
    job = _job(lab)
    hosts = [n["hostname"] for n in _record(lab)["nodes"]]
    (row,) = lab("ls", "--json").json()
    (shown_job,) = row["slurm"]["jobs"]
    assert {k: shown_job[k] for k in ("job", "state", "nodes", "pool_nodes")} == \
        {"job": job, "state": "RUNNING", "nodes": hosts, "pool_nodes": [0, 1]}, row
    assert row["state"] == "running" and row["nodes_down"] == [], row
    table = lab("ls")
    assert f"job {job} RUNNING" in table.out, table
    status = lab("status", "lab", "--json")
    assert status.code == 0, status
    shown = status.json()
    assert shown["slurm"]["jobs"][0]["job"] == job and shown["slurm"]["jobs"][0]["state"] == "RUNNING"
    text = lab("status", "lab")
    assert f"Slurm job {job}: RUNNING on {','.join(hosts)}" in text.out, text
    assert json.dumps(shown)  # plain JSON


def test_ssh_is_a_terminal_on_the_node_inside_the_job(lab: CLI, tmp_path: Path) -> None:
    from cli.tmuxterm import Tmux

    node1 = _record(lab)["nodes"][1]["hostname"]
    term = Tmux(tmp_path, lab.env, lab.cwd, width=100, height=30)
    try:
        term.type(f"{sys.executable} -m skyward ssh lab --node 1")
        term.wait_for(r"\(lab:1\) ")
        term.type('echo "@@host=$(hostname) @@job=$SLURM_JOB_ID @@tty=$(tty) @@size=$(stty size)"')
        m = term.wait_for(r"@@host=(\S+) @@job=(\S+) @@tty=(\S+) @@size=(\d+ \d+)")
        assert (m[1], m[2]) == (node1, _job(lab)) and m[3].startswith("/dev/pts/"), m.group(0)
        term.type('echo "@@sleep""ing"; sleep 60')
        term.wait_for(r"@@sleeping")  # the line runs (C-c before it would interrupt nothing)
        term.keys("C-c")  # to the node's shell: the sleep stops, the shell stays
        term.type('echo "@@after=$?"')
        assert term.wait_for(r"@@after=(\d+)")[1] == "130"
        term.type("exit 6")
        term.wait_for(r"exit 6\s*\n(?:(?:exit|srun: .*)\s*\n){1,2}\s*outer\$")  # back in the outer shell
        term.type('echo "@@rc=$?"')
        assert term.wait_for(r"@@rc=(\d+)")[1] == "6"
    finally:
        term.close()


def test_offers_on_the_command_line_list_the_partitions_from_sinfo(site: Site, lab: CLI) -> None:
    # From the pool's [pools.lab.slurm] table: the login node it names is asked.
    shown = lab("offers", "--provider", "slurm", "--json")
    assert shown.code == 0, shown
    (row,) = shown.json()
    assert (row["provider"], row["instance_type"], row["nodes"], row["vcpus"]) == \
        ("slurm", "debug", 3, site.cluster.cpus), row
    assert row["idle"] == 1 and row["default"] is True and row["price"] == 0.0, row  # the lab pool holds 2
    table = lab("offers", "--provider", "slurm")
    assert table.code == 0 and "PARTITION" in table.out and "debug (default)" in table.out, table
    # Or the login node given on the command line; a GPU no partition has is no offer.
    login = f"{site.login.user}@{site.login.address}"
    none = lab("offers", "--provider", "slurm", "--login", login, "--key", str(site.hosts.client_key),
               "--accelerator", "A100")
    assert none.code == 1 and "no partition" in none.out, none


def test_notebook_serves_jupyterlab_from_the_node_inside_the_pools_job(site: Site, lab: CLI) -> None:
    pytest.importorskip("jupyterlab")
    import httpx
    from cli.notebook_helpers import notebook

    node = _record(lab)["nodes"][1]
    assert lab("ssh", "lab", "--node", "1", "--", "echo from-the-node > probe.txt").code == 0
    with notebook(lab, "lab", "--node", "1") as (proc, shown):  # (the first start installs JupyterLab)
        base, token = shown["url"].split("/lab?token=")
        assert base.startswith("http://127.0.0.1:") and shown["hostname"] == node["hostname"], shown
        # Served from the node (through the login node's tunnel), its folder the pool's.
        got = httpx.get(f"{base}/api/contents/probe.txt", params={"token": token, "content": "1"}, timeout=60)
        assert got.status_code == 200 and got.json()["content"].strip() == "from-the-node", got.text
        assert httpx.get(f"{base}/api/contents/probe.txt", timeout=60).status_code in (401, 403)
        # On the node, inside the pool's job, listening on its private address; no token in argv.
        ran = lab("ssh", "lab", "--node", "1", "--", "pgrep -af '[j]upyterlab'")
        assert f"--ip={node['private_ip']}" in ran.out and token not in ran.out, ran
    assert proc.returncode == 0
    gone = lab("ssh", "lab", "--node", "1", "--", "pgrep -af '[j]upyterlab' || echo none")
    assert gone.out.strip().splitlines()[-1] == "none", gone
