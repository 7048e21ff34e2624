"""The GCP stack program under Pulumi's mocks (assertions inside returned ``.apply``)."""

from __future__ import annotations

from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")

from stackfakes import CLIENT, Recorder, cloud_config, fresh_mocks, make_plan  # noqa: E402

from skyward.stacks import gcp  # noqa: E402
from skyward.stacks.plan import DiskPlan  # noqa: E402

T4 = {"project": "proj", "machine_type": "n1-standard-4", "accelerator_type": "nvidia-tesla-t4",
      "attach": True, "accelerator_count": 1}


@pytest.fixture
def mocks() -> Recorder:
    return fresh_mocks()


def _plan(**kw: Any) -> Any:
    kw.setdefault("region", "us-central1")
    kw.setdefault("zone", "us-central1-b")
    kw.setdefault("instance_type", "e2-standard-4")
    return make_plan(**kw)


@pulumi.runtime.test
def test_firewall_allows_ssh_from_the_client_and_internal_traffic_by_tag(mocks: Recorder) -> Any:
    plan = _plan(nodes=2)
    declared = gcp.program(plan)
    ssh, internal = declared.firewalls["ssh"], declared.firewalls["internal"]
    tag = gcp.network_tag(plan)

    def check(values: list[Any]) -> None:
        ssh_allows, ssh_ranges, ssh_targets, ssh_sources, in_allows, in_ranges, in_sources, in_targets, tags = values
        assert ssh_allows == [{"protocol": "tcp", "ports": ["22"]}]
        assert ssh_ranges == [CLIENT] and ssh_targets == [tag] and not ssh_sources
        assert in_allows == [{"protocol": "all"}]
        assert in_sources == [tag] and in_targets == [tag] and not in_ranges
        assert len(mocks.of_type("gcp:compute/firewall:Firewall")) == 2
        assert all(t == [tag] for t in tags)

    return pulumi.Output.all(
        ssh.allows, ssh.source_ranges, ssh.target_tags, ssh.source_tags,
        internal.allows, internal.source_ranges, internal.source_tags, internal.target_tags,
        pulumi.Output.all(*[i.tags for i in declared.instances.values()]),
    ).apply(check)


@pytest.mark.parametrize("nodes,spot,cap", [(1, False, None), (4, True, None), (1, False, 7200), (4, True, 3600)])
def test_scheduling(mocks: Recorder, nodes: int, spot: bool, cap: int | None) -> None:
    plan = _plan(nodes=nodes, spot=spot, expires_in=cap)

    @pulumi.runtime.test
    def run() -> Any:
        declared = gcp.program(plan)

        def check(rows: list[Any]) -> None:
            assert len(mocks.of_type("gcp:compute/instance:Instance")) == nodes
            for scheduling, labels, zone in rows:
                assert scheduling["provisioning_model"] == ("SPOT" if spot else "STANDARD")
                assert scheduling["preemptible"] is spot
                if spot or cap:
                    assert scheduling["instance_termination_action"] == "DELETE"
                else:
                    assert "instance_termination_action" not in scheduling
                if cap:
                    assert scheduling["max_run_duration"] == {"seconds": cap}
                else:
                    assert "max_run_duration" not in scheduling
                assert labels["skyward-pool"] == "train"
                assert labels["skyward-expires"] == (str(plan.expires) if cap else "never")
                assert zone == "us-central1-b"

        rows = [pulumi.Output.all(i.scheduling, i.labels, i.zone) for i in declared.instances.values()]
        return pulumi.Output.all(*rows).apply(check)

    run()


@pulumi.runtime.test
def test_gpu_node_gets_its_accelerator_image_and_keys(mocks: Recorder) -> Any:
    plan = _plan(nodes=1, gpu=True, settings=T4, instance_type="n1-standard-4+t4")
    declared = gcp.program(plan)
    inst = declared.instances[0]

    def check(values: list[Any]) -> None:
        accelerators, machine_type, boot, metadata, name = values
        assert accelerators == [{"type": "nvidia-tesla-t4", "count": 1}]
        assert machine_type == "n1-standard-4"
        assert boot["initialize_params"]["image"] == gcp.default_image(plan) and "nvidia" in boot["initialize_params"]["image"]
        assert boot["initialize_params"]["size"] == plan.disk_gb and boot["auto_delete"] is True
        assert metadata["ssh-keys"] == f"ubuntu:{plan.ssh_public_key}"
        assert cloud_config(metadata["user-data"])["ssh_keys"]["ed25519_public"] == plan.nodes[0].host_key
        assert name == "sky-train-ab12cd34-0"
        provider = mocks.of_type("pulumi:providers:gcp")[0]
        assert provider.inputs["project"] == "proj"

    return pulumi.Output.all(inst.guest_accelerators, inst.machine_type, inst.boot_disk, inst.metadata, inst.name).apply(check)


@pulumi.runtime.test
def test_cpu_node_has_no_accelerator(mocks: Recorder) -> Any:
    declared = gcp.program(_plan(nodes=1))
    return declared.instances[0].guest_accelerators.apply(lambda acc: _assert(not acc))


@pulumi.runtime.test
def test_disks_are_attached_to_their_own_node(mocks: Recorder) -> Any:
    plan = _plan(nodes=4, disks=(DiskPlan(200, "/data"), DiskPlan(20, "/scratch", "pd-ssd")))
    declared = gcp.program(plan)
    rows = []
    for index, disks in declared.disks.items():
        inst = declared.instances[index]
        rows.append(pulumi.Output.all(index, inst.attached_disks, inst.metadata,
                                      *[pulumi.Output.all(d.self_link, d.size, d.type, d.zone) for d in disks]))

    def check(values: list[Any]) -> None:
        assert len(mocks.of_type("gcp:compute/disk:Disk")) == 8
        links = set()
        for index, attached, metadata, *disks in values:
            assert [a["source"] for a in attached] == [d[0] for d in disks], f"node {index} has another node's disk"
            assert [a["device_name"] for a in attached] == ["disk-0", "disk-1"]
            assert [(d[1], d[2], d[3]) for d in disks] == [(200, "pd-balanced", "us-central1-b"), (20, "pd-ssd", "us-central1-b")]
            assert "/dev/disk/by-id/google-disk-1" in metadata["user-data"]
            links.update(d[0] for d in disks)
        assert len(links) == 8

    return pulumi.Output.all(*rows).apply(check)


def _assert(condition: bool) -> None:
    assert condition
