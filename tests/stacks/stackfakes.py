"""Fakes for the stack tests: Pulumi mocks that record what a program declares, plans, and a fake
automation-API workspace."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pytest

from skyward.stacks import keys
from skyward.stacks.plan import DiskPlan, NodePlan, PoolPlan

CLIENT = "198.51.100.7/32"


@dataclass
class Recorder(pulumi.runtime.Mocks):
    """Pulumi mocks: every resource and invoke is recorded; outputs look like a cloud's."""

    resources: list[Any] = field(default_factory=list)
    calls: list[Any] = field(default_factory=list)
    # What the cloud's lookups answer (a test changes them to play "a newer image came out").
    aws_zones: list[str] = field(default_factory=lambda: ["us-east-1b", "us-east-1a", "us-east-1c"])
    aws_default_subnets: list[str] | None = None  # zones whose default subnet exists (None: every offered zone)
    ami_date: str = "20250101"
    gcp_image_date: str = "20250101"
    gcs_uniform: dict[str, bool] = field(default_factory=dict)  # bucket -> uniform bucket-level access
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def new_resource(self, args: Any) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        n = next(self._ids)
        out = dict(args.inputs)
        rid = f"{args.name}-id"
        if args.typ == "aws:ec2/instance:Instance":
            rid = f"i-{n:08x}"
            out.update(publicIp=f"203.0.113.{n}", privateIp=f"10.0.0.{n}", privateDns=f"ip-10-0-0-{n}.ec2.internal")
        elif args.typ == "aws:ebs/volume:Volume":
            rid = f"vol-{n:012x}"
        elif args.typ == "gcp:compute/instance:Instance":
            interfaces = out.get("networkInterfaces") or [{}]
            interfaces[0] = {**interfaces[0], "networkIp": f"10.128.0.{n}", "accessConfigs": [{"natIp": f"203.0.113.{n}"}]}
            out["networkInterfaces"] = interfaces
        elif args.typ == "gcp:serviceaccount/account:Account":
            out["email"] = f"{out['accountId']}@{out.get('project') or 'proj'}.iam.gserviceaccount.com"
        elif args.typ == "gcp:projects/iAMCustomRole:IAMCustomRole":
            out["name"] = f"projects/{out.get('project') or 'proj'}/roles/{out['roleId']}"
        elif args.typ == "gcp:compute/disk:Disk":
            out["selfLink"] = f"https://compute.googleapis.com/disks/{args.name}-{n}"
        return rid, out

    def call(self, args: Any) -> dict[str, Any]:
        self.calls.append(args)
        token = args.token
        if token == "aws:ec2/getVpc:getVpc":
            return {"id": "vpc-default", "cidrBlock": "172.31.0.0/16"}
        if token == "aws:ec2/getSubnets:getSubnets":
            if any(f.get("name") == "default-for-az" for f in args.args.get("filters") or []):
                zones = self.aws_zones if self.aws_default_subnets is None else self.aws_default_subnets
                return {"ids": [f"subnet-default-{z}" for z in zones]}
            return {"ids": ["subnet-a", "subnet-b"]}
        if token == "aws:ec2/getSubnet:getSubnet":
            if args.args.get("id"):  # given, or pinned by an earlier up
                pinned = args.args["id"].startswith("subnet-default-")
                return {"id": args.args["id"], "vpcId": "vpc-default" if pinned else "vpc-given",
                        "availabilityZone": args.args["id"].removeprefix("subnet-default-") if pinned else "us-east-1a"}
            zone = args.args.get("availabilityZone", "us-east-1a")
            return {"id": f"subnet-default-{zone}", "vpcId": "vpc-default", "availabilityZone": zone}
        if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            return {"locations": list(self.aws_zones), "locationTypes": ["availability-zone"] * len(self.aws_zones),
                    "instanceTypes": [args.args["filters"][0]["values"][0]] * len(self.aws_zones), "id": "offerings"}
        if token == "aws:ec2/getAmi:getAmi":
            name = args.args["filters"][0]["values"][0]
            base = "ami-deeplearning" if "Deep Learning" in name else "ami-ubuntu"
            return {"id": base if self.ami_date == "20250101" else f"{base}-{self.ami_date}"}
        if token == "gcp:storage/getBucket:getBucket":
            name = args.args.get("name")
            return {"name": name, "uniformBucketLevelAccess": self.gcs_uniform.get(name, True)}
        if token == "gcp:compute/getImage:getImage":
            family, project = args.args.get("family"), args.args.get("project")
            return {"selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/global/images/"
                                f"{family}-v{self.gcp_image_date}", "family": family}
        return {}

    def of_type(self, typ: str) -> list[Any]:
        return [r for r in self.resources if r.typ == typ]


def make_plan(
    *, nodes: int = 1, spot: bool = False, gpu: bool = False, disks: tuple[DiskPlan, ...] = (),
    expires_in: int | None = None, ttl: int = 600, settings: dict[str, Any] | None = None,
    instance_type: str = "m7i.large", zone: str | None = None, region: str = "us-east-1",
) -> PoolPlan:
    now = int(time.time())
    client = keys.ed25519("client")
    node_plans = []
    for i in range(nodes):
        host = keys.ed25519(f"node-{i}")
        node_plans.append(NodePlan(index=i, spot=spot, host_key=host.public, host_key_private=host.private))
    return PoolPlan(
        pool="train", stack="train-ab12cd34", region=region, zone=zone, instance_type=instance_type,
        nodes=tuple(node_plans), ssh_user="ubuntu", ssh_public_key=client.public, ssh_cidrs=(CLIENT,),
        disk_gb=120 if gpu else 30, disks=disks, gpu=gpu, ttl=ttl, created=now,
        expires=now + expires_in if expires_in else None, version="0.1.0", settings=settings or {},
    )


def cloud_config(user_data: str) -> dict[str, Any]:
    """The cloud-config document of a node's user data."""
    head, body = user_data.split("\n", 1)
    assert head == "#cloud-config"
    return dict(json.loads(body))


# -- a fake automation-API workspace ---------------------------------------------------------------
# It stands where pulumi.automation's LocalWorkspace + Stack stand (the engine's `connect` seam),
# keeps a stack's state as a deployment dict, streams real EngineEvent objects, and fails the
# way the CLI does: a CommandResult with the CLI's own wording, classified by the automation
# API's own create_command_error (so the exception types are the real ones).

LOCK_STDERR = (
    "error: the stack is currently locked by 1 lock(s). Either wait for the other process(es) to end "
    "or delete the lock file with `pulumi cancel`.\n"
    "  file:///home/u/.skyward/stacks/.pulumi/locks/organization/skyward/{name}/8c1f.json: "
    "created by u@laptop (pid 4242) at 2025-06-01T10:00:00Z"
)
PENDING_STDERR = (
    "error: the current deployment has 1 resource(s) with pending operations:\n"
    "  * urn:pulumi:{name}::skyward::aws:ec2/instance:Instance::node-0, interrupted while creating\n\n"
    "These resources are in an unknown state because the Pulumi CLI was interrupted while waiting "
    "for changes to these resources to complete."
)
CAPACITY_STDERR = (
    "error: 1 error occurred:\n  * creating EC2 Instance: operation error EC2: RunInstances, "
    "https response error StatusCode: 500, InsufficientInstanceCapacity: There is no Spot capacity "
    "available that matches your request."
)


def command_error(stderr: str, code: int = 255) -> Exception:
    from pulumi.automation._cmd import CommandResult
    from pulumi.automation.errors import create_command_error

    return create_command_error(CommandResult(stdout="Updating (stack):\n", stderr=stderr, code=code))


def engine_event(kind: str, op: str, urn: str, typ: str) -> Any:
    from pulumi.automation.events import EngineEvent

    return EngineEvent.from_json({"sequence": 1, "timestamp": 0, kind: {
        "metadata": {"op": op, "urn": urn, "type": typ, "provider": ""}}})


@dataclass
class Update:
    kind: str
    result: str
    config: dict[str, Any]
    start_time: Any = None
    end_time: Any = None
    message: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    version: int = 0
    resource_changes: dict[str, int] = field(default_factory=dict)


class _Cli:
    """Stands where LocalWorkspace's CLI runner stands: the real LocalWorkspace methods build the
    command line (so the fake sees the argv the Pulumi CLI would get), this records it."""

    def __init__(self, ws: FakeWorkspace) -> None:
        self.ws = ws

    def _run_pulumi_cmd_sync(self, args: list[str], on_output: Any = None, on_error: Any = None) -> Any:
        from pulumi.automation._cmd import CommandResult

        self.ws.argv.append(["pulumi", *args])
        return CommandResult(stdout="", stderr="", code=0)


# What the automation API's Stack.<op> puts on the CLI's command line (its inline-program
# flags left out): the operation and the stack, never the config.
_CLI_OP = {"update": "up", "preview": "preview", "refresh": "refresh", "destroy": "destroy"}


class FakeStack:
    def __init__(self, ws: FakeWorkspace, name: str, program: Any) -> None:
        self.workspace, self.name, self.program = ws, name, program

    @property
    def config(self) -> dict[str, Any]:
        """The stack's config: its settings file's values and set_all_config's, as ConfigValues."""
        return self.workspace.configs.setdefault(self.name, {})

    @property
    def state(self) -> dict[str, Any]:
        return self.workspace.states.setdefault(self.name, {"resources": [], "pending_operations": []})

    def _op(self, kind: str, on_event: Any = None) -> None:
        self.workspace.calls.append((kind, self.name))
        if kind in _CLI_OP:
            self.workspace.argv.append(["pulumi", _CLI_OP[kind], "--yes", "--stack", self.name])
        failure = self.workspace.fail.get(kind)
        if failure:
            exc = failure.pop(0)
            if not failure:
                del self.workspace.fail[kind]
            self.workspace.history.setdefault(self.name, []).append(Update(kind, "failed", dict(self.config)))
            raise exc
        if kind in ("update", "preview") and self.state["pending_operations"]:
            raise command_error(PENDING_STDERR.format(name=self.name))

    def set_all_config(self, values: dict[str, Any], *, path: bool = False) -> None:
        from pulumi.automation import LocalWorkspace

        self.workspace.calls.append(("config", self.name))
        LocalWorkspace.set_all_config(_Cli(self.workspace), self.name, values, path=path)  # type: ignore[arg-type]
        self.config.update(values)

    def up(self, on_event: Any = None, on_output: Any = None, color: str | None = None) -> Any:
        self._op("update")
        block = self.workspace.block_up
        if block is not None:
            self.workspace.blocked.set()
            block.wait(10)
            self.workspace.block_up = None
            # What the CLI does on SIGINT in the middle of a create: stop, save, report.
            self.state["pending_operations"] = [{"resource": {"urn": "node-0"}, "type": "creating"}]
            raise command_error("error: update canceled")
        # The program is not run here (test_*_program.py run the real ones under Pulumi's mocks);
        # like the real stack, what it declares follows the plan recorded in the stack config.
        plan = getattr(self.program, "plan", None)  # what the program would declare from, private keys too
        recorded = dataclasses.asdict(plan) if plan is not None else json.loads(self.config["skyward:plan"].value)
        self.workspace.plans.setdefault(self.name, []).append(recorded)
        urn = f"urn:pulumi:{self.name}::skyward::aws:ec2/instance:Instance::node-0"
        if on_event is not None:
            on_event(engine_event("resourcePreEvent", "create", urn, "aws:ec2/instance:Instance"))
            on_event(engine_event("resOutputsEvent", "create", urn, "aws:ec2/instance:Instance"))
        outputs = self.workspace.outputs(self.name)
        self.state["resources"] = [{"urn": n["index"]} for n in outputs.get("nodes", [])]
        self.workspace.history.setdefault(self.name, []).append(Update("update", "succeeded", dict(self.config)))
        return _Result({k: _Value(v) for k, v in outputs.items()})

    def preview(self, on_event: Any = None, on_output: Any = None, color: str | None = None) -> Any:
        self._op("preview")
        return _Result({}, change_summary={"create": 4})

    def refresh(self, on_event: Any = None, on_output: Any = None, color: str | None = None) -> Any:
        self._op("refresh")

    def destroy(self, on_event: Any = None, on_output: Any = None, color: str | None = None) -> Any:
        self._op("destroy")
        self.state["resources"] = []
        self.workspace.history.setdefault(self.name, []).append(Update("destroy", "succeeded", dict(self.config)))

    def outputs(self) -> dict[str, Any]:
        return {k: _Value(v) for k, v in self.workspace.outputs(self.name).items()}

    def history(self, show_secrets: bool = True) -> list[Update]:
        return list(reversed(self.workspace.history.get(self.name, [])))

    def export_stack(self) -> Any:
        from pulumi.automation import Deployment

        return Deployment(version=3, deployment=json.loads(json.dumps(self.state)))

    def import_stack(self, state: Any) -> None:
        self.workspace.calls.append(("import", self.name))
        self.workspace.states[self.name] = {"pending_operations": [], **state.deployment}


@dataclass
class _Value:
    value: Any
    secret: bool = False


@dataclass
class _Result:
    outputs: dict[str, Any]
    change_summary: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeWorkspace:
    """``connect`` for PoolStack / sky.AWS(workspace=...): (name, program) -> FakeStack."""

    addresses: list[str] = field(default_factory=lambda: [f"203.0.113.{i}" for i in range(10, 40)])
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail: dict[str, list[Exception]] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: dict[str, list[Update]] = field(default_factory=dict)
    plans: dict[str, list[Any]] = field(default_factory=dict)
    plugins: list[tuple[str, str]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    block_up: Any = None
    blocked: Any = None
    # (index, plan record, stack config) -> dict: what a "booted" node's outputs say instead,
    # to point nodes at real hosts (called once per node, like a first boot).
    node_outputs: Any = None
    placement: dict[str, Any] = field(default_factory=dict)  # what the program's lookups resolved
    booted: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    # Every command line the Pulumi CLI would have been run with (["pulumi", "config", ...]).
    argv: list[list[str]] = field(default_factory=list)
    settings_bytes: dict[str, int] = field(default_factory=dict)  # size of each stack's settings file

    def __call__(self, name: str, program: Any) -> FakeStack:
        self.calls.append(("select", name))
        self.argv.append(["pulumi", "stack", "select", "--create", "--stack", name])
        self.configs.setdefault(name, {})  # `stack init` writes the settings file (its salt)
        return FakeStack(self, name, program)

    # The stack's settings file (Pulumi.<stack>.yaml), as LocalWorkspace reads and writes it:
    # plain values as strings, secret ones as {secure: ciphertext}; writing it is config.
    def stack_settings(self, name: str) -> Any:
        from pulumi.automation import StackSettings
        from pulumi.automation._stack_settings import StackSettingsSecureConfigValue

        if name not in self.configs:
            raise FileNotFoundError(f"failed to find stack settings file in workdir: fake/{name}")
        config = {k: StackSettingsSecureConfigValue(secure=_seal(v.value)) if v.secret else v.value
                  for k, v in self.configs[name].items()}
        return StackSettings(secrets_provider="passphrase", encryption_salt="v1:fake-salt", config=config)

    def save_stack_settings(self, name: str, settings: Any) -> None:
        from pulumi.automation import ConfigValue, StackSettings

        self.calls.append(("config", name))
        written = StackSettings._deserialize(settings._serialize())  # what the YAML file keeps
        assert written.encryption_salt == "v1:fake-salt", "the stack's encryption salt must be kept"
        self.configs[name] = {
            k: ConfigValue(value=v, secret=False) if isinstance(v, str) else ConfigValue(value=_unseal(v.secure), secret=True)
            for k, v in (written.config or {}).items()}
        self.settings_bytes[name] = len(json.dumps(settings._serialize()))

    def install_plugin(self, name: str, version: str, kind: str = "resource") -> None:
        self.plugins.append((name, version))

    def remove_stack(self, name: str) -> None:
        self.calls.append(("remove", name))
        self.removed.append(name)
        self.states.pop(name, None)

    def outputs(self, name: str) -> dict[str, Any]:
        plans = self.plans.get(name) or [None]
        plan = plans[-1]
        if plan is None:
            return {}
        nodes = []
        for n in plan["nodes"]:
            i = n["index"]
            out = {"index": i, "id": f"i-{i:04d}", "public_ip": self.addresses[i],
                   "private_ip": f"10.0.0.{i + 10}", "hostname": f"ip-10-0-0-{i + 10}"}
            if self.node_outputs is not None:
                if (name, i) not in self.booted:
                    self.booted[(name, i)] = self.node_outputs(i, plan, self.configs.get(name, {}))
                out.update(self.booted[(name, i)])
            nodes.append(out)
        return {"nodes": nodes, **({"placement": dict(self.placement)} if self.placement else {})}



def _seal(value: str) -> str:
    import base64

    return "v1:" + base64.b64encode(value.encode()).decode()


def _unseal(secure: str) -> str:
    import base64

    return base64.b64decode(secure.removeprefix("v1:")).decode()


def install_mocks(recorder: Recorder) -> Recorder:
    """Make ``recorder`` Pulumi's mocks. Pulumi's runtime asks for the main thread's event loop
    (asyncio.get_event_loop); an earlier test's ``asyncio.run`` leaves none set, and then every
    program test would fail in setup, so give it a live one where there is none."""
    policy = asyncio.get_event_loop_policy()
    try:
        loop = policy.get_event_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        policy.set_event_loop(policy.new_event_loop())
    pulumi.runtime.set_mocks(recorder, preview=False)
    return recorder


def fresh_mocks() -> Recorder:
    """Fresh Pulumi mocks for one test (programs declare resources into them). The program
    tests wrap it in a `mocks` fixture: a conftest.py here would shadow tests/conftest.py."""
    return install_mocks(Recorder())



def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SKYWARD_HOME of the test's own, and no Pulumi backend or passphrase from the caller's
    environment: what a stack test module's ``home`` fixture returns. (A helper, not a fixture
    in a conftest.py: this folder is not a package, and a second top-level ``conftest`` module
    would shadow the suite's own, which tests import helpers from.)"""
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    for name in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"
