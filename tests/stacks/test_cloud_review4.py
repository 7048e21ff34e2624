"""The fourth desk review's smaller GCP items: max_duration within Compute Engine's 120 days, the
zone retry matching the clouds' real sentences only, gVNIC on A3/A4, and multi-node TPU pools
allowed by address under the deny-all. Under Pulumi's mocks and the fake workspace."""

from __future__ import annotations

import json
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("pulumi_gcp")

from stackfakes import FakeWorkspace, Recorder, command_error, install_mocks, make_plan  # noqa: E402

import skyward as sky  # noqa: E402
from skyward.errors import ConfigError, StackError  # noqa: E402
from skyward.stacks import gcp, gcp_common, keys  # noqa: E402
from skyward.stacks.cloudpool import CloudPool  # noqa: E402

pytestmark = pytest.mark.usefixtures("home")

VM = "gcp:tpu/v2Vm:V2Vm"
TPU = {"project": "proj", "accelerator_type": "v5litepod-4",
       "tpu": {"runtime_version": "v2-alpha-tpuv5-lite", "hosts": 1}}


# -- max_duration: Compute Engine refuses a termination_time more than 120 days ahead ---------------
def test_gcp_max_duration_over_120_days_is_refused_where_given() -> None:
    with pytest.raises(ConfigError, match=r"121 days.*120 days.*10368000"):
        sky.GCP(project="p", max_duration=121 * 86400)
    assert sky.GCP(project="p", max_duration=120 * 86400).max_duration == 120 * 86400


# -- the zone retry: the clouds' sentences, not any "Unsupported" ----------------------------------------
def _pool(ws: FakeWorkspace) -> CloudPool:
    plan = make_plan(nodes=0, settings={"zones": ["z-1", "z-2", "z-3"]})
    key_path, _ = keys.client_key(plan.stack)
    return CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=False,
                     fallback_to_on_demand=False, record={"skyward": "0.1.0", "offer": {}},
                     secrets={"env": json.dumps({})}, plugins={}, connect=ws)


@pytest.mark.parametrize("stderr", [
    "error: 1 error occurred:\n  * Error creating instance: googleapi: Error 400: Unsupported field "
    "'scheduling.localSsdRecoveryTimeout' for this machine type, badRequest",
    "error: creating EC2 Instance: operation error EC2: RunInstances, api error Unsupported: The requested "
    "configuration is currently not supported. Please check the documentation for supported configurations.",
])
def test_an_unsupported_request_is_not_retried_in_another_zone(stderr: str) -> None:
    ws = FakeWorkspace(fail={"update": [command_error(stderr)]})
    with pytest.raises(StackError, match="Unsupported"):
        _pool(ws).start(1)
    assert [k for k, _ in ws.calls].count("update") == 1


@pytest.mark.parametrize("stderr", [
    "error: 1 error occurred:\n  * Error creating instance: googleapi: Error 400: Invalid value for field "
    "'resource.machineType': 'zones/us-central1-f/machineTypes/a3-highgpu-8g'. Machine type with name "
    "'a3-highgpu-8g' does not exist in zone 'us-central1-f'., invalid",
    "error: creating EC2 Instance: operation error EC2: RunInstances, api error Unsupported: Your requested "
    "instance type (p5.48xlarge) is not supported in your requested Availability Zone (us-east-1e).",
])
def test_a_zone_without_the_type_is_retried_in_the_next(stderr: str) -> None:
    ws = FakeWorkspace(fail={"update": [command_error(stderr)]})
    _pool(ws).start(1)
    assert [k for k, _ in ws.calls].count("update") == 2


# -- gVNIC on the machine series that support nothing else -------------------------------------------------
A3 = {"project": "proj", "machine_type": "a3-highgpu-8g", "accelerator_count": 8}


@pytest.mark.parametrize(("machine_type", "nic"), [("a3-highgpu-8g", "GVNIC"), ("a4-highgpu-8g", "GVNIC"),
                                                    ("n1-standard-4", None), ("g2-standard-4", None)])
def test_a3_and_a4_instances_get_a_gvnic(machine_type: str, nic: str | None) -> None:
    mocks = install_mocks(Recorder())
    plan = make_plan(nodes=1, region="us-central1", zone="us-central1-a", instance_type=machine_type,
                     settings={**A3, "machine_type": machine_type})

    @pulumi.runtime.test
    def run() -> Any:
        declared = gcp.program(plan)
        return pulumi.Output.all(*[i.network_interfaces for i in declared.instances.values()]).apply(check)

    def check(rows: list[Any]) -> None:
        assert len(mocks.of_type("gcp:compute/instance:Instance")) == 1
        for interfaces in rows:
            assert interfaces[0].get("nic_type", interfaces[0].get("nicType")) == nic

    run()


# -- multi-node TPU pools: the nodes by address as well as by tag ----------------------------------------
class TpuRecorder(Recorder):
    def new_resource(self, args: Any) -> tuple[str, dict[str, Any]]:
        rid, out = super().new_resource(args)
        if args.typ == VM:
            n = len(self.of_type(VM))
            out["networkEndpoints"] = [{"ipAddress": f"10.130.0.{n}", "accessConfigs": [{"externalIp": f"203.0.113.{n}"}]}]
        return rid, out


@pytest.mark.parametrize("nodes", [1, 3])
def test_a_multi_node_tpu_pool_allows_its_nodes_by_address_above_the_deny_all(nodes: int) -> None:
    mocks = install_mocks(TpuRecorder())
    plan = make_plan(nodes=nodes, region="us-central1", zone="us-central1-a", instance_type="tpu-v5litepod-4",
                     settings=TPU)
    tag = gcp.network_tag(plan)

    @pulumi.runtime.test
    def run() -> Any:
        declared = gcp.program(plan)
        rule = declared.firewalls.get("internal-addresses")
        if nodes == 1:
            assert rule is None
            return None
        return pulumi.Output.all(rule.source_ranges, rule.source_tags, rule.target_tags, rule.priority,
                                 rule.allows, declared.firewalls["deny-all"].priority).apply(check)

    def check(values: list[Any]) -> None:
        ranges, sources, targets, priority, allows, deny = values
        assert sorted(ranges) == [f"10.130.0.{n}/32" for n in range(1, nodes + 1)]
        assert sources == [tag] and targets == [tag]  # never a rule without sources (= everywhere)
        assert priority == gcp_common.ALLOW_PRIORITY < deny and allows == [{"protocol": "all"}]
        assert len(mocks.of_type(VM)) == nodes

    run()
