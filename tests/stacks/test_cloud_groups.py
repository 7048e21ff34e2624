"""A cloud pool of several groups is one stack: one network and security group (firewalls on
GCP) and one client key for the pool, each group's instances with their own instance type,
market, disks and image. Growing, shrinking or replacing one group's nodes changes only that
group's instances. The programs run under Pulumi's mocks; the pool's life runs through the fake
automation-API workspace."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")

from stackfakes import FakeWorkspace, Recorder, cloud_config, fresh_mocks, make_plan  # noqa: E402

from skyward.stacks import aws, gcp, keys  # noqa: E402
from skyward.stacks.cloudpool import CloudPool  # noqa: E402
from skyward.stacks.plan import DiskPlan, GroupPlan, NodePlan, PoolPlan  # noqa: E402

AWS_INSTANCE = "aws:ec2/instance:Instance"
GCP_INSTANCE = "gcp:compute/instance:Instance"
GCP_ACCEL = {"machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-t4", "attach": True,
             "accelerator_count": 2}


@pytest.fixture
def mocks() -> Recorder:
    return fresh_mocks()


def _nodes(layout: list[tuple[str, bool]]) -> tuple[NodePlan, ...]:
    out = []
    for i, (group, spot) in enumerate(layout):
        host = keys.ed25519(f"node-{i}")
        out.append(NodePlan(index=i, spot=spot, host_key=host.public, host_key_private=host.private, group=group))
    return tuple(out)


def aws_plan(prep: int = 3, train: int = 2) -> PoolPlan:
    """prep: cheap spot CPU nodes; train: on-demand GPU nodes with a data disk of their own."""
    base = make_plan(nodes=0)
    groups = (
        GroupPlan("prep", "m7i.large", 30, settings={"family": None}),
        GroupPlan("train", "g5.xlarge", 120, disks=(DiskPlan(200, "/data"),), gpu=True, settings={"family": None}),
    )
    layout = [("prep", True)] * prep + [("train", False)] * train
    return dataclasses.replace(base, instance_type="m7i.large", groups=groups, nodes=_nodes(layout))


def gcp_plan(prep: int = 3, train: int = 2) -> PoolPlan:
    base = make_plan(nodes=0, region="us-central1", zone="us-central1-b", instance_type="e2-standard-4",
                     settings={"project": "proj", "machine_type": "e2-standard-4"})
    groups = (
        GroupPlan("prep", "e2-standard-4", 30, settings={"machine_type": "e2-standard-4", "accelerator_type": None,
                                                         "attach": False, "accelerator_count": 0}),
        GroupPlan("train", "n1-standard-8", 120, disks=(DiskPlan(200, "/data"),), gpu=True, settings=GCP_ACCEL),
    )
    layout = [("prep", True)] * prep + [("train", False)] * train
    return dataclasses.replace(base, groups=groups, nodes=_nodes(layout))


def _aws_instances(mocks: Recorder) -> dict[str, dict[str, Any]]:
    return {r.name: dict(r.inputs) for r in mocks.of_type(AWS_INSTANCE)}


def test_a_two_group_aws_pool_is_one_security_group_and_each_groups_instances(mocks: Recorder) -> None:
    plan = aws_plan()

    @pulumi.runtime.test
    def run() -> Any:
        declared = aws.program(plan)

        def check(values: list[Any]) -> None:
            user_data = dict(zip(declared.instances, values, strict=False))
            assert len(mocks.of_type("aws:ec2/securityGroup:SecurityGroup")) == 1
            assert len(mocks.of_type("aws:ec2/keyPair:KeyPair")) == 1
            insts = _aws_instances(mocks)
            assert sorted(insts) == [f"node-{i}" for i in range(5)]
            for node in plan.nodes:
                inst = insts[node.name]
                prep = node.group == "prep"
                assert inst["instanceType"] == ("m7i.large" if prep else "g5.xlarge")
                assert inst["ami"] == ("ami-ubuntu" if prep else "ami-deeplearning")
                assert bool(inst.get("instanceMarketOptions")) is prep  # prep spot, train on-demand
                assert inst["rootBlockDevice"]["volumeSize"] == (30 if prep else 120)
                assert len(inst.get("ebsBlockDevices") or []) == (0 if prep else 1)
                assert inst["tags"]["skyward-group"] == node.group
                assert inst["tags"]["skyward-pool"] == "train"
                doc = cloud_config(user_data[node.index])
                mounted = ["/usr/local/sbin/skyward-disk", "/data", "ebs:sdf"] in doc["runcmd"]
                assert mounted is not prep  # only train's nodes have and mount the data disk
            groups_of_sg = {tuple(i["vpcSecurityGroupIds"]) for i in insts.values()}
            assert len(groups_of_sg) == 1
            # One zone offering both instance types was asked for, one lookup per type.
            offerings = [c for c in mocks.calls
                         if c.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings"]
            assert sorted(c.args["filters"][0]["values"][0] for c in offerings) == ["g5.xlarge", "m7i.large"]

        return pulumi.Output.all(*[i.user_data for i in declared.instances.values()], declared.subnet.id).apply(check)

    run()


def test_a_two_group_gcp_pool_is_one_set_of_firewalls_and_each_groups_instances(mocks: Recorder) -> None:
    plan = gcp_plan()
    single = make_plan(nodes=1, region="us-central1", zone="us-central1-b", instance_type="e2-standard-4",
                       settings={"project": "proj"})

    @pulumi.runtime.test
    def run() -> Any:
        declared = gcp.program(plan)

        def check(_: Any) -> None:
            firewalls = mocks.of_type("gcp:compute/firewall:Firewall")
            assert len(firewalls) == 4 == len(declared.firewalls)  # ssh, internal, deny-all pair: the pool's
            assert len(mocks.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")) == 1
            insts = {r.name: dict(r.inputs) for r in mocks.of_type(GCP_INSTANCE)}
            assert sorted(insts) == [f"node-{i}" for i in range(5)]
            tags = {tuple(i["tags"]) for i in insts.values()}
            assert tags == {(gcp.network_tag(single),)}  # every group behind the pool's firewalls
            for node in plan.nodes:
                inst = insts[node.name]
                prep = node.group == "prep"
                assert inst["machineType"] == ("e2-standard-4" if prep else "n1-standard-8")
                accel = inst.get("guestAccelerators") or []
                assert accel == ([] if prep else [{"type": "nvidia-tesla-t4", "count": 2}])
                assert inst["scheduling"]["provisioningModel"] == ("SPOT" if prep else "STANDARD")
                assert inst["bootDisk"]["initializeParams"]["size"] == (30 if prep else 120)
                image = inst["bootDisk"]["initializeParams"]["image"]
                assert ("nvidia" in image) is not prep, image
                assert len(inst.get("attachedDisks") or []) == (0 if prep else 1)
                assert inst["labels"]["skyward-group"] == node.group

        return pulumi.Output.all(*[i.id for i in declared.instances.values()]).apply(check)

    run()


def test_a_one_group_plan_is_the_plan_it_always_was() -> None:
    plan = make_plan(nodes=2)
    assert plan.of("") is plan and plan.group_names() == ("",)
    record = plan.record()
    assert "groups" not in record and all("group" not in n for n in record["nodes"])
    assert PoolPlan.from_dict(dataclasses.asdict(plan)) == plan
    grouped = aws_plan()
    assert PoolPlan.from_dict(dataclasses.asdict(grouped)) == grouped
    assert [n["group"] for n in grouped.record()["nodes"]] == ["prep"] * 3 + ["train"] * 2
    train = grouped.of("train")
    assert (train.instance_type, train.gpu, len(train.nodes), train.groups) == ("g5.xlarge", True, 2, ())
    with pytest.raises(KeyError, match="no group 'eval'"):
        grouped.of("eval")


def _declared_instances(plan: PoolPlan) -> dict[str, dict[str, Any]]:
    """The AWS instances a plan declares (each run with fresh mocks), by resource name."""
    mocks = fresh_mocks()

    @pulumi.runtime.test
    def run() -> Any:
        declared = aws.program(plan)
        return pulumi.Output.all(*[i.id for i in declared.instances.values()])

    run()
    return _aws_instances(mocks)


def _group_pool(ws: FakeWorkspace) -> CloudPool:
    plan = dataclasses.replace(aws_plan(0, 0), nodes=())
    key_path, _ = keys.client_key(plan.stack)
    return CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=True,
                     fallback_to_on_demand=False, record={"skyward": "0.1.0"}, connect=ws,
                     markets={"prep": (True, False), "train": (False, False)})


def test_scaling_one_group_updates_the_one_stack_without_touching_the_other(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = _group_pool(ws)
    first = cloud.start_groups({"prep": 2, "train": 1})
    assert [n.index for n in first["prep"]] == [0, 1] and [n.index for n in first["train"]] == [2]
    assert [k for k, _ in ws.calls].count("update") == 1  # every group in one update
    before = _declared_instances(cloud.plan)

    prep = cloud.group("prep")
    grown = prep.grow(2)
    assert [n.index for n in grown] == [3, 4]
    assert [k for k, _ in ws.calls].count("update") == 2
    after = _declared_instances(cloud.plan)
    assert after["node-2"] == before["node-2"]  # train's instance: the same inputs, nothing to update
    assert {n: after[n]["instanceType"] for n in ("node-3", "node-4")} == {"node-3": "m7i.large", "node-4": "m7i.large"}
    recorded = ws.plans[cloud.plan.stack][-1]
    assert [(n["index"], n["group"], n["spot"]) for n in recorded["nodes"]] == [
        (0, "prep", True), (1, "prep", True), (2, "train", False), (3, "prep", True), (4, "prep", True)]

    prep.shrink([0, 1, 3, 4])  # prep asleep; train runs on
    assert [(n.index, n.group) for n in cloud.plan.nodes] == [(2, "train")]
    assert _declared_instances(cloud.plan)["node-2"] == before["node-2"]

    # A lost train node is replaced by a train node; prep's view sees none of it.
    new, _ = cloud.group("train").replace(2)
    assert new.index != 2 and [(n.index, n.group) for n in cloud.plan.nodes] == [(new.index, "train")]
    assert cloud.group("train").plan.instance_type == "g5.xlarge"
    assert cloud.group("prep").plan.nodes == ()


def test_closing_groups_removes_each_groups_nodes_and_the_last_destroys_the_stack(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = _group_pool(ws)
    cloud.start_groups({"prep": 2, "train": 1})
    stack = cloud.plan.stack
    description = cloud.group("train").describe()
    assert description["group"] == "train" and description["markets"] == {"prep": [True, False],
                                                                           "train": [False, False]}
    cloud.group("prep").close()
    assert [n.group for n in cloud.plan.nodes] == ["train"]
    assert ("destroy", stack) not in ws.calls
    cloud.group("train").close()
    assert ("destroy", stack) in ws.calls and cloud._closed


def test_a_groups_lock_is_kept_under_its_name(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = _group_pool(ws)
    cloud.start_groups({"prep": 1, "train": 1})
    cloud.group("prep").keep_lock({"packages": ["a"]})
    cloud.group("train").keep_lock({"packages": ["b"]})
    import json

    kept = json.loads(ws.configs[cloud.plan.stack]["skyward:lock"].value)
    assert kept == {"groups": {"prep": {"packages": ["a"]}, "train": {"packages": ["b"]}}}
    assert cloud.group("train").lock_facts()["instance_type"] == "g5.xlarge"


def test_groups_that_cannot_share_a_stack_get_one_each(home: Path) -> None:
    """create_together answers None (the pool makes one stack per group) for groups in two
    regions, with other buckets, or on GCP holding TPUs or no common zone."""
    import skyward as sky

    ws = FakeWorkspace()
    aws_provider = sky.AWS(workspace=ws, detect_address=False)
    specs = {"a": sky.Spec(provider=aws_provider, nodes=1, vcpus=2, region="us-east-1"),
             "b": sky.Spec(provider=aws_provider, nodes=1, vcpus=2, region="us-west-2")}
    assert aws_provider.create_together(specs, "ab12cd34") is None
    assert ws.calls == []  # nothing was made
    buckets = {"a": sky.Spec(provider=aws_provider, nodes=1, vcpus=2, volumes=[sky.Volume("one-bucket", "/one")]),
               "b": sky.Spec(provider=aws_provider, nodes=1, vcpus=2)}
    assert aws_provider.create_together(buckets, "ab12cd34") is None

    gcp_provider = sky.GCP(workspace=ws, project="proj", detect_address=False)
    one = {"settings": {"zones": ["us-central1-a", "us-central1-b"]}}
    other = {"settings": {"zones": ["us-central1-b", "us-central1-c"]}}
    apart = {"settings": {"zones": ["us-central1-f"]}}
    offer = aws_provider.offer(specs["a"])  # any offer of one region without TPUs
    spec = specs["a"]
    both = gcp_provider._pool_settings({"a": spec, "b": spec}, {"a": offer, "b": offer}, {"a": one, "b": other})
    assert both == {"zones": ["us-central1-b"]}
    assert gcp_provider._pool_settings({"a": spec, "b": spec}, {"a": offer, "b": offer}, {"a": one, "b": apart}) is None
    tpu = dataclasses.replace(offer, extra={**offer.extra, "tpu": {"type": "v5litepod-8"}})
    assert gcp_provider._pool_settings({"a": spec, "b": spec}, {"a": offer, "b": tpu}, {"a": one, "b": one}) is None


def test_groups_reopened_in_one_process_share_one_stack_and_plan(home: Path) -> None:
    """A named pool's groups are attached one by one from their descriptions: they must update
    one plan, or one group's update would drop the nodes another group added since."""
    ws = FakeWorkspace()
    cloud = _group_pool(ws)
    cloud.start_groups({"prep": 1, "train": 1})
    prep_desc, train_desc = cloud.group("prep").describe(), cloud.group("train").describe()
    prep = CloudPool.from_description(prep_desc, lambda plan: None, connect=ws).group(prep_desc["group"])
    train = CloudPool.from_description(train_desc, lambda plan: None, connect=ws).group(train_desc["group"])
    assert prep.cloud is train.cloud
    prep.grow(1)
    train.grow(1)
    assert sorted((n.index, n.group) for n in train.cloud.plan.nodes) == [
        (0, "prep"), (1, "train"), (2, "prep"), (3, "train")]
    assert [n["index"] for n in ws.plans[cloud.plan.stack][-1]["nodes"]] == [0, 1, 2, 3]
    prep.close()
    train.close()
    reopened = CloudPool.from_description(prep_desc, lambda plan: None, connect=ws)
    assert reopened is not prep.cloud  # a closed pool is not handed out again
