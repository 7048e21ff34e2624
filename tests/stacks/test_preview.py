"""Preview of a cloud pool: the real stack program under Pulumi's mocks, run by production code
(stacks/preview.py), with no engine, no CLI, no credentials -- and no mocks left behind."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")
pytest.importorskip("pulumi_aws")
pytest.importorskip("pulumi_gcp")

from stackfakes import Recorder, fresh_mocks, make_plan  # noqa: E402

import skyward as sky  # noqa: E402
from skyward.errors import PulumiNotFoundError  # noqa: E402
from skyward.stacks import aws  # noqa: E402
from skyward.stacks.preview import THIS_MACHINE  # noqa: E402

INSTANCE = "aws:ec2/instance:Instance"


pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def _of(out: dict[str, Any], typ: str) -> list[dict[str, str]]:
    return [r for r in out["resources"] if r["type"] == typ]


def test_aws_preview_lists_every_resource_with_its_detail_and_the_offer_price(home: Path) -> None:
    spec = sky.Spec(provider=sky.AWS(allow_ssh_from=["10.1.0.0/16"]), nodes=2, accelerator="A10G",
                    allocation="spot", volumes=[sky.Disk(200, mount="/data")])
    out = spec.provider.preview(spec)

    instances = _of(out, INSTANCE)
    assert [r["name"] for r in instances] == ["node-0", "node-1"]
    assert all("spot (one-time, terminate on interruption)" in r["detail"] for r in instances), instances
    assert all("terminated when it shuts down" in r["detail"] and "Deep Learning" in r["detail"] for r in instances)
    (group,) = _of(out, "aws:ec2/securityGroup:SecurityGroup")
    ingress = group["detail"].split(". out:")[0]
    assert ingress == (f"in: tcp 22 from {THIS_MACHINE}, 10.1.0.0/16; all traffic from the group's own members")
    assert "0.0.0.0/0" not in ingress
    assert all("disk /dev/sdf 200 GB gp3" in r["detail"] and "(its disks deleted with it)" in r["detail"]
               and "IMDSv2 only" in r["detail"] for r in instances), instances
    assert len(_of(out, "aws:ec2/keyPair:KeyPair")) == 1

    offer = spec.provider.offer(spec)
    assert out["offer"]["instance_type"] == offer.instance_type
    assert out["offer"]["hourly_cost_per_node"] == offer.price("spot") == spec.provider.hourly_cost(spec)
    assert out["offer"]["market"] == "spot"
    # No key, no stack, no passphrase: nothing was written (the home itself may exist, empty and
    # 0700: skyward makes it private wherever its path is first asked for).
    assert not home.exists() or [p for p in home.rglob("*") if not p.is_dir()] == []


def test_aws_on_demand_cpu_preview_has_no_spot_and_no_volumes() -> None:
    spec = sky.Spec(provider=sky.AWS(detect_address=False, allow_ssh_from=["203.0.113.9/32"]), nodes=1,
                    allocation="on-demand")
    out = spec.provider.preview(spec)
    (inst,) = _of(out, INSTANCE)
    assert ", on-demand," in inst["detail"] and "spot" not in inst["detail"]
    assert "ubuntu-noble-24.04" in inst["detail"]
    assert not _of(out, "aws:ebs/volume:Volume")
    (group,) = _of(out, "aws:ec2/securityGroup:SecurityGroup")
    assert "tcp 22 from 203.0.113.9/32;" in group["detail"] and THIS_MACHINE not in group["detail"]


def test_gcp_preview_shows_firewalls_market_accelerators_and_the_run_cap() -> None:
    spec = sky.Spec(provider=sky.GCP(project="p", max_duration=3600, allow_ssh_from=["10.2.0.0/16"]),
                    nodes=2, accelerator="T4", allocation="spot", volumes=[sky.Disk(50, mount="/d")])
    out = spec.provider.preview(spec)
    ssh, internal = (next(r for r in out["resources"] if r["name"] == n) for n in ("ssh", "internal"))
    assert ssh["detail"].startswith(f"ingress: tcp 22 from {THIS_MACHINE}, 10.2.0.0/16 to tag sky-")
    assert internal["detail"].startswith("ingress: all from tag sky-")
    instances = _of(out, "gcp:compute/instance:Instance")
    assert len(instances) == 2
    for r in instances:
        assert ", spot," in r["detail"] and "deleted when preempted and at 20" in r["detail"], r
        assert "deletes itself when its TTL runs out" in r["detail"]
        assert "nvidia-tesla-t4" in r["detail"] or "T4" in r["detail"].upper(), r
    assert [r["detail"].split(" in ")[0] for r in _of(out, "gcp:compute/disk:Disk")] == ["50 GB pd-balanced"] * 2


def _view_from_a_new_thread() -> dict[str, Any]:
    from pulumi.runtime.settings import SETTINGS

    seen: dict[str, Any] = {}
    t = threading.Thread(target=lambda: seen.update(
        monitor=SETTINGS.monitor, dry_run=SETTINGS.dry_run, stack=SETTINGS.stack, project=SETTINGS.project))
    t.start()
    t.join()
    return seen


def test_preview_leaves_no_mocks_behind_in_this_or_other_threads() -> None:
    """pulumi's ContextProperty makes a first value set in a fresh context the default of every
    other thread; preview must put the defaults back (else a later `up` thread sees its mocks)."""
    from pulumi.runtime import settings

    here = (settings.SETTINGS.monitor, settings.SETTINGS.dry_run, settings.SETTINGS.stack, settings.get_root_resource())
    elsewhere = _view_from_a_new_thread()
    spec = sky.Spec(provider=sky.AWS(detect_address=False, allow_ssh_from=["10.0.0.0/8"]), nodes=1)
    spec.provider.preview(spec)
    assert (settings.SETTINGS.monitor, settings.SETTINGS.dry_run, settings.SETTINGS.stack,
            settings.get_root_resource()) == here
    assert _view_from_a_new_thread() == elsewhere


@pulumi.runtime.test
def test_a_programs_own_mocks_still_work_after_a_preview() -> Any:
    spec = sky.Spec(provider=sky.AWS(detect_address=False, allow_ssh_from=["10.0.0.0/8"]), nodes=1)
    spec.provider.preview(spec)
    recorder: Recorder = fresh_mocks()
    declared = aws.program(make_plan(nodes=3))

    def check(_: Any) -> None:
        assert len(recorder.of_type(INSTANCE)) == 3

    return pulumi.Output.all(*[i.id for i in declared.instances.values()]).apply(check)


def test_without_the_sdk_preview_says_what_it_would_need(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pulumi_aws" else real(name, *a))
    spec = sky.Spec(provider=sky.AWS(), nodes=2, accelerator="A100")
    with pytest.raises(PulumiNotFoundError) as info:
        spec.provider.preview(spec)
    text = str(info.value)
    assert "pip install 'skyward[aws]'" in text and "pulumi_aws" in text
    assert "A100" in text and "/h for 2 node(s)" in text  # it still says what it would be and cost


# -- pools of thousands: the program runs on a sample of nodes (stacks/preview.py) -----------------
def _mixed(plan: Any, count: int) -> Any:
    """``plan`` with ``count`` nodes, spot and on-demand in turn, one shared throwaway host key."""
    from dataclasses import replace

    node = plan.nodes[0]
    return plan.with_nodes(tuple(replace(node, index=i, spot=i % 3 == 0) for i in range(count)))


def _counting(program: Any) -> tuple[Any, list[int]]:
    """``program``, noting how many nodes each run declared."""
    runs: list[int] = []

    def counted(plan: Any) -> Any:
        runs.append(len(plan.nodes))
        return program(plan)

    return counted, runs


def _both_ways(program: Any, plan: Any) -> tuple[list[dict[str, str]], list[dict[str, str]], list[int]]:
    from skyward.stacks.preview import resources

    counted, runs = _counting(program)
    sampled = resources(counted, plan, full_run_nodes=0)
    full = resources(program, plan, full_run_nodes=10**6)
    return sampled, full, runs


def test_a_large_aws_plan_previews_from_a_sample_line_for_line_as_a_full_run() -> None:
    from dataclasses import replace

    from skyward.stacks.plan import BucketPlan, DiskPlan

    plan = replace(make_plan(nodes=1, gpu=True, disks=(DiskPlan(200, "/data"), DiskPlan(50, "/scratch", "io2", 3000))),
                   buckets=(BucketPlan("corpus", "train", True),))
    plan = _mixed(plan, 125)  # indices of one, two and three digits
    sampled, full, runs = _both_ways(aws.program, plan)
    assert sampled == full
    assert len([r for r in full if r["type"] == INSTANCE]) == 125
    assert runs == [10 + 2 * 2 + 2 * 2]  # nodes 0-9 and two stand-ins per kind (spot or not) and width


def test_large_gcp_and_tpu_plans_preview_from_a_sample_as_a_full_run() -> None:
    from dataclasses import replace

    from skyward.stacks import gcp
    from skyward.stacks.plan import BucketPlan, DiskPlan

    plan = replace(make_plan(nodes=1, region="us-central1", zone="us-central1-b", instance_type="e2-standard-4",
                             disks=(DiskPlan(50, "/d"),), expires_in=3600, settings={"project": "p"}),
                   buckets=(BucketPlan("corpus", "", False),))
    sampled, full, runs = _both_ways(gcp.program, _mixed(plan, 104))
    assert sampled == full and len(runs) == 1
    names = [r["name"] for r in full]
    assert "node-103-disk-0-self-delete" in names and "node-103-bucket-0" in names
    assert not any("object at 0x" in r["detail"] for r in full)  # unknowns read as such
    assert any("(known after up) on instance sky-train-ab12cd34-103 only" in r["detail"] for r in full)

    tpu = make_plan(nodes=1, region="us-central1", zone="us-central1-a", instance_type="tpu-v5litepod-4",
                    settings={"project": "proj", "accelerator_type": "v5litepod-4",
                              "tpu": {"runtime_version": "v2-alpha-tpuv5-lite", "hosts": 1}})
    sampled, full, runs = _both_ways(gcp.program, _mixed(tpu, 23))
    assert sampled == full and len([r for r in full if r["type"] == "gcp:tpu/v2Vm:V2Vm"]) == 23
    # Which TPU path the pool takes and what bounds its cost (no termination_time on the TPU API).
    for r in (r for r in full if r["type"] == "gcp:tpu/v2Vm:V2Vm"):
        assert "TPU API path (not a Compute Engine instance, no termination_time)" in r["detail"], r
        assert "retries the delete until accepted and never powers off" in r["detail"], r


def test_a_program_whose_lines_follow_the_index_another_way_runs_on_every_node_of_that_kind() -> None:
    """The stand-ins' check: odd nodes differ from even ones, so 99 and 88 disagree and the
    kind's real nodes run; the result is still the full run's."""

    def program(plan: Any) -> Any:
        import pulumi_aws

        provider = pulumi_aws.Provider("aws", region=plan.region)
        for node in plan.nodes:
            pulumi_aws.ec2.Instance(node.name, ami="ami-1", instance_type="m7i.large" if node.index % 2 else "m7i.xlarge",
                                    opts=pulumi.ResourceOptions(provider=provider))

    plan = _mixed(make_plan(nodes=1), 40)
    sampled, full, runs = _both_ways(program, plan)
    assert sampled == full
    # nodes 0-9 and 2 kinds x 2 stand-ins; other stand-ins twice; then the 30 real nodes of both kinds
    assert runs == [10 + 4, 4, 4, 30]


def test_a_5000_node_preview_lists_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from skyward.stacks import preview

    real, runs = preview.declared, []

    def counted(program: Any, plan: Any) -> Any:
        runs.append(len(plan.nodes))
        return real(program, plan)

    monkeypatch.setattr(preview, "declared", counted)
    spec = sky.Spec(provider=sky.AWS(detect_address=False, allow_ssh_from=["10.0.0.0/8"]), nodes=5000,
                    allocation="spot")
    out = spec.provider.preview(spec)
    # 99 also occurs in Canonical's account id (099720109477), on every line: the 2-digit kind
    # is tried again with other stand-ins, not run on its 90 real nodes.
    assert runs == [10 + 3 * 2, 2], runs
    instances = _of(out, INSTANCE)
    assert [r["name"] for r in instances] == [f"node-{i}" for i in range(5000)]
    assert len({r["detail"] for r in instances}) == 1 and "spot (one-time" in instances[0]["detail"]
    assert out["hourly_cost"] == round(out["hourly_cost_per_node"] * 5000, 4)


@pytest.mark.timeout(60)
def test_a_preview_after_a_program_that_failed_inside_an_apply_does_not_wait_for_it() -> None:
    """Pulumi keeps unfinished outputs in process-wide defaults: a program that raised inside an
    apply left its resources' outputs there, bound to a loop that is gone, and the next preview
    waited for them forever."""
    from dataclasses import replace

    from skyward.stacks import gcp
    from skyward.stacks.plan import BucketPlan

    mocks = fresh_mocks()
    mocks.gcs_uniform = {"data": False}  # a prefix grant on an ACL bucket: refused inside an apply
    plan = replace(make_plan(instance_type="e2-standard-4", zone="us-central1-b", settings={"project": "proj"}),
                   buckets=(BucketPlan("data", "v1"),))

    @pulumi.runtime.test
    def failing() -> Any:
        declared = gcp.program(plan)
        return pulumi.Output.all(*[g.id for g in declared.grants[0]])

    with pytest.raises(Exception, match="uniform bucket-level access"):
        failing()
    spec = sky.Spec(provider=sky.AWS(), nodes=1, vcpus=2)
    assert _of(spec.provider.preview(spec), INSTANCE)
