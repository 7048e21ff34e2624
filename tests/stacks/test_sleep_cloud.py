"""A cloud pool that sleeps at zero nodes: asleep, its stack is updated to hold no
instance while its network, security group and key pair stay (it costs nothing), and waking is
one more update that brings instances back. Checked on the stack's lifecycle through the fake
workspace, and on what the real AWS and GCP programs declare for the asleep plan, under Pulumi's
mocks (skyward.stacks.preview.resources); closing still destroys in one go."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pulumi")

from stackfakes import FakeWorkspace, make_plan

import skyward as sky
from skyward.stacks import aws, gcp, keys
from skyward.stacks.cloudpool import CloudPool
from skyward.stacks.preview import resources

INSTANCE = "aws:ec2/instance:Instance"


pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def _ops(ws: FakeWorkspace) -> list[str]:
    return [kind for kind, _ in ws.calls]


def _types(rows: list[dict[str, str]]) -> list[str]:
    return [r["type"] for r in rows]


def test_asleep_the_stack_keeps_its_network_and_loses_its_instances_and_waking_brings_them_back() -> None:
    ws = FakeWorkspace(placement={"ami": "ami-ubuntu", "subnet": "subnet-default-us-east-1a", "zone": "us-east-1a"})
    plan = make_plan(nodes=0)
    key_path, _ = keys.client_key(plan.stack)
    cloud = CloudPool(plan, aws.program, pool_id="ab12cd34", key_path=key_path, spot=False,
                      fallback_to_on_demand=False, record={"offer": {"instance_type": "m7i.large"}}, connect=ws)
    awake = cloud.start(2)
    before = resources(aws.program, cloud.plan)
    assert _types(before).count(INSTANCE) == 2

    cloud.shrink(awake)  # asleep: every node leaves
    assert _ops(ws) == ["select", "config", "update", "config", "update"]  # an update, no destroy
    assert not ws.removed and json.loads(ws.configs[plan.stack]["skyward:plan"].value)["nodes"] == []
    assert ws.states[plan.stack]["resources"] == []  # no instance left in the stack's state
    asleep = resources(aws.program, cloud.plan)
    assert INSTANCE not in _types(asleep)
    kept = [r for r in before if r["type"] != INSTANCE]
    assert asleep == kept  # the security group, its rules, the key pair: the same, unchanged
    assert {"aws:ec2/securityGroup:SecurityGroup", "aws:ec2/keyPair:KeyPair"} <= set(_types(asleep))
    assert cloud.plan.settings["pinned"]["subnet"] == "subnet-default-us-east-1a"  # the network stays

    (woken,) = cloud.grow(1)  # a task wakes it: one more update, with a new node
    assert _ops(ws)[-1] == "update" and woken.address
    assert len(json.loads(ws.configs[plan.stack]["skyward:plan"].value)["nodes"]) == 1
    again = resources(aws.program, cloud.plan)
    assert _types(again).count(INSTANCE) == 1 and [r for r in again if r["type"] != INSTANCE] == kept
    assert [u.kind for u in ws.history[plan.stack]] == ["update", "update", "update"]  # all in its history

    cloud.close()
    assert _ops(ws)[-3:] == ["refresh", "destroy", "remove"] and ws.removed == [plan.stack]


def test_an_asleep_gcp_plan_keeps_its_firewalls_and_declares_no_instance() -> None:
    plan = make_plan(nodes=2, region="us-central1", zone="us-central1-b", instance_type="e2-standard-4")
    awake = resources(gcp.program, plan)
    asleep = resources(gcp.program, plan.with_nodes(()))
    instance = "gcp:compute/instance:Instance"
    assert _types(awake).count(instance) == 2 and instance not in _types(asleep)
    assert _types(asleep).count("gcp:compute/firewall:Firewall") >= 2
    assert asleep == [r for r in awake if r["type"] != instance and not r["name"].startswith("node-")]


def test_an_aws_pool_born_asleep_creates_no_instance_and_closes_with_one_destroy() -> None:
    ws = FakeWorkspace()
    provider = sky.AWS(workspace=ws, detect_address=False, allow_ssh_from=["10.0.0.0/8"])
    with sky.Compute(provider=provider, nodes=(0, 2), options=sky.Options(console=False)) as pool:
        assert pool.current_nodes() == 0 and pool.cluster.describe()["nodes"] == []
        stack = pool.cluster.describe()["stack"]["name"]
        assert not ws.plans[stack][-1]["nodes"]  # its stack exists, with no instance
    ops = _ops(ws)
    assert ops[:3] == ["select", "config", "update"] and ops[-3:] == ["refresh", "destroy", "remove"]
    assert ops.count("update") == 1 and ws.removed == [stack]  # no update that empties it first
