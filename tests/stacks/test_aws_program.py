"""The AWS stack program under Pulumi's mocks: what one pool declares, for several specs.

Assertions run inside ``.apply`` of outputs returned from ``@pulumi.runtime.test`` functions,
which waits for them (an assertion in an apply that is not returned never runs).
"""

from __future__ import annotations

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
    ids += [v.id for vols in declared.volumes.values() for v in vols]
    ids += [a.id for atts in declared.attachments.values() for a in atts]
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
def test_disks_are_attached_to_their_own_node(mocks: Recorder) -> Any:
    plan = make_plan(nodes=4, spot=True, disks=(DiskPlan(200, "/data"), DiskPlan(50, "/scratch", "io2")))
    declared = aws.program(plan)
    outputs = []
    for index, atts in declared.attachments.items():
        for j, att in enumerate(atts):
            vol = declared.volumes[index][j]
            outputs.append(pulumi.Output.all(index, j, att.instance_id, att.volume_id, att.device_name,
                                             declared.instances[index].id, vol.id, vol.size, vol.type,
                                             vol.availability_zone))

    def check(rows: list[Any]) -> None:
        assert len(rows) == 8
        assert len(mocks.of_type("aws:ebs/volume:Volume")) == 8
        for index, j, inst_of_att, vol_of_att, device, inst, vol, size, vtype, zone in rows:
            assert inst_of_att == inst, f"disk {j} of node {index} is attached to another instance"
            assert vol_of_att == vol
            assert device == ("/dev/sdf", "/dev/sdg")[j]
            assert (size, vtype) == ((200, "gp3"), (50, "io2"))[j]
            assert zone == "us-east-1a"  # the subnet's zone, where the instance is
        ids = {r[6] for r in rows}
        assert len(ids) == 8

    return pulumi.Output.all(*outputs).apply(check)


@pulumi.runtime.test
def test_user_data_mounts_each_disk_by_its_volume_id(mocks: Recorder) -> Any:
    plan = make_plan(nodes=1, disks=(DiskPlan(100, "/data"),))
    declared = aws.program(plan)
    inst, vol = declared.instances[0], declared.volumes[0][0]

    def check(values: list[Any]) -> None:
        user_data, volume_id = values
        assert f"nvme-Amazon_Elastic_Block_Store_{volume_id.replace('-', '')}" in user_data
        assert '"/data"' in user_data

    return pulumi.Output.all(inst.user_data, vol.id).apply(check)


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
        assert "shutdown -P +60" in user_data
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

