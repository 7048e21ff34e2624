"""A Cloud TPU pool's stack: one TPU VM per node, under Pulumi's mocks (assertions inside the
returned ``.apply``, run by ``@pulumi.runtime.test``)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("pulumi_gcp")

from stackfakes import CLIENT, Recorder, cloud_config, install_mocks, make_plan  # noqa: E402

from skyward.stacks import gcp, gcp_tpu  # noqa: E402
from skyward.stacks.plan import DiskPlan  # noqa: E402

VM = "gcp:tpu/v2Vm:V2Vm"
V5E = {"project": "proj", "accelerator_type": "v5litepod-4",
       "tpu": {"runtime_version": "v2-alpha-tpuv5-lite", "hosts": 1}}


class TpuRecorder(Recorder):
    """The shared mocks, plus what the TPU API answers for a VM: its workers' endpoints."""

    def new_resource(self, args: Any) -> tuple[str, dict[str, Any]]:
        rid, out = super().new_resource(args)
        if args.typ == VM:
            n = len(self.of_type(VM))
            out["networkEndpoints"] = [{"ipAddress": f"10.130.0.{n}", "port": 8470,
                                        "accessConfigs": [{"externalIp": f"203.0.113.{100 + n}"}]}]
        return rid, out


@pytest.fixture
def mocks() -> TpuRecorder:
    return install_mocks(TpuRecorder())


def _plan(**kw: Any) -> Any:
    kw.setdefault("region", "us-central1")
    kw.setdefault("zone", "us-central1-a")
    kw.setdefault("instance_type", "tpu-v5litepod-4")
    kw.setdefault("settings", V5E)
    return make_plan(**kw)


@pulumi.runtime.test
def test_each_node_is_a_tpu_vm_of_the_offers_type_and_runtime(mocks: TpuRecorder) -> Any:
    plan = _plan(nodes=2)
    declared = gcp.program(plan)  # the GCP program hands TPU plans to the TPU program
    assert isinstance(declared, gcp_tpu.Declared)
    vms = list(declared.vms.values())

    def check(values: list[Any]) -> None:
        assert len(mocks.of_type(VM)) == 2
        assert mocks.of_type("gcp:compute/instance:Instance") == []  # no Compute Engine instance
        for i, (kind, runtime, zone, tags, labels, metadata, name, network) in enumerate(values):
            assert (kind, runtime, zone) == ("v5litepod-4", "v2-alpha-tpuv5-lite", "us-central1-a")
            assert tags == [gcp.network_tag(plan)]
            assert labels["skyward-pool"] == "train" and labels["skyward-node"] == str(i)
            assert metadata["ssh-keys"] == f"ubuntu:{plan.ssh_public_key}"
            assert metadata["block-project-ssh-keys"] == "true" and metadata["enable-oslogin"] == "FALSE"
            assert cloud_config(metadata["user-data"])["ssh_keys"]["ed25519_public"] == plan.nodes[i].host_key
            # The watchdog also as startup-script (the guest agent runs it on TPU runtime images),
            # the TPU one (retries its delete for ever), deleting this node's TPU node.
            startup = metadata["startup-script"]
            assert startup.startswith("#!/bin/bash") and "tpu=1" in startup and repr(["us-central1-a", name]) in startup
            assert plan.nodes[i].host_key_private not in startup
            assert name == gcp.instance_name(plan, plan.nodes[i])
            assert network["network"] == "default" and network["enable_external_ips"] is True

    return pulumi.Output.all(*[pulumi.Output.all(
        vm.accelerator_type, vm.runtime_version, vm.zone, vm.tags, vm.labels, vm.metadata, vm.name,
        vm.network_config) for vm in vms]).apply(check)


@pulumi.runtime.test
def test_firewall_lets_ssh_in_from_the_client_and_the_nodes_talk(mocks: TpuRecorder) -> Any:
    plan = _plan(nodes=1)
    declared = gcp.program(plan)
    ssh, internal = declared.firewalls["ssh"], declared.firewalls["internal"]
    tag = gcp.network_tag(plan)

    def check(values: list[Any]) -> None:
        ssh_allows, ssh_ranges, ssh_targets, in_sources, in_targets = values
        assert ssh_allows == [{"protocol": "tcp", "ports": ["22"]}]
        assert ssh_ranges == [CLIENT] and ssh_targets == [tag]
        assert in_sources == [tag] and in_targets == [tag]

    return pulumi.Output.all(ssh.allows, ssh.source_ranges, ssh.target_tags,
                             internal.source_tags, internal.target_tags).apply(check)


@pytest.mark.parametrize(
    ("kind", "spot", "expected"),
    [("v5litepod-4", True, {"spot": True}), ("v6e-8", True, {"spot": True}), ("v5p-8", True, {"spot": True}),
     ("v3-8", True, {"preemptible": True}), ("v2-8", True, {"preemptible": True}),
     ("v5litepod-4", False, None), ("v4-8", False, None)],
)
def test_spot_where_asked_preemptible_for_older_generations(mocks: TpuRecorder, kind: str, spot: bool,
                                                            expected: dict[str, bool] | None) -> None:
    plan = _plan(nodes=1, spot=spot, instance_type=f"tpu-{kind}", settings={"accelerator_type": kind})

    @pulumi.runtime.test
    def run() -> Any:
        vm = gcp.program(plan).vms[0]

        def check(values: list[Any]) -> None:
            scheduling, runtime = values
            assert (scheduling or None) == expected
            assert runtime == gcp_tpu.RUNTIMES[kind.rsplit("-", 1)[0]]

        return pulumi.Output.all(vm.scheduling_config, vm.runtime_version).apply(check)

    run()


@pulumi.runtime.test
def test_nodes_output_is_each_vms_first_endpoint(mocks: TpuRecorder) -> Any:
    declared = gcp.program(_plan(nodes=2))
    vms = declared.vms

    def check(values: list[Any]) -> None:
        # Each VM's own pair (the mocks number the VMs in the order pulumi registers them, which
        # the per-VM accounts the program declares first may change).
        assert sorted(tuple(v) for v in values) == [("203.0.113.101", "10.130.0.1"), ("203.0.113.102", "10.130.0.2")]

    return pulumi.Output.all(*[pulumi.Output.all(
        vm.network_endpoints.apply(lambda e: gcp_tpu.endpoint(e, public=True)),
        vm.network_endpoints.apply(lambda e: gcp_tpu.endpoint(e, public=False))) for vm in vms.values()]).apply(check)


def test_endpoint_reads_output_objects_and_dicts_and_nothing() -> None:
    class Config:
        external_ip = "203.0.113.9"

    class Endpoint:
        ip_address = "10.0.0.9"
        access_configs = [Config()]

    assert gcp_tpu.endpoint([Endpoint()], public=True) == "203.0.113.9"
    assert gcp_tpu.endpoint([{"ipAddress": "10.0.0.8", "accessConfigs": []}], public=False) == "10.0.0.8"
    assert gcp_tpu.endpoint([{"ipAddress": "10.0.0.8", "accessConfigs": []}], public=True) is None
    assert gcp_tpu.endpoint(None, public=True) is None


def test_a_tpu_plan_with_disks_or_several_hosts_is_refused_before_anything_is_declared(mocks: TpuRecorder) -> None:
    with pytest.raises(ValueError, match=r"sky\.Disk volumes are not supported on TPU VMs"):
        gcp.program(_plan(disks=(DiskPlan(10, "/data"),)))
    with pytest.raises(ValueError, match="spans 8 hosts"):
        gcp.program(_plan(settings={"accelerator_type": "v4-64", "tpu": {"hosts": 8}}, instance_type="tpu-v4-64"))
    assert mocks.resources == []


def test_a_gpu_plan_is_not_a_tpu_plan() -> None:
    assert not gcp_tpu.is_tpu(make_plan(instance_type="g2-standard-4", settings={"accelerator_type": "nvidia-l4"}))
    assert gcp_tpu.is_tpu(make_plan(instance_type="tpu-v6e-1"))
    assert gcp_tpu.accelerator_type(make_plan(instance_type="tpu-v6e-1")) == "v6e-1"


def test_every_catalogue_tpu_row_has_a_runtime_and_a_real_type_name() -> None:
    from skyward.catalogue import load

    rows = [o for o in load("gcp") if o.extra.get("tpu")]
    assert {o.accelerator for o in rows} == {"TPUv2", "TPUv3", "TPUv4", "TPUv5e", "TPUv5p", "TPUv6"}
    for offer in rows:
        kind = offer.extra["accelerator_type"]
        assert re.fullmatch(r"(v2|v3|v4|v5litepod|v5p|v6e)-\d+", kind), kind
        assert offer.instance_type == f"tpu-{kind}"
        assert int(kind.rsplit("-", 1)[1]) == offer.accelerator_count  # count = the slice size
        plan = replace(make_plan(instance_type=offer.instance_type),
                       settings={"accelerator_type": kind, "tpu": offer.extra["tpu"]})
        assert gcp_tpu.runtime_version(plan) == offer.extra["tpu"]["runtime_version"] == gcp_tpu.RUNTIMES[kind.rsplit("-", 1)[0]]
        for region, zones in offer.extra["zones"].items():
            assert all(z.rsplit("-", 1)[0] == region for z in zones), (offer.instance_type, zones)


def test_preview_of_a_tpu_pool_lists_its_tpu_vms_creating_nothing() -> None:
    import skyward as sky

    spec = sky.Spec(provider=sky.GCP(project="proj"), accelerator=sky.accelerators.TPUv5e_4(),
                    region="us-central1", nodes=2, allocation="spot")
    plan = spec.provider.preview(spec)
    assert plan["offer"]["instance_type"] == "tpu-v5litepod-4" and plan["offer"]["market"] == "spot"
    vms = [r for r in plan["resources"] if r["type"] == VM]
    assert [r["name"] for r in vms] == ["node-0", "node-1"]
    assert vms[0]["detail"] == ("TPU VM v5litepod-4, spot, runtime v2-alpha-tpuv5-lite, in us-central1-a, "
                                "deletes its TPU node when its TTL runs out (its own service account); "
                                "TPU API path (not a Compute Engine instance, no termination_time): its cost is "
                                "bounded by its own watchdog, which retries the delete until accepted and never "
                                "powers off, and by `skyward down`")
    assert not any(r["type"] == "gcp:compute/instance:Instance" for r in plan["resources"])
    on_demand = spec.provider.preview(replace(spec, allocation="on-demand", nodes=1))
    (vm,) = [r for r in on_demand["resources"] if r["type"] == VM]
    assert ", on-demand," in vm["detail"]
