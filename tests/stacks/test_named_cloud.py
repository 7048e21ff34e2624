"""Named cloud pools through the fake workspace, on the SSH test hosts booted as cloud nodes:
a pool's description reopens its stack in "another process" (a fresh provider and stack
object over the same workspace state), tasks run on the attached nodes, detaching leaves them
up, and destroying from the description stops the agents and destroys and removes the stack.

The CLI test runs ``skyward.named.cli.main`` in this process: the fake workspace lives in memory, so
``skyward`` in a subprocess could not reach it. The only thing replaced is how a record's
provider is built (``named.provider_from``), to hand it the fake workspace.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pulumi")

from sshhosts import SSHHosts, SSHHostsUnavailable
from stackfakes import FakeWorkspace
from test_end_to_end import boot

import skyward as sky
from skyward.core.pool import Pool
from skyward.named import pools as named
from skyward.providers.ssh import SSHCluster
from skyward.spec import Worker

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[SSHHosts]:
    hosts = SSHHosts(2)
    try:
        hosts.start()
    except SSHHostsUnavailable as e:
        pytest.skip(f"SSH test hosts unavailable: {e}")
    try:
        yield hosts
    finally:
        hosts.close()


@sky.function
def where() -> str:
    return str(sky.instance_info().peers[sky.instance_info().node].private_ip)


def _provider(ws: FakeWorkspace, hosts: SSHHosts) -> Any:
    return sky.AWS(workspace=ws, user=hosts.user, detect_address=False, allow_ssh_from=["10.0.0.0/8"],
                   install="wheelhouse")  # the test hosts have no index


def _agents_running(description: dict[str, Any]) -> bool | None:
    """Ask the hosts (over SSH) whether any described agent still runs."""
    probe = SSHCluster.from_description(description, kind=description["provider"])
    try:
        return probe.alive()
    finally:
        probe.detach()


def test_describe_attach_run_detach_destroy_round_trip(two_hosts: SSHHosts, home: Path) -> None:
    ws = FakeWorkspace(node_outputs=boot(two_hosts))
    opts = sky.Options(console=False)
    pool = sky.Compute(provider=_provider(ws, two_hosts), nodes=2, options=opts).open()
    description = json.loads(json.dumps(pool.cluster.describe()))  # JSON types only
    pool.detach()  # what `skyward up` does: the nodes and the stack stay

    stack = description["stack"]
    assert description["provider"] == "aws" and stack["name"].endswith(pool.id)
    assert stack["backend"].startswith("file://") and stack["project"] == "skyward"
    assert [n["host_key_private"] != "" for n in stack["plan"]["nodes"]] == [True, True]
    assert [kind for kind, _ in ws.calls].count("update") == 1 and not ws.removed
    assert _agents_running(description) is True

    # Another process: a new provider over the same workspace state, from the description only.
    again = _provider(ws, two_hosts)
    spec = sky.Spec(provider=again, nodes=2)
    with Pool(spec, opts, Worker(), cluster=again.attach(description)) as attached:
        assert sorted(where() @ attached) == sorted(h.address for h in two_hosts)
        assert attached.map(lambda x: x + 1, range(4)) == [1, 2, 3, 4]
        assert json.loads(json.dumps(attached.cluster.describe()))["stack"]["name"] == stack["name"]
    assert [kind for kind, _ in ws.calls].count("update") == 1  # attaching provisioned nothing
    assert not ws.removed and _agents_running(description) is True  # detached: still up

    assert [u["kind"] for u in again.stack_history(description)] == ["update"]
    # destroy forgets the pool's client key; keep a copy to ask the hosts afterwards
    spare = home / "spare_key"
    spare.write_text(Path(stack["key_path"]).read_text())
    spare.chmod(0o600)
    again.destroy(description)
    ops = [kind for kind, _ in ws.calls]
    assert ops[-3:] == ["refresh", "destroy", "remove"] and ws.removed == [stack["name"]]
    assert ops.count("update") == 1  # one destroy, no update that empties the pool first
    assert not Path(stack["key_path"]).exists()  # the pool's client key is forgotten
    for n in description["nodes"]:
        n["host"]["key"] = str(spare)
    assert _agents_running(description) is False  # the hosts answer: no agent of the pool runs
    assert (home / "audit" / f"{stack['name']}.json").exists()  # its history was saved first


def test_a_named_cloud_pool_from_the_cli_up_attach_history_down(
    two_hosts: SSHHosts, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from skyward.named import cli

    ws = FakeWorkspace(node_outputs=boot(two_hosts))
    real = named.provider_from

    def with_fake_workspace(data: dict[str, Any]) -> Any:
        provider = real(data)
        return dataclasses.replace(provider, workspace=ws) if provider.kind == "aws" else provider

    monkeypatch.setattr(named, "provider_from", with_fake_workspace)
    project = tmp_path / "project"
    project.mkdir()
    (project / "skyward.toml").write_text(
        f'[pools.cloud]\nprovider = "aws"\nnodes = 2\nttl = 600\n'
        f'[pools.cloud.aws]\nuser = "{two_hosts.user}"\ndetect_address = false\n'
        f'allow_ssh_from = ["10.0.0.0/8"]\ninstall = "wheelhouse"\n'
    )
    monkeypatch.chdir(project)

    assert cli.main(["up", "cloud", "--json"]) == 0
    up = json.loads(capsys.readouterr().out)
    assert (up["provider"], up["nodes"]) == ("aws", 2)

    with sky.Compute(name="cloud", options=sky.Options(console=False)) as pool:
        assert sorted(where() @ pool) == sorted(h.address for h in two_hosts)
    assert not ws.removed  # attaching and leaving does not destroy

    assert cli.main(["history", "cloud", "--json"]) == 0
    trail = json.loads(capsys.readouterr().out)
    assert [e["event"] for e in trail] == ["provisioned", "attached", "detached"]
    stack = trail[0]["stack"]
    assert stack.startswith("cloud-")  # the stack carries the pool's name
    assert [(u["kind"], u["result"]) for u in trail[0]["stack_updates"]] == [("update", "succeeded")]

    assert cli.main(["down", "cloud"]) == 0
    assert ws.removed == [stack]
    assert cli.main(["history", "cloud"]) == 0
    text = capsys.readouterr().out
    assert f"stack {stack}: Pulumi updates, newest first" in text and "destroy" in text
    assert cli.main(["ls", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
