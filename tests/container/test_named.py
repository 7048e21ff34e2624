"""A named pool of containers: `skyward up` with provider = "container", a program attaches,
`ls`/`status`/`exec`/`ssh`/`cp`/`logs` reach the containers, `down` removes them and their network.
And torch's gloo group across two containers (the torch plugin's rendezvous on the pool's network)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli.conftest import CLI

import skyward as sky

from .conftest import pool_containers, pool_networks

pytestmark = pytest.mark.timeout(600)

CLIENT = """
    import json, socket
    import skyward as sky

    @sky.function
    def where():
        return socket.gethostname()

    with sky.Compute(name="box", options=sky.Options(console="silent")) as pool:
        print(json.dumps(sorted(where() @ pool)))
"""


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[CLI]:
    helper = CLI(tmp_path)
    yield helper
    helper("down", "--all", "--force", timeout=180)


def test_a_named_container_pool_up_used_reached_and_down(
    base_image: str, cli: CLI, no_leftovers: None
) -> None:
    cli.toml(
        f'[pools.box]\nprovider = "container"\nnodes = 2\nttl = 120\n\n'
        f'[pools.box.container]\nimage = "{base_image}"\n'
    )
    up = cli("up", "box", timeout=300)
    assert up.code == 0, up
    record = cli.record("box")["cluster"]
    pool_id = record["pool_id"]
    names = sorted(n["container"] for n in record["nodes"])
    assert sorted(pool_containers(pool_id)) == names and pool_networks(pool_id) == [
        record["network"]
    ]

    client = cli.python(CLIENT, timeout=180)
    assert client.code == 0, client
    assert client.json() == names

    (row,) = cli("ls", "--json").json()
    assert (row["name"], row["provider"], row["nodes"], row["state"]) == (
        "box",
        "container",
        2,
        "running",
    )
    status = cli("status", "box", "--json")
    assert status.code == 0 and [n["reachable"] for n in status.json()["nodes"]] == [True, True], (
        status
    )

    ran = cli("exec", "box", "--json", "--", "hostname")
    assert ran.code == 0, ran
    assert sorted(r["stdout"].strip() for r in ran.json()) == names

    # `skyward ssh` runs in the node's container, in its pool folder, with the pool's venv first.
    shell = cli("ssh", "box", "--node", "1", "--", "hostname; pwd; command -v python", timeout=120)
    assert shell.code == 0, shell
    host, cwd, python = shell.out.split()
    assert (
        host == names[1]
        and cwd.startswith("/run/skyward/pools/")
        and python.startswith("/opt/skyward/envs/")
    )

    # `skyward cp` both ways.
    (cli.cwd / "hello.txt").write_text("from the client\n")
    sent = cli("cp", "hello.txt", "box:hello.txt", "--node", "0", timeout=120)
    assert sent.code == 0, sent
    back = cli("cp", "box:hello.txt", "back.txt", "--node", "0", timeout=120)
    assert back.code == 0, back
    assert (cli.cwd / "back.txt").read_text() == "from the client\n"

    logs = cli("logs", "box")
    assert logs.code == 0 and "serving on /run/skyward/agent.sock" in logs.out, logs

    down = cli("down", "box", timeout=180)
    assert down.code == 0, down
    assert pool_containers(pool_id) == [] and pool_networks(pool_id) == []
    assert not Path(record["root"]).exists()
    assert cli("ls", "--json").json() == []


@sky.function
def ddp_step() -> tuple[int, int, float, str]:
    import socket

    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    dist.destroy_process_group()
    return rank, world, t.item(), socket.gethostname()


def test_torch_gloo_all_reduce_across_two_containers(base_image: str, no_leftovers: None) -> None:
    pytest.importorskip(
        "torch", reason="torch is not installed here (the nodes get the client's wheel)"
    )
    import torch

    # The plugin's rendezvous as it is; its install is the client's own torch (the plugin names
    # download.pytorch.org, which this machine may not reach).
    version = torch.__version__.split("+")[0]
    plugin = dataclasses.replace(
        sky.plugins.torch(backend="gloo"),
        transform=lambda image, cluster: dataclasses.replace(
            image, pip=(*image.pip, f"torch=={version}")
        ),
    )
    with sky.Compute(
        provider=sky.Container(image=base_image),
        nodes=2,
        plugins=[plugin],
        options=sky.Options(console=False),
    ) as pool:
        results = ddp_step() @ pool
    assert sorted(r[0] for r in results) == [0, 1], results
    assert all(r[1] == 2 and r[2] == 3.0 for r in results), results
    assert len({r[3] for r in results}) == 2, results  # two containers, not one
    assert json.dumps(results)
