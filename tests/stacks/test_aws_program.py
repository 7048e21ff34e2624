"""The AWS stack program under Pulumi's mocks: what one pool declares, for several specs.

Assertions run inside ``.apply`` of outputs returned from ``@pulumi.runtime.test`` functions,
which waits for them (an assertion in an apply that is not returned never runs).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")

from stackfakes import CLIENT, Recorder, cloud_config, fresh_mocks, make_plan  # noqa: E402

from skyward.stacks import aws  # noqa: E402
from skyward.stacks.plan import DiskPlan  # noqa: E402

INSTANCE = "aws:ec2/instance:Instance"


@pytest.fixture
def mocks() -> Recorder:
    return fresh_mocks()


def _all(declared: aws.Declared, *extra: Any) -> Any:
    """One output that resolves once every declared resource has."""
    ids = [i.id for i in declared.instances.values()]
    return pulumi.Output.all(declared.security_group.ingress, declared.security_group.egress, *ids, *extra)


@pulumi.runtime.test
def test_security_group_allows_ssh_from_the_client_and_the_group_only(mocks: Recorder) -> Any:
    plan = make_plan(nodes=2)
    declared = aws.program(plan)

    def check(values: list[Any]) -> None:
        ingress = values[0]
        assert len(ingress) == 2, ingress
        ssh = next(r for r in ingress if r["protocol"] == "tcp")
        assert (ssh["from_port"], ssh["to_port"]) == (22, 22)
        assert ssh["cidr_blocks"] == [CLIENT]
        assert not ssh.get("ipv6_cidr_blocks")
        group = next(r for r in ingress if r["protocol"] == "-1")
        assert group.get("self") is True
        assert not group.get("cidr_blocks") and not group.get("ipv6_cidr_blocks")
        everywhere = [r for r in ingress for c in (r.get("cidr_blocks") or []) + (r.get("ipv6_cidr_blocks") or [])
                      if c in ("0.0.0.0/0", "::/0")]
        assert everywhere == []

    return _all(declared).apply(check)


@pytest.mark.parametrize("nodes,spot,gpu", [(1, False, False), (4, True, False), (1, True, True), (4, False, True)])
def test_instances_follow_the_plan(mocks: Recorder, nodes: int, spot: bool, gpu: bool) -> None:
    plan = make_plan(nodes=nodes, spot=spot, gpu=gpu, instance_type="g5.xlarge" if gpu else "m7i.large")

    @pulumi.runtime.test
    def run() -> Any:
        declared = aws.program(plan)
        insts = list(declared.instances.values())

        def check(values: list[Any]) -> None:
            assert len(mocks.of_type(INSTANCE)) == nodes
            for (market, shutdown, root, tags, ami, itype, key_name, user_data), node in zip(
                    values[2:], plan.nodes, strict=True):
                assert shutdown == "terminate"
                if spot:
                    assert market == {"market_type": "spot", "spot_options": {
                        "spot_instance_type": "one-time", "instance_interruption_behavior": "terminate"}}
                else:
                    assert market is None
                assert root["volume_size"] == plan.disk_gb and root["delete_on_termination"] is True
                assert tags["skyward-pool"] == "train" and tags["skyward-expires"] == "never"
                assert tags["skyward-version"] == "0_1_0" and tags["skyward-node"] == str(node.index)
                assert ami == ("ami-deeplearning" if gpu else "ami-ubuntu")
                assert itype == plan.instance_type
                assert key_name == "skyward-train-ab12cd34"
                # The node boots with its own host key and nothing else, plus the TTL watchdog.
                doc = cloud_config(user_data)
                assert doc["ssh_keys"] == {"ed25519_private": node.host_key_private, "ed25519_public": node.host_key}
                assert doc["ssh_deletekeys"] is True and doc["ssh_genkeytypes"] == []
                assert "ttl=600;" in user_data
                others = [n.host_key for n in plan.nodes if n is not node]
                assert not any(k in user_data for k in others)

        per_instance = [pulumi.Output.all(i.instance_market_options, i.instance_initiated_shutdown_behavior,
                                          i.root_block_device, i.tags, i.ami, i.instance_type, i.key_name,
                                          i.user_data) for i in insts]
        return pulumi.Output.all(declared.security_group.id, declared.key_pair.public_key, *per_instance).apply(check)

    run()


@pulumi.runtime.test
def test_disks_are_part_of_their_instance_and_deleted_with_it(mocks: Recorder) -> Any:
    # Volumes attached after launch keep DeleteOnTermination=false: a node that terminates itself
    # after a client crash would leave them billing; detaching a mounted one hangs a destroy.
    plan = make_plan(nodes=4, spot=True, disks=(DiskPlan(200, "/data"), DiskPlan(50, "/scratch", "io2", 3000)))
    declared = aws.program(plan)

    def check(rows: list[Any]) -> None:
        assert not mocks.of_type("aws:ebs/volume:Volume")
        assert not mocks.of_type("aws:ec2/volumeAttachment:VolumeAttachment")
        for devices, root, user_data in rows:
            assert root["delete_on_termination"] is True
            assert [(d["device_name"], d["volume_size"], d["volume_type"], d["delete_on_termination"], d.get("iops"))
                    for d in devices] == [("/dev/sdf", 200, "gp3", True, None), ("/dev/sdg", 50, "io2", True, 3000)]
            doc = cloud_config(user_data)
            assert ["/usr/local/sbin/skyward-disk", "/data", "ebs:sdf"] in doc["runcmd"]
            assert ["/usr/local/sbin/skyward-disk", "/scratch", "ebs:sdg"] in doc["runcmd"]
            assert any(f["path"] == "/usr/local/sbin/skyward-ebs-name" for f in doc["write_files"])

    return pulumi.Output.all(*[
        pulumi.Output.all(i.ebs_block_devices, i.root_block_device, i.user_data) for i in declared.instances.values()
    ]).apply(check)


@pulumi.runtime.test
def test_imdsv2_is_required(mocks: Recorder) -> Any:
    # The user data holds the node's private host key; IMDSv1 would serve it to any SSRF.
    declared = aws.program(make_plan(nodes=2))

    def check(options: list[Any]) -> None:
        for o in options:
            assert o["http_tokens"] == "required" and o["http_endpoint"] == "enabled"

    return pulumi.Output.all(*[i.metadata_options for i in declared.instances.values()]).apply(check)


_DESCRIPTION = re.compile(aws.DESCRIPTION_CHARS)


@pulumi.runtime.test
def test_every_description_obeys_aws_rules(mocks: Recorder) -> Any:
    # AWS refuses a security group whose (rule) descriptions hold any other character: an
    # apostrophe in one made every `up` fail. Pulumi's mocks accept anything, so check here.
    plan = replace(make_plan(nodes=1), pool="Bob's pool (v2)", ssh_cidrs=(CLIENT, "2001:db8::/64"))
    declared = aws.program(plan)

    def check(values: list[Any]) -> None:
        description, ingress, egress = values
        texts = [description, *[r.get("description") or "" for r in [*ingress, *egress]]]
        assert all(texts), texts
        for text in texts:
            assert _DESCRIPTION.match(text), f"AWS refuses the description {text!r}"

    sg = declared.security_group
    return pulumi.Output.all(sg.description, sg.ingress, sg.egress).apply(check)


def test_the_description_rule_catches_what_aws_refuses() -> None:
    assert not _DESCRIPTION.match("the pool's own nodes")
    assert _DESCRIPTION.match("ssh from the skyward client: 10.0.0.0/8 [ci] #1")


@pulumi.runtime.test
def test_default_subnet_is_in_a_zone_that_offers_the_type(mocks: Recorder) -> Any:
    mocks.aws_zones = ["us-east-1f", "us-east-1c", "us-east-1d"]  # not us-east-1a or e
    declared = aws.program(make_plan(nodes=1, instance_type="g5.xlarge", gpu=True))

    def check(values: list[Any]) -> None:
        subnet, zone = values
        assert zone == "us-east-1c" and subnet == "subnet-default-us-east-1c"  # first, sorted
        offerings = [c for c in mocks.calls if c.token.endswith("getInstanceTypeOfferings")]
        assert offerings[0].args["filters"][0]["values"] == ["g5.xlarge"]

    return pulumi.Output.all(declared.subnet.id, declared.subnet.availability_zone).apply(check)


@pulumi.runtime.test
def test_a_retry_takes_the_next_zone(mocks: Recorder) -> Any:
    mocks.aws_zones = ["us-east-1f", "us-east-1c", "us-east-1d"]
    declared = aws.program(make_plan(nodes=1, settings={"zone_attempt": 1}))
    return declared.subnet.availability_zone.apply(lambda z: _eq(z, "us-east-1d"))


@pulumi.runtime.test
def test_only_zones_with_a_default_subnet_are_chosen(mocks: Recorder) -> Any:
    # us-east-1c offers the type but its default subnet was deleted: the lookup would fail there.
    mocks.aws_zones = ["us-east-1f", "us-east-1c", "us-east-1d"]
    mocks.aws_default_subnets = ["us-east-1d", "us-east-1f"]
    first = aws.program(make_plan(nodes=1))
    second = aws.program(replace(make_plan(nodes=1), settings={"zone_attempt": 1}))
    return pulumi.Output.all(first.subnet.availability_zone, second.subnet.availability_zone).apply(
        lambda zones: _eq(zones, ["us-east-1d", "us-east-1f"]))


@pytest.mark.parametrize("zone", [None, "us-east-1c"])
def test_no_default_subnet_where_the_type_is_offered_says_how_to_make_one(zone: str | None) -> None:

    mocks = fresh_mocks()
    mocks.aws_zones = ["us-east-1f", "us-east-1c"]
    mocks.aws_default_subnets = ["us-east-1a"]  # not where the type is offered

    @pulumi.runtime.test
    def go() -> Any:
        return aws.program(make_plan(nodes=1, zone=zone)).subnet.id

    with pytest.raises(Exception, match=r"no default subnet in us-east-1c.*"
                                        r"aws ec2 create-default-subnet --availability-zone us-east-1c.*"
                                        r"sky\.AWS\(subnet="):
        go()


def _eq(a: Any, b: Any) -> None:
    assert a == b


def _instance_inputs(mocks: Recorder) -> dict[str, dict[str, Any]]:
    """The inputs of every instance, by name: what would replace one if it changed."""
    return {r.name: {k: r.inputs.get(k) for k in ("ami", "subnetId", "userData", "instanceType", "ebsBlockDevices")}
            for r in mocks.of_type(INSTANCE)}


def test_a_second_up_replaces_nothing_when_a_newer_ami_appears() -> None:
    from skyward.stacks.cloudpool import CloudPool

    plan = make_plan(nodes=2, gpu=True, instance_type="g5.xlarge", disks=(DiskPlan(20, "/data"),))

    def run(plan: Any, mocks: Recorder) -> dict[str, Any]:
        outputs: dict[str, Any] = {}

        @pulumi.runtime.test
        def go() -> Any:
            declared = aws.program(plan)
            return pulumi.Output.all(declared.ami, declared.subnet.id, declared.subnet.availability_zone).apply(
                lambda v: outputs.update(placement={"ami": v[0], "subnet": v[1], "zone": v[2]}))

        go()
        return outputs

    first_mocks = fresh_mocks()
    outputs = run(plan, first_mocks)
    first = _instance_inputs(first_mocks)
    assert outputs["placement"] == {"ami": "ami-deeplearning", "subnet": "subnet-default-us-east-1a",
                                    "zone": "us-east-1a"}
    # What the pool does with the first up's outputs: pin them in the plan.
    cloud = CloudPool.__new__(CloudPool)
    cloud.plan = plan
    CloudPool._pin(cloud, outputs)
    assert cloud.plan.settings["pinned"]["ami"] == "ami-deeplearning"

    second_mocks = fresh_mocks()
    second_mocks.ami_date = "20261101"  # a newer Deep Learning AMI came out
    second_mocks.aws_zones = ["us-east-1d"]  # and the zone offerings changed order
    run(cloud.plan, second_mocks)
    assert _instance_inputs(second_mocks) == first
    assert not [c for c in second_mocks.calls if c.token.endswith(("getAmi", "getInstanceTypeOfferings"))]
    # An unpinned plan would have picked the new image: the test can fail.
    third_mocks = fresh_mocks()
    third_mocks.ami_date = "20261101"
    run(plan, third_mocks)
    assert _instance_inputs(third_mocks) != first


@pulumi.runtime.test
def test_given_subnet_ami_and_cap(mocks: Recorder) -> Any:
    plan = make_plan(nodes=1, expires_in=3600, settings={"subnet": "subnet-mine", "profile": "work"})
    plan = replace(plan, image="ami-custom")
    declared = aws.program(plan)
    inst = declared.instances[0]

    def check(values: list[Any]) -> None:
        subnet, vpc, tags, ami, user_data = values
        assert subnet == "subnet-mine" and vpc == "vpc-given"
        assert tags["skyward-expires"] == str(plan.expires)
        assert ami == "ami-custom"
        # An absolute deadline, the same in every node's user data: the minutes left are computed
        # at boot, so a node added later does not outlive the cap.
        assert f"left=$(( ({plan.expires} - $(date +%s)) / 60 ))" in user_data
        assert f"deadline={plan.expires};" in user_data
        assert not [c for c in mocks.calls if c.token == "aws:ec2/getAmi:getAmi"]
        providers = mocks.of_type("pulumi:providers:aws")
        assert providers[0].inputs["profile"] == "work" and providers[0].inputs["region"] == "us-east-1"

    return pulumi.Output.all(inst.subnet_id, declared.security_group.vpc_id, inst.tags, inst.ami, inst.user_data).apply(check)


@pulumi.runtime.test
def test_no_ttl_means_no_watchdog(mocks: Recorder) -> Any:
    declared = aws.program(make_plan(ttl=0))

    def check(user_data: str) -> None:
        assert "skyward-watchdog" not in user_data

    return declared.instances[0].user_data.apply(check)


@pulumi.runtime.test
def test_user_data_leaves_the_gce_guest_agent_alone_on_aws(mocks: Recorder) -> Any:
    declared = aws.program(make_plan(nodes=1))
    return declared.instances[0].user_data.apply(lambda ud: _eq("instance_configs.cfg" in ud, False))
