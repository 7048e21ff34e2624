"""A pool's stack through its life, against a fake automation-API workspace that fails the way
the Pulumi CLI does (real CommandResult text, classified by pulumi.automation itself)."""

from __future__ import annotations

import _thread
import json
import os
import shutil
import stat
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pulumi")

from pulumi import automation as auto
from stackfakes import (
    CAPACITY_STDERR,
    LOCK_STDERR,
    FakeWorkspace,
    command_error,
    make_plan,
)

from skyward.errors import PendingOperationsError, StackError, StackLockedError
from skyward.observe import events as ev
from skyward.stacks import backend, engine, keys
from skyward.stacks.cloudpool import CloudPool

PLUGIN = {"aws": "7.51.1"}


pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def cloud_pool(ws: FakeWorkspace, *, spot: bool = False, fallback: bool = False, zone: str | None = None,
               settings: dict | None = None) -> CloudPool:
    plan = make_plan(nodes=0, zone=zone, settings=settings)
    key_path, _ = keys.client_key(plan.stack)
    return CloudPool(
        plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=spot,
        fallback_to_on_demand=fallback, record={"skyward": "0.1.0", "offer": {"instance_type": "m7i.large"}},
        secrets={"env": json.dumps({"TOKEN": "s3cret"})}, plugins=PLUGIN, connect=ws,
    )


def ops(ws: FakeWorkspace) -> list[str]:
    return [kind for kind, _ in ws.calls]


def test_create_configures_the_stack_then_updates_it_and_returns_its_nodes(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = cloud_pool(ws)
    nodes = cloud.start(2)

    assert ops(ws) == ["select", "config", "update"]
    assert ws.plugins == [("aws", "v7.51.1")]
    config = ws.configs[cloud.plan.stack]
    public = {k: v.value for k, v in config.items() if not v.secret}
    secret = {k for k, v in config.items() if v.secret}
    assert set(public) == {"skyward:pool", "skyward:plan", "skyward:version"}
    assert json.loads(public["skyward:pool"])["offer"] == {"instance_type": "m7i.large"}
    # No secret is config: secret config values travel to the CLI on its command line (`ps`
    # shows them, and an argument is limited to 128 KiB). The program exports the pool's
    # secrets as a secret output instead.
    assert secret == set()
    everything = json.dumps({k: v.value for k, v in config.items()})
    assert "s3cret" not in everything
    assert not any(n.host_key_private in everything for n in cloud.plan.nodes)

    assert [n.index for n in nodes] == [0, 1]
    assert [n.address for n in nodes] == ["203.0.113.10", "203.0.113.11"]
    assert [n.host_key for n in nodes] == [p.host_key for p in cloud.plan.nodes]
    assert all(n.user == "ubuntu" and n.key == str(cloud.key_path) for n in nodes)
    assert stat.S_IMODE(os.stat(cloud.key_path).st_mode) == 0o600
    assert nodes[0].host_fields()["host_key"].startswith("ssh-ed25519 ")


def test_close_refreshes_before_destroying_and_keeps_the_history(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = cloud_pool(ws)
    cloud.start(1)
    cloud.close()
    cloud.close()  # idempotent

    assert ops(ws)[3:] == ["refresh", "destroy", "remove"]
    audit = json.loads(engine.audit_file(cloud.plan.stack).read_text())
    assert [h["kind"] for h in audit["history"]] == ["destroy", "update"]
    assert not keys.key_dir(cloud.plan.stack).exists()
    assert not engine.workspace_dir(cloud.plan.stack).exists()


def test_a_failed_creation_removes_what_it_made(home: Path) -> None:
    ws = FakeWorkspace(fail={"update": [command_error(
        "error: creating EC2 Instance: operation error EC2: RunInstances, UnauthorizedOperation: "
        "You are not authorized to perform this operation.")]})
    cloud = cloud_pool(ws)
    with pytest.raises(StackError) as info:
        cloud.start(1)
    assert "UnauthorizedOperation" in str(info.value) and "up failed" in str(info.value)
    assert isinstance(info.value.__cause__, auto.CommandError)
    assert ops(ws) == ["select", "config", "update", "refresh", "destroy", "remove"]
    assert not keys.key_dir(cloud.plan.stack).exists()


def test_a_locked_stack_says_how_to_release_the_lock(home: Path) -> None:
    name = "train-ab12cd34"
    ws = FakeWorkspace(fail={"update": [command_error(LOCK_STDERR.format(name=name))]})
    stack = engine.PoolStack(name, lambda: None, connect=ws, config={"plan": json.dumps(make_plan(nodes=0).record())})
    with pytest.raises(StackLockedError) as info:
        stack.up()
    assert isinstance(info.value.__cause__, auto.ConcurrentUpdateError)
    text = str(info.value)
    assert "locked by another update" in text and "wait for it" in text
    assert f"skyward.stacks.unlock({name!r})" in text

    # The way out, on a file backend: the stale lock files go, the next update works.
    backend.prepare()
    lock = backend.local_state_dir() / ".pulumi" / "locks" / "organization" / "skyward" / name / "8c1f.json"
    lock.parent.mkdir(parents=True)
    lock.write_text("{}")
    assert engine.unlock(name) == [lock] and not lock.exists()
    assert stack.up() == {"nodes": []}


def test_an_interrupted_update_leaves_pending_operations_and_a_way_out(home: Path) -> None:
    name = "train-ab12cd34"
    ws = FakeWorkspace(block_up=threading.Event(), blocked=threading.Event())
    stack = engine.PoolStack(name, lambda: None, pool="ab12cd34", connect=ws,
                             config={"plan": json.dumps(make_plan(nodes=1).record())})
    seen: list[ev.Event] = []
    stop = ev.bus.subscribe(seen.append, pool="ab12cd34")

    def ctrl_c() -> None:
        ws.blocked.wait(10)
        _thread.interrupt_main()  # Ctrl-C in the user's thread while `up` runs
        time.sleep(0.3)
        ws.block_up.set()  # the CLI finishes what is in flight, saves, and stops

    threading.Thread(target=ctrl_c, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        stack.up()
    ev.bus.flush()
    stop()
    assert any(isinstance(e, ev.Log) and "Ctrl-C: stopping `up`" in e.message for e in seen), seen

    with pytest.raises(PendingOperationsError) as info:
        stack.up()
    text = str(info.value)
    assert "interrupted" in text and "pending operations" in text
    assert f"skyward.stacks.clear_pending({name!r})" in text and f"skyward-stack={name}" in text

    assert stack.clear_pending() == 1
    assert ops(ws)[-2:] == ["import", "refresh"]
    assert stack.up()["nodes"][0]["index"] == 0


def test_no_spot_capacity_falls_back_to_on_demand(home: Path) -> None:
    ws = FakeWorkspace(fail={"update": [command_error(CAPACITY_STDERR)]})
    cloud = cloud_pool(ws, spot=True, fallback=True, zone="us-east-1a")  # a fixed zone: no other to try
    nodes = cloud.start(2)
    assert len(nodes) == 2
    assert ops(ws).count("update") == 2
    tried = json.loads(ws.history[cloud.plan.stack][0].config["skyward:plan"].value)
    assert [n["spot"] for n in tried["nodes"]] == [True, True]
    assert [n["spot"] for n in ws.plans[cloud.plan.stack][-1]["nodes"]] == [False, False]


SPOT_QUOTA_STDERR = ("error: 1 error occurred:\n  * Error creating instance: googleapi: Error 403: Quota "
                     "'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region us-central1., quotaExceeded")


@pytest.mark.parametrize("stderr", [SPOT_QUOTA_STDERR, CAPACITY_STDERR])
def test_spot_quota_or_capacity_goes_on_demand_by_the_same_rule_and_says_why(home: Path, stderr: str) -> None:
    ws = FakeWorkspace(fail={"update": [command_error(stderr)]})
    cloud = cloud_pool(ws, spot=True, fallback=True, zone="us-east-1a")
    seen: list[ev.Event] = []
    stop = ev.bus.subscribe(seen.append, pool="ab12cd34")
    try:
        assert len(cloud.start(1)) == 1
    finally:
        ev.bus.flush()
        stop()
    assert [n["spot"] for n in ws.plans[cloud.plan.stack][-1]["nodes"]] == [False]
    why = "PREEMPTIBLE_NVIDIA_T4_GPUS" if stderr is SPOT_QUOTA_STDERR else "InsufficientInstanceCapacity"
    said = [e.message for e in seen if isinstance(e, ev.Log) and "went on-demand" in e.message]
    assert len(said) == 1 and why in said[0] and "spot-if-available" in said[0], said


def test_spot_only_does_not_fall_back(home: Path) -> None:
    ws = FakeWorkspace(fail={"update": [command_error(CAPACITY_STDERR)]})
    cloud = cloud_pool(ws, spot=True, fallback=False, zone="us-east-1a")
    with pytest.raises(StackError, match="InsufficientInstanceCapacity"):
        cloud.start(1)
    assert ops(ws).count("update") == 1


def test_a_zone_without_capacity_makes_the_first_up_try_the_next_zone(home: Path) -> None:
    seen: list[ev.Event] = []
    stop = ev.bus.subscribe(seen.append, pool="ab12cd34")
    ws = FakeWorkspace(fail={"update": [command_error(CAPACITY_STDERR), command_error(CAPACITY_STDERR)]})
    cloud = cloud_pool(ws, spot=True, fallback=False, settings={"zones": ["z-1", "z-2", "z-3"]})
    cloud.start(1)
    ev.bus.flush()
    stop()
    assert ops(ws).count("update") == 3
    assert [p["settings"].get("zone_attempt") for p in ws.plans[cloud.plan.stack]] == [2]
    assert sum("trying the next zone" in getattr(e, "message", "") for e in seen) == 2
    # After the first up, nothing moves a created pool to another zone.
    ws.fail = {"update": [command_error(CAPACITY_STDERR)]}
    with pytest.raises(StackError):
        cloud.grow(1)
    assert ops(ws).count("update") == 4


def test_a_zone_error_when_every_zone_was_tried_is_the_error(home: Path) -> None:
    ws = FakeWorkspace(fail={"update": [command_error(CAPACITY_STDERR)] * 2})
    cloud = cloud_pool(ws, settings={"zones": ["z-1", "z-2"]})
    with pytest.raises(StackError, match="InsufficientInstanceCapacity"):
        cloud.start(1)
    assert ops(ws).count("update") == 2


def test_a_failed_grow_leaves_no_phantom_nodes_in_the_plan(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = cloud_pool(ws, zone="us-east-1a")
    cloud.start(1)
    ws.fail = {"update": [command_error("error: creating EC2 Instance: VcpuLimitExceeded")]}
    with pytest.raises(StackError):
        cloud.grow(2)
    assert [n.index for n in cloud.plan.nodes] == [0]
    cloud.grow(1)  # the next up creates one node, not three
    assert [n["index"] for n in ws.plans[cloud.plan.stack][-1]["nodes"]] == [0, 1]


def test_the_first_up_pins_what_it_looked_up(home: Path) -> None:
    ws = FakeWorkspace(placement={"ami": "ami-123", "subnet": "subnet-9", "zone": "us-east-1c"})
    cloud = cloud_pool(ws)
    cloud.start(1)
    assert cloud.plan.settings["pinned"] == {"ami": "ami-123", "subnet": "subnet-9", "zone": "us-east-1c"}
    cloud.grow(1)
    # the second update declared from the pinned plan (recorded in the stack config too)
    assert ws.plans[cloud.plan.stack][-1]["settings"]["pinned"]["ami"] == "ami-123"
    recorded = json.loads(ws.configs[cloud.plan.stack]["skyward:plan"].value)
    assert recorded["settings"]["pinned"]["subnet"] == "subnet-9"
    # and a named pool's description carries it to the next process
    assert cloud.describe()["plan"]["settings"]["pinned"]["zone"] == "us-east-1c"


def test_grow_and_shrink_are_stack_updates(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = cloud_pool(ws)
    first = cloud.start(1)
    more = cloud.grow(2)
    assert [n.index for n in more] == [1, 2]

    class Host:  # what the SSH provider hands back: it knows nodes by address
        address = more[0].address

    cloud.shrink([Host()])
    assert [n["index"] for n in ws.plans[cloud.plan.stack][-1]["nodes"]] == [0, 2]
    assert ops(ws).count("update") == 3
    assert first[0].host_key != more[0].host_key != more[1].host_key


def test_engine_events_become_skyward_events(home: Path) -> None:
    ws = FakeWorkspace()
    seen: list[ev.Event] = []
    stop = ev.bus.subscribe(seen.append, pool="ab12cd34")
    cloud_pool(ws).start(1)
    ev.bus.flush()
    stop()
    changes = [(e.resource, e.operation, e.status) for e in seen if isinstance(e, ev.ResourceChanged)]
    assert changes == [("node-0 (aws:ec2/instance:Instance)", "create", "started"),
                       ("node-0 (aws:ec2/instance:Instance)", "create", "done")]


def test_preview_history_outputs_and_export(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = cloud_pool(ws)
    assert cloud.stack.preview() == {"create": 4}
    cloud.start(1)
    assert cloud.stack.outputs()["nodes"][0]["public_ip"] == "203.0.113.10"
    history = cloud.stack.history()
    assert history[0]["kind"] == "update" and history[0]["result"] == "succeeded"
    assert "skyward:env" not in history[0]["config"]  # a secret output, never config
    assert cloud.stack.export()["deployment"]["resources"] == [{"urn": 0}]


def test_backend_defaults_and_overrides(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert backend.backend_url() == (home / "stacks").as_uri()
    env = backend.prepare()
    passphrase = Path(env["PULUMI_CONFIG_PASSPHRASE_FILE"])
    assert stat.S_IMODE(passphrase.stat().st_mode) == 0o600 and len(passphrase.read_text().strip()) >= 32
    before = passphrase.read_text()
    assert backend.prepare()["PULUMI_CONFIG_PASSPHRASE_FILE"] == str(passphrase) and passphrase.read_text() == before
    assert (home / "stacks").is_dir()

    monkeypatch.setenv("PULUMI_BACKEND_URL", "s3://team-bucket/skyward")
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "ours")
    env = backend.prepare()
    assert env["PULUMI_BACKEND_URL"] == "s3://team-bucket/skyward" and "PULUMI_CONFIG_PASSPHRASE_FILE" not in env
    assert backend.local_state_dir() is None
    assert backend.stack_name("My Training_Run!", "ab12cd34") == "my-training-run-ab12cd34"
    assert backend.stack_name(None, "ab12cd34") == "pool-ab12cd34"


def test_file_backend_under_the_home_tilde(home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert backend.local_state_dir("file://~") == tmp_path / "user"
    assert backend.local_state_dir("file://~/state") == tmp_path / "user" / "state"
    backend.prepare("file://~/state")
    assert (tmp_path / "user" / "state").is_dir() and not Path("~").exists()


_READ_PASSPHRASE = """
from pathlib import Path
from skyward.stacks import backend
print(Path(backend.prepare()["PULUMI_CONFIG_PASSPHRASE_FILE"]).read_text(), end="")
"""


def test_the_passphrase_is_never_seen_half_written(home: Path) -> None:
    # Many processes making their first pool at once: each reads a whole passphrase, the same one.
    # (Fresh interpreters, not forks of this one: a fork of a process with threads running, as a
    # test process has, can hang on a lock one of them held.)
    import subprocess
    import sys

    env = {**os.environ, "SKYWARD_HOME": str(home)}
    env.pop("PULUMI_CONFIG_PASSPHRASE", None)
    env.pop("PULUMI_CONFIG_PASSPHRASE_FILE", None)
    procs = [subprocess.Popen([sys.executable, "-c", _READ_PASSPHRASE], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(12)]
    seen = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        seen.append(out)
    assert len(set(seen)) == 1 and len(seen[0].strip()) >= 32
    assert [p.name for p in home.iterdir() if p.name.startswith(".passphrase-")] == []


def test_a_cli_outside_a_bin_folder_gets_a_root_the_automation_api_accepts(home: Path, tmp_path: Path) -> None:
    exe = tmp_path / "opt" / "pulumi" / "pulumi"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\necho v3.150.0\n")
    exe.chmod(0o755)
    root = engine.command_root(exe)
    assert (root / "bin" / "pulumi").resolve() == exe.resolve()
    assert engine.command_root(exe) == root  # idempotent
    command = auto.PulumiCommand(root=str(root))  # runs `<root>/bin/pulumi version`
    assert str(command.version) == "3.150.0"
    usual = tmp_path / "usr" / "bin" / "pulumi"
    assert engine.command_root(usual) == tmp_path / "usr"


@pytest.mark.pulumi
@pytest.mark.skipif(shutil.which("pulumi") is None, reason="needs the Pulumi CLI on PATH")
def test_real_cli_round_trip_on_a_file_backend(home: Path) -> None:
    """No cloud: a program that only exports a value, through the real CLI and file backend."""
    import pulumi

    def program() -> None:
        pulumi.export("answer", 42)

    stack = engine.PoolStack("cli-check-00000000", program, config={"plan": "{}"}, secrets={"s": "x"})
    assert stack.preview() is not None
    assert stack.up() == {"answer": 42}
    assert stack.outputs() == {"answer": 42}
    stack.destroy()
    stack.remove()
    assert engine.audit_file("cli-check-00000000").exists()


def test_cloud_nodes_get_minutes_to_reach_ssh_and_ssh_hosts_a_minute(home: Path) -> None:
    # A fresh GPU image is "running" minutes before cloud-init installs the planned host key and
    # login user: cloud kinds wait longer (a named pool's description keeps the budget).
    import skyward as sky
    from skyward.providers import ssh

    spec = sky.Spec(provider=sky.Local())
    cloud = ssh.SSHCluster(spec, "ab12cd34", [], kind="aws")
    assert cloud._ssh_timeout == ssh.CLOUD_SSH_TIMEOUT >= 300
    assert ssh.SSHCluster(spec, "ab12cd34", [], kind="ssh")._ssh_timeout == 60
    assert ssh.SSHCluster(spec, "ab12cd34", [], kind="gcp", options=sky.Options(ssh_timeout=5))._ssh_timeout == 5
