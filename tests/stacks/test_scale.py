"""Pools of thousands: a pool's stack config never rides on a command line.

``pulumi config set-all key=value`` makes each value one argument, and Linux refuses a single
argument over 128 KiB: a pool's plan (one host key per node) passed that near 960 nodes. The
engine writes plain config into the stack's settings file instead, through the automation
API's own stack_settings / save_stack_settings. Checked two ways: a 5,000-node pool through the
fake workspace, whose argv is built by the real LocalWorkspace code; and the real LocalWorkspace
over a recording stand-in for the Pulumi CLI, writing the real Pulumi.<stack>.yaml.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pulumi")

import yaml
from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult
from pulumi.automation._stack_settings import StackSettingsSecureConfigValue
from stackfakes import FakeWorkspace, make_plan

from skyward.errors import StackError
from skyward.stacks import engine, keys
from skyward.stacks.cloudpool import CloudPool

SANE = 4096  # bytes: the longest argument a Pulumi command line should need here


pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def _addresses(n: int) -> list[str]:
    """Addresses for the fake's outputs (never connected to)."""
    return [f"198.18.{i // 256}.{i % 256}" for i in range(n)]


def test_a_5000_node_pool_comes_up_through_the_fake_workspace_with_no_long_argument() -> None:
    ws = FakeWorkspace(addresses=_addresses(5000))
    plan = make_plan(nodes=0)
    key_path, _ = keys.client_key(plan.stack)
    cloud = CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=False,
                      fallback_to_on_demand=False, record={"offer": {"instance_type": "m7i.large"}}, connect=ws)
    nodes = cloud.start(5000)

    assert len(nodes) == 5000 and nodes[-1].address == "198.18.19.135"
    assert [kind for kind, _ in ws.calls] == ["select", "config", "update"]
    longest = max((arg for argv in ws.argv for arg in argv), key=len)
    assert len(longest.encode()) <= SANE, longest[:200]
    assert [argv[1] for argv in ws.argv] == ["stack", "up"]  # no `config set-all` at all
    # ...and the whole plan is in the stack's config, by way of its settings file.
    recorded = json.loads(ws.configs[plan.stack]["skyward:plan"].value)
    assert len(recorded["nodes"]) == 5000 and "host_key_private" not in recorded["nodes"][0]
    assert ws.settings_bytes[plan.stack] > 5 * 128 * 1024  # what one argument could not hold

    cloud.keep_lock({"packages": [{"name": f"pkg{i}", "version": "1.0"} for i in range(3000)]})
    assert json.loads(ws.configs[plan.stack]["skyward:lock"].value)["packages"][-1]["name"] == "pkg2999"
    assert max(len(arg) for argv in ws.argv for arg in argv) <= SANE


class RecordingCLI(auto.PulumiCommand):
    """The Pulumi CLI as LocalWorkspace runs it: every command line recorded, each one succeeds."""

    def __init__(self) -> None:  # no CLI to find or version
        self.command = "pulumi"
        self.version = None
        self.argv: list[list[str]] = []

    def run(self, args: list[str], cwd: str, additional_env: Any, on_output: Any = None,
            on_error: Any = None) -> CommandResult:
        self.argv.append(list(args))
        return CommandResult(stdout="", stderr="", code=0)


def _real_stack(tmp_path: Path, cli: RecordingCLI) -> Any:
    work = tmp_path / "workspace"
    work.mkdir()
    ws = auto.LocalWorkspace(work_dir=str(work), pulumi_command=cli,
                             project_settings=auto.ProjectSettings(name="skyward", runtime="python"))
    # What `stack init --secrets-provider passphrase` leaves: the salt and a secure value.
    ws.save_stack_settings("big", auto.StackSettings(
        secrets_provider="passphrase", encryption_salt="v1:c2FsdA==:v1:abc",
        config={"skyward:env": StackSettingsSecureConfigValue(secure="v1:cipher")}))
    return auto.Stack.select("big", ws)


def test_the_real_local_workspace_gets_the_plan_in_its_settings_file_not_its_argv(tmp_path: Path) -> None:
    cli = RecordingCLI()
    real = _real_stack(tmp_path, cli)
    plan = make_plan(nodes=3000)
    stack = engine.PoolStack("big", program=lambda: None, connect=lambda name, program: real,
                             config={"plan": json.dumps(plan.record()), "version": "0.1.0"})
    stack._run("config", stack._configure)
    stack.set_config({"lock": json.dumps({"image": "ami-1"})})

    assert cli.argv == [["stack", "select", "--stack", "big"]]  # nothing else ran the CLI
    on_disk = yaml.safe_load((tmp_path / "workspace" / "Pulumi.big.yaml").read_text())
    assert on_disk["encryptionsalt"] == "v1:c2FsdA==:v1:abc"  # kept: the stack's secrets still open
    assert on_disk["config"]["skyward:env"] == {"secure": "v1:cipher"}
    assert len(json.loads(on_disk["config"]["skyward:plan"])["nodes"]) == 3000
    assert json.loads(on_disk["config"]["skyward:lock"]) == {"image": "ami-1"}
    assert on_disk["config"]["skyward:version"] == "0.1.0"


def test_secrets_go_through_set_all_and_one_too_large_for_an_argument_is_refused(tmp_path: Path) -> None:
    cli = RecordingCLI()
    real = _real_stack(tmp_path, cli)
    stack = engine.PoolStack("big", program=lambda: None, connect=lambda name, program: real,
                             secrets={"token": "s3cret"})
    stack._run("config", stack._configure)
    assert cli.argv[-1] == ["config", "set-all", "--stack", "big", "--secret", "skyward:token=s3cret"]

    stack.secrets = {"token": "x" * (engine.MAX_ARGUMENT + 1)}
    before = len(cli.argv)
    with pytest.raises(StackError) as info:
        stack._run("config", stack._configure)
    assert "'token'" in str(info.value) and "command-line argument" in str(info.value)
    assert len(cli.argv) == before  # refused before the CLI ran
