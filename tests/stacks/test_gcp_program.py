"""The GCP stack program under Pulumi's mocks (assertions inside returned ``.apply``)."""

from __future__ import annotations

import re
from dataclasses import replace
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
        # ssh, internal, and the deny-all pair under them (test_cloud_review3.py)
        assert len(mocks.of_type("gcp:compute/firewall:Firewall")) == 4
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
                # The cap is an absolute instant (a run-duration would count from each node's boot).
                assert "max_run_duration" not in scheduling
                if cap:
                    assert scheduling["termination_time"] == gcp.rfc3339(plan.expires)
                else:
                    assert "termination_time" not in scheduling
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
        project, family = gcp.default_image(plan)
        # The family, resolved to one concrete image (pinned after the first up).
        assert boot["initialize_params"]["image"] == (
            f"https://www.googleapis.com/compute/v1/projects/{project}/global/images/{family}-v20250101")
        assert "nvidia-580" in family
        assert boot["initialize_params"]["size"] == plan.disk_gb and boot["auto_delete"] is True
        assert metadata["ssh-keys"] == f"ubuntu:{plan.ssh_public_key}"
        assert metadata["enable-oslogin"] == "FALSE"  # OS Login would ignore ssh-keys
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


_NAME = re.compile(gcp.NAME_RULE)
_LABEL = re.compile(gcp.LABEL_RULE)


@pulumi.runtime.test
def test_names_and_labels_obey_gcp_rules(mocks: Recorder) -> Any:
    # Pulumi's mocks accept any name; GCP refuses upper case, dots, and more than 63 characters.
    plan = replace(_plan(nodes=2, disks=(DiskPlan(10, "/data"),)), pool="My.Pool_For-Training" * 3,
                   stack="my-pool-for-training-with-a-very-long-name-indeed-x-ab12cd34")
    declared = gcp.program(plan)

    def check(values: list[Any]) -> None:
        names, tags, labels, accounts, role = values
        for name in [*names, *tags]:
            assert _NAME.match(name), f"GCP refuses the name {name!r}"
        assert len(set(names)) == len(names)
        for key, value in labels.items():
            assert _LABEL.match(value), f"GCP refuses the label {key}={value!r}"
        for account in accounts:
            assert re.match(gcp.ACCOUNT_ID_RULE, account), account
        assert re.match(gcp.ROLE_ID_RULE, role)

    insts = list(declared.instances.values())
    disks = [d for ds in declared.disks.values() for d in ds]
    return pulumi.Output.all(
        pulumi.Output.all(*[i.name for i in insts], *[d.name for d in disks]),
        pulumi.Output.all(*[t for i in insts for t in [i.tags]]).apply(lambda ts: [t for tl in ts for t in tl]),
        insts[0].labels,
        pulumi.Output.all(*[a.account_id for a in declared.accounts.values()]),
        declared.role.role_id,
    ).apply(check)


@pulumi.runtime.test
def test_ipv6_clients_get_a_rule_of_their_own(mocks: Recorder) -> Any:
    # A firewall rule cannot mix address families.
    plan = replace(_plan(nodes=1), ssh_cidrs=(CLIENT, "2001:db8::/64"))
    declared = gcp.program(plan)

    def check(values: list[Any]) -> None:
        v4, v6 = values
        assert v4 == [CLIENT] and v6 == ["2001:db8::/64"]

    return pulumi.Output.all(declared.firewalls["ssh"].source_ranges,
                             declared.firewalls["ssh-v6"].source_ranges).apply(check)


@pulumi.runtime.test
def test_each_node_may_delete_itself_and_nothing_else(mocks: Recorder) -> Any:
    # A guest power-off only stops a GCP VM (its disks keep billing): the watchdog deletes the
    # instance through the node's own service account, which can do nothing else.
    plan = _plan(nodes=2, disks=(DiskPlan(10, "/data"),))
    declared = gcp.program(plan)

    def check(values: list[Any]) -> None:
        role_perms, role_name, rows = values
        assert sorted(role_perms) == sorted(gcp.SELF_DELETE_PERMISSIONS)
        assert all(p.startswith(("compute.instances.delete", "compute.instances.setDiskAutoDelete",
                                 "compute.disks.delete")) for p in role_perms)
        # Nothing is granted at project level: only on the node's own instance and disks.
        assert not [r for r in mocks.resources if "projects/iAM" in r.typ and "Member" in r.typ]
        assert not [r for r in mocks.resources if r.typ.startswith("gcp:projects/iAMMember")]
        for index, email, sa, inst_name, _grants, disk_names in rows:
            assert sa["email"] == email
            members = [g for g in mocks.resources if g.typ in (
                "gcp:compute/instanceIAMMember:InstanceIAMMember", "gcp:compute/diskIamMember:DiskIamMember")
                and g.inputs["member"] == f"serviceAccount:{email}"]
            targets = {(g.typ.rsplit(":", 1)[1], g.inputs.get("instanceName") or g.inputs.get("name")) for g in members}
            assert targets == {("InstanceIAMMember", inst_name), ("DiskIamMember", inst_name),
                               *{("DiskIamMember", d) for d in disk_names}}, (index, targets)
            assert all(g.inputs["role"] == role_name for g in members)

    rows = [pulumi.Output.all(i, declared.accounts[i].email, inst.service_account, inst.name,
                              pulumi.Output.all(*[g.id for g in declared.grants[i]]),
                              pulumi.Output.all(*[d.name for d in declared.disks[i]]))
            for i, inst in declared.instances.items()]
    return pulumi.Output.all(declared.role.permissions, declared.role.name, pulumi.Output.all(*rows)).apply(check)


@pulumi.runtime.test
def test_zone_is_a_real_candidate_and_retries_take_the_next(mocks: Recorder) -> Any:
    plan = replace(_plan(nodes=1), zone=None, region="us-east1",
                   settings={"zones": ["us-east1-b", "us-east1-c"], "zone_attempt": 1})
    declared = gcp.program(plan)
    return declared.instances[0].zone.apply(lambda z: _assert(z == "us-east1-c"))


def test_a_second_up_replaces_nothing_when_a_newer_image_appears() -> None:
    from skyward.stacks.cloudpool import CloudPool

    plan = replace(_plan(nodes=2, gpu=True, settings=T4), zone=None,
                   settings={**T4, "zones": ["us-central1-b", "us-central1-c"]})

    def run(plan: Any, mocks: Recorder) -> dict[str, Any]:
        out: dict[str, Any] = {}

        @pulumi.runtime.test
        def go() -> Any:
            declared = gcp.program(plan)
            return declared.image.apply(lambda image: out.update(placement={"image": image, "zone": declared.zone}))

        go()
        return out

    def inputs(mocks: Recorder) -> dict[str, Any]:
        return {r.name: (r.inputs["bootDisk"], r.inputs["zone"], r.inputs["metadata"].get("ssh-keys"),
                         r.inputs.get("scheduling"))
                for r in mocks.of_type("gcp:compute/instance:Instance")}

    first = fresh_mocks()
    outputs = run(plan, first)
    cloud = CloudPool.__new__(CloudPool)
    cloud.plan = plan
    CloudPool._pin(cloud, outputs)
    second = fresh_mocks()
    second.gcp_image_date = "20261101"
    run(cloud.plan, second)
    assert inputs(second) == inputs(first)
    assert not [c for c in second.calls if c.token.endswith("getImage")]
    third = fresh_mocks()
    third.gcp_image_date = "20261101"
    run(plan, third)
    assert inputs(third) != inputs(first)  # unpinned, it would have changed: the test can fail


@pulumi.runtime.test
def test_the_guest_agent_keeps_the_planned_host_key(mocks: Recorder) -> Any:
    # GCE's guest agent regenerates host keys at first boot (set_host_keys, on by default): the
    # node would then show a key the client refuses. cloud-init writes the agent's config in
    # its network stage, before network-online.target, which the agent waits for.
    plan = _plan(nodes=2)
    declared = gcp.program(plan)

    def check(rows: list[Any]) -> None:
        for metadata, node in zip(rows, plan.nodes, strict=True):
            doc = cloud_config(metadata["user-data"])
            config = [f for f in doc["write_files"] if f["path"] == "/etc/default/instance_configs.cfg"]
            assert len(config) == 1, doc["write_files"]
            lines = [ln.replace(" ", "") for ln in config[0]["content"].splitlines()]
            section = lines.index("[InstanceSetup]")
            assert "set_host_keys=false" in lines[section + 1:], lines
            assert doc["ssh_deletekeys"] is True and doc["ssh_genkeytypes"] == []
            assert doc["ssh_keys"]["ed25519_public"] == node.host_key

    return pulumi.Output.all(*[i.metadata for i in declared.instances.values()]).apply(check)
