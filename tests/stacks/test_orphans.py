"""Unnamed cloud pools whose program died without teardown: `skyward ls` shows them with what
their stack still holds, `skyward down --expired` destroys them (through the fake workspace)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pulumi")

from stackfakes import FakeWorkspace, make_plan

from skyward.named import cli
from skyward.stacks import keys, orphans
from skyward.stacks.cloudpool import CloudPool

pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def _pool(ws: FakeWorkspace, track: str | None = "aws") -> CloudPool:
    plan = make_plan(nodes=0)
    key_path, _ = keys.client_key(plan.stack)
    return CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=False,
                     fallback_to_on_demand=False, connect=ws, track=track)


def _kill_client(stack: str) -> int:
    """Make the note's client a process that has ended (what kill -9 leaves)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    path = orphans.folder() / f"{stack}.json"
    body = json.loads(path.read_text())
    body["pid"] = gone.pid
    path.write_text(json.dumps(body))
    return gone.pid


def test_a_live_pool_is_not_an_orphan_and_leaves_no_note_when_closed(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = _pool(ws)
    cloud.start(1)
    note = orphans.folder() / f"{cloud.plan.stack}.json"
    assert note.exists() and oct(note.stat().st_mode & 0o777) == "0o600"
    assert orphans.orphans() == []  # its program (this one) runs
    cloud.close()
    assert not note.exists()


def test_named_pools_leave_no_note(home: Path) -> None:
    cloud = _pool(FakeWorkspace(), track=None)
    cloud.start(1)
    assert not list(orphans.folder().glob("*.json"))


def test_ls_shows_what_an_orphan_still_holds_and_down_expired_destroys_it(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ws = FakeWorkspace()
    cloud = _pool(ws)
    cloud.start(2)
    stack = cloud.plan.stack
    pid = _kill_client(stack)
    # What the refresh found still there: one instance and its disk (the other terminated itself).
    ws.states[stack]["resources"] = [
        {"urn": f"urn:pulumi:{stack}::skyward::pulumi:providers:aws::aws", "type": "pulumi:providers:aws"},
        {"urn": f"urn:pulumi:{stack}::skyward::aws:ec2/instance:Instance::node-1", "type": "aws:ec2/instance:Instance",
         "id": "i-0001"},
        {"urn": f"urn:pulumi:{stack}::skyward::aws:ec2/securityGroup:SecurityGroup::nodes",
         "type": "aws:ec2/securityGroup:SecurityGroup", "id": "sg-1"},
    ]
    monkeypatch.setattr(orphans, "default_connect", lambda orphan: ws)

    assert cli.main(["ls", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    (row,) = [r for r in rows if r.get("orphan")]
    assert row["name"] == stack and row["client_pid"] == pid and row["nodes"] == 2
    assert {r["name"] for r in row["resources"]} == {"node-1", "nodes"}
    assert ("refresh", stack) in ws.calls  # what is left is asked of the cloud, not remembered

    assert cli.main(["ls"]) == 0
    text = capsys.readouterr().out
    assert "program gone" in text and "Instance" in text and "skyward down --expired" in text

    assert cli.main(["down", "--expired"]) == 0
    assert f"removed {stack}" in capsys.readouterr().out
    assert [k for k, n in ws.calls if n == stack][-3:] == ["refresh", "destroy", "remove"]
    assert orphans.orphans() == [] and not (orphans.folder() / f"{stack}.json").exists()
    assert not keys.key_dir(stack).exists()


def test_an_orphan_that_cannot_be_destroyed_is_kept_and_down_fails(
        home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from stackfakes import command_error

    ws = FakeWorkspace()
    cloud = _pool(ws)
    cloud.start(1)
    _kill_client(cloud.plan.stack)
    ws.fail = {"destroy": [command_error("error: AccessDenied: not authorized to TerminateInstances")]}
    monkeypatch.setattr(orphans, "default_connect", lambda orphan: ws)
    assert cli.main(["down", "--expired"]) == 1
    assert "AccessDenied" in capsys.readouterr().err
    assert [o.stack for o in orphans.orphans()] == [cloud.plan.stack]  # still listed: still costing


