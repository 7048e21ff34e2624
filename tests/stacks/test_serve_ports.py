"""A port of the head node opened to ``allow_from=`` (``pool.serve(on="head")``): what the stack
programs declare for ``plan.serve_ports`` under Pulumi's mocks (a rule with exactly that port and
those networks, on that node alone; none without), and how a CloudPool puts the port in its plan
and takes it out again, one stack update each (through the fake workspace)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")

from stackfakes import CLIENT, FakeWorkspace, Recorder, command_error, fresh_mocks, make_plan  # noqa: E402

from skyward.errors import StackError  # noqa: E402
from skyward.stacks import aws, gcp, keys  # noqa: E402
from skyward.stacks.cloudpool import CloudPool  # noqa: E402
from skyward.stacks.gcp_common import ALLOW_PRIORITY  # noqa: E402
from skyward.stacks.plan import PoolPlan, PortPlan  # noqa: E402

INSTANCE = "aws:ec2/instance:Instance"
GROUP = "aws:ec2/securityGroup:SecurityGroup"
FIREWALL = "gcp:compute/firewall:Firewall"
OPEN = PortPlan(node=0, port=8000, cidrs=("10.0.0.0/8", "2001:db8::/48"))


@pytest.fixture
def mocks() -> Recorder:
    return fresh_mocks()


def _instances(mocks: Recorder) -> dict[str, Any]:
    return {r.name: r.inputs for r in mocks.of_type(INSTANCE)}


# -- AWS: a security group of the head's own ---------------------------------------------------------
@pulumi.runtime.test
def test_aws_opens_exactly_the_port_to_exactly_the_cidrs_on_the_head_instance_only(mocks: Recorder) -> Any:
    plan = replace(make_plan(nodes=3), serve_ports=(OPEN,))
    declared = aws.program(plan)
    assert set(declared.serve_groups) == {0}
    serve = declared.serve_groups[0]

    def check(values: list[Any]) -> None:
        ingress, egress, serve_id, pool_ingress, *_ = values
        assert ingress == [{"description": "pool.serve on port 8000 from allow_from", "protocol": "tcp",
                            "from_port": 8000, "to_port": 8000, "cidr_blocks": ["10.0.0.0/8"],
                            "ipv6_cidr_blocks": ["2001:db8::/48"]}]
        assert egress == []
        groups = {name: inputs["vpcSecurityGroupIds"] for name, inputs in _instances(mocks).items()}
        assert groups == {"node-0": ["nodes-id", serve_id], "node-1": ["nodes-id"], "node-2": ["nodes-id"]}
        # The pool's own group is what it was: ssh from the client, the group itself.
        assert len(pool_ingress) == 2
        assert [r["cidr_blocks"] for r in pool_ingress if r["protocol"] == "tcp"] == [[CLIENT]]
        assert len(mocks.of_type(GROUP)) == 2
        for r in mocks.of_type(GROUP):
            assert all(re.match(aws.DESCRIPTION_CHARS, rule["description"])
                       for rule in r.inputs.get("ingress") or []), r.inputs
            assert re.match(aws.DESCRIPTION_CHARS, r.inputs["description"]), r.inputs

    return pulumi.Output.all(serve.ingress, serve.egress, serve.id, declared.security_group.ingress,
                             *[i.id for i in declared.instances.values()]).apply(check)


@pulumi.runtime.test
def test_aws_declares_no_rule_without_allow_from(mocks: Recorder) -> Any:
    declared = aws.program(make_plan(nodes=2))
    assert declared.serve_groups == {}

    def check(_: list[Any]) -> None:
        assert len(mocks.of_type(GROUP)) == 1
        assert {n: i["vpcSecurityGroupIds"] for n, i in _instances(mocks).items()} == {
            "node-0": ["nodes-id"], "node-1": ["nodes-id"]}

    return pulumi.Output.all(*[i.id for i in declared.instances.values()]).apply(check)


@pulumi.runtime.test
def test_aws_two_endpoints_on_the_head_share_its_group_and_a_gone_node_gets_none(mocks: Recorder) -> Any:
    second = PortPlan(node=0, port=9000, cidrs=("192.168.0.0/16",))
    gone = PortPlan(node=7, port=8000, cidrs=("10.0.0.0/8",))  # the head was replaced since
    declared = aws.program(replace(make_plan(nodes=2), serve_ports=(second, OPEN, gone)))
    assert set(declared.serve_groups) == {0}

    def check(ingress: list[Any]) -> None:
        assert [(r["from_port"], r["to_port"], r["cidr_blocks"]) for r in ingress] == [
            (8000, 8000, ["10.0.0.0/8"]), (9000, 9000, ["192.168.0.0/16"])]
        assert len(mocks.of_type(GROUP)) == 2

    return declared.serve_groups[0].ingress.apply(check)


# -- GCP: a firewall rule that targets the head's own service account --------------------------------
def _gcp_plan(**kw: Any) -> PoolPlan:
    return make_plan(region="us-central1", zone="us-central1-b", instance_type="e2-standard-4", **kw)


@pulumi.runtime.test
def test_gcp_opens_exactly_the_port_to_exactly_the_cidrs_for_the_head_only(mocks: Recorder) -> Any:
    plan = replace(_gcp_plan(nodes=2), serve_ports=(OPEN,))
    declared = gcp.program(plan)
    v4, v6 = declared.firewalls["serve-0-8000"], declared.firewalls["serve-0-8000-v6"]

    def check(values: list[Any]) -> None:
        (allows4, ranges4, targets4, tags4, prio4, allows6, ranges6, targets6, head_email, other_email) = values
        assert allows4 == allows6 == [{"protocol": "tcp", "ports": ["8000"]}]
        assert ranges4 == ["10.0.0.0/8"] and ranges6 == ["2001:db8::/48"]
        assert targets4 == targets6 == [head_email] and other_email != head_email
        assert not tags4  # not the pool's tag: that is on every node
        assert prio4 == ALLOW_PRIORITY  # above the deny-all
        assert len(mocks.of_type(FIREWALL)) == 6  # ssh, internal, the deny-all pair, and these two

    return pulumi.Output.all(
        v4.allows, v4.source_ranges, v4.target_service_accounts, v4.target_tags, v4.priority,
        v6.allows, v6.source_ranges, v6.target_service_accounts,
        declared.accounts[0].email, declared.accounts[1].email,
    ).apply(check)


@pulumi.runtime.test
def test_gcp_declares_no_rule_without_allow_from(mocks: Recorder) -> Any:
    declared = gcp.program(_gcp_plan(nodes=2))
    assert not [k for k in declared.firewalls if k.startswith("serve")]

    def check(_: Any) -> None:
        assert len(mocks.of_type(FIREWALL)) == 4

    return pulumi.Output.all(*[i.id for i in declared.instances.values()]).apply(check)


def test_a_tpu_pool_refuses_the_rule_before_anything_is_declared(mocks: Recorder) -> None:
    settings = {"project": "proj", "accelerator_type": "v5litepod-4",
                "tpu": {"runtime_version": "v2-alpha-tpuv5-lite", "hosts": 1}}
    plan = replace(make_plan(region="us-central1", zone="us-central1-a", instance_type="tpu-v5litepod-4",
                             settings=settings), serve_ports=(OPEN,))
    with pytest.raises(ValueError, match="allow_from= is not supported on TPU VMs"):
        gcp.program(plan)
    assert mocks.resources == []


# -- the pool's plan: one update opens, one closes --------------------------------------------------
pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def _cloud(ws: FakeWorkspace) -> CloudPool:
    plan = make_plan(nodes=0)
    key_path, _ = keys.client_key(plan.stack)
    return CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=False,
                     fallback_to_on_demand=False, connect=ws)


def test_open_port_and_close_port_are_one_stack_update_each_and_the_close_leaves_no_rule() -> None:
    ws = FakeWorkspace(addresses=["198.18.0.1", "198.18.0.2"])
    cloud = _cloud(ws)
    cloud.start(2)
    cloud.open_port(0, 8000, ["10.0.0.0/8"])
    cloud.open_port(0, 8000, ["10.1.0.0/16"])  # the same port again: its CIDRs are replaced, not added to
    plans = ws.plans[cloud.plan.stack]
    assert [list(p["serve_ports"]) for p in plans] == [
        [], [{"node": 0, "port": 8000, "cidrs": ("10.0.0.0/8",)}], [{"node": 0, "port": 8000, "cidrs": ("10.1.0.0/16",)}]]
    recorded = json.loads(ws.configs[cloud.plan.stack]["skyward:plan"].value)
    assert recorded["serve_ports"] == [{"node": 0, "port": 8000, "cidrs": ["10.1.0.0/16"]}]
    # A named pool's description carries the port: the plan read back from it still has it.
    described = PoolPlan.from_dict(cloud.describe()["plan"])
    assert described.serve_ports == (PortPlan(0, 8000, ("10.1.0.0/16",)),)

    cloud.close_port(0, 8000)
    assert not plans[-1]["serve_ports"] and len(plans) == 4
    cloud.close_port(0, 8000)  # nothing open: no update
    assert len(plans) == 4


def test_an_open_that_fails_puts_the_plan_back() -> None:
    ws = FakeWorkspace(addresses=["198.18.0.1"])
    cloud = _cloud(ws)
    cloud.start(1)
    ws.fail["update"] = [command_error("error: quota")]
    with pytest.raises(StackError):
        cloud.open_port(0, 8000, ["10.0.0.0/8"])
    assert cloud.plan.serve_ports == ()
    cloud.shrink([0])  # the next update declares no rule either
    assert not ws.plans[cloud.plan.stack][-1]["serve_ports"]

