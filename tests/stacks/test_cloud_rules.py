"""The providers' own rules that Pulumi's mocks do not run: what a real account would
refuse, replace or keep billing. Each test names the rule it encodes; the sources are in
stacks/disks.py, stacks/aws.py, stacks/gcp.py and docs/guides/clouds.md."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")

from stackfakes import CLIENT, Recorder, cloud_config, fresh_mocks, make_plan  # noqa: E402

import skyward as sky  # noqa: E402
from skyward.catalogue import load  # noqa: E402
from skyward.errors import ConfigError  # noqa: E402
from skyward.stacks import aws, gcp, userdata  # noqa: E402
from skyward.stacks.plan import DiskPlan  # noqa: E402


def _aws() -> Any:
    return sky.AWS(detect_address=False, allow_ssh_from=[CLIENT])


def _gcp() -> Any:
    return sky.GCP(project="proj", detect_address=False, allow_ssh_from=[CLIENT])


def _offer(provider: str, instance_type: str) -> Any:
    return next(o for o in load(provider) if o.instance_type == instance_type)


# -- item 5: a newer template never replaces (or stops) a running AWS node ------------------------
def test_a_changed_user_data_template_replaces_no_running_aws_node(monkeypatch: pytest.MonkeyPatch) -> None:
    # EC2 changes user data only on a stopped instance: the provider stops and starts a running
    # one to update it, and with user_data_replace_on_change it destroys and recreates it. A pool
    # woken, resized or healed by a newer skyward renders other user data for the same nodes.
    import pulumi_aws

    real = pulumi_aws.ec2.Instance
    options: list[dict[str, Any]] = []

    def spy(name: str, **kwargs: Any) -> Any:
        options.append(kwargs)
        return real(name, **kwargs)

    monkeypatch.setattr(pulumi_aws.ec2, "Instance", spy)
    plan = make_plan(nodes=2)

    def inputs() -> list[dict[str, Any]]:
        mocks = fresh_mocks()

        @pulumi.runtime.test
        def go() -> Any:
            declared = aws.program(plan)
            return pulumi.Output.all(*[i.id for i in declared.instances.values()])

        go()
        return [dict(r.inputs) for r in mocks.of_type("aws:ec2/instance:Instance")]

    before = inputs()
    monkeypatch.setattr(userdata, "_WATCHDOG", userdata._WATCHDOG + "# a newer skyward\n")
    after = inputs()
    changed = {k for b, a in zip(before, after, strict=True) for k in b if b[k] != a.get(k)}
    assert changed == {"userData"}  # the template change reaches the program...
    for kwargs in options:  # ...and neither replaces nor updates a running instance
        assert not kwargs.get("user_data_replace_on_change")
        assert "userData" in kwargs["opts"].ignore_changes


# -- item 9: sky.Disk is checked per cloud before anything is created -----------------------------
@pytest.mark.parametrize("disk,match", [
    (sky.Disk(100, type="io2"), r"io2.*no iops.*iops="),
    (sky.Disk(100, type="st1"), r"at least 125 GiB"),
    (sky.Disk(100, type="pd-ssd"), r"not an EBS volume type \(that is a GCP disk type\)"),
    (sky.Disk(100, type="gp3", iops=3000), None),
])
def test_aws_disks_are_checked_before_anything_exists(disk: Any, match: str | None) -> None:
    spec = sky.Spec(provider=_aws(), volumes=[disk])
    offer = _aws().offer(spec)
    if match is None:
        _aws()._stack_args(spec, offer)
        return
    with pytest.raises(ConfigError, match=match):
        _aws().preview(spec)


def test_a_twelfth_aws_disk_is_a_clear_error_not_an_index_error() -> None:
    spec = sky.Spec(provider=_aws(), volumes=[sky.Disk(10, mount=f"/d{j}") for j in range(12)])
    with pytest.raises(ConfigError, match=r"12 sky.Disk volumes.*at most 11"):
        _aws().preview(spec)
    with pytest.raises(ConfigError, match=r"at most 11"):  # a plan reopened from a record, too
        aws.program(make_plan(disks=tuple(DiskPlan(10, f"/d{j}") for j in range(12))))


@pytest.mark.parametrize("disk,match", [
    (sky.Disk(5), r"at least 10 GB"),
    (sky.Disk(100, type="gp3"), r"not a Compute Engine disk type \(that is an AWS EBS type\)"),
    (sky.Disk(100, type="hyperdisk-balanced"), r"N1 series takes no Hyperdisk"),
])
def test_gcp_disks_are_checked_before_anything_exists(disk: Any, match: str) -> None:
    spec = sky.Spec(provider=_gcp(), accelerator="T4", volumes=[disk])
    with pytest.raises(ConfigError, match=match):
        _gcp().preview(spec)


# -- item 2: Hyperdisk-only machine series --------------------------------------------------------
@pytest.mark.parametrize("machine", ["a3-ultragpu-8g", "a4-highgpu-8g"])
def test_hyperdisk_only_series_boot_and_mount_hyperdisk(machine: str) -> None:
    mocks = fresh_mocks()
    plan = make_plan(gpu=True, instance_type=machine, region="us-central1", zone="us-central1-b",
                     disks=(DiskPlan(200, "/data"),), settings={"project": "proj", "machine_type": machine})

    @pulumi.runtime.test
    def go() -> Any:
        declared = gcp.program(plan)
        return pulumi.Output.all(*[i.id for i in declared.instances.values()])

    go()
    inst = mocks.of_type("gcp:compute/instance:Instance")[0].inputs
    assert inst["bootDisk"]["initializeParams"]["type"] == "hyperdisk-balanced"
    assert [d.inputs["type"] for d in mocks.of_type("gcp:compute/disk:Disk")] == ["hyperdisk-balanced"]


def test_a_persistent_disk_on_a_hyperdisk_only_series_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"A3 series takes Hyperdisk only.*hyperdisk-balanced"):
        gcp.program(make_plan(gpu=True, instance_type="a3-ultragpu-8g", zone="us-central1-b",
                              disks=(DiskPlan(200, "/data", "pd-ssd"),), settings={"machine_type": "a3-ultragpu-8g"}))


def test_older_series_keep_pd_balanced() -> None:
    mocks = fresh_mocks()
    plan = make_plan(instance_type="e2-standard-4", zone="us-central1-b", disks=(DiskPlan(20, "/data"),))

    @pulumi.runtime.test
    def go() -> Any:
        return gcp.program(plan).instances[0].id

    go()
    assert mocks.of_type("gcp:compute/instance:Instance")[0].inputs["bootDisk"]["initializeParams"]["type"] \
        == "pd-balanced"
    assert mocks.of_type("gcp:compute/disk:Disk")[0].inputs["type"] == "pd-balanced"


_ = (Recorder, cloud_config)


# -- item 3: consumption models that exist ----------------------------------------------------------
@pytest.mark.parametrize("accelerator,machine", [("H200:8", "a3-ultragpu-8g"), ("B200:8", "a4-highgpu-8g"),
                                                 ("H100:8", "a3-megagpu-8g")])
def test_gcp_machines_not_sold_on_demand_are_refused_with_how_they_are_bought(accelerator: str, machine: str) -> None:
    # A3 Mega, A3 Ultra and A4 are sold through reservations, Flex-start and Spot (Google's
    # consumption options), not on demand: a STANDARD insert with no reservation ends in "no
    # capacity" in every zone. The catalogue has no spot price for them, so no offer.
    from skyward.errors import NoOfferError

    assert all(o.on_demand is None for o in load("gcp") if o.instance_type == machine)
    if machine == "a3-megagpu-8g":  # A3 High (a3-highgpu-8g) is still sold on demand
        assert _gcp().offer(sky.Spec(provider=_gcp(), accelerator=accelerator)).instance_type == "a3-highgpu-8g"
        return
    with pytest.raises(NoOfferError, match=rf"{machine}.*reservation.*Flex-start.*Spot.*not on demand"):
        _gcp().offer(sky.Spec(provider=_gcp(), accelerator=accelerator))


@pytest.mark.parametrize("accelerator,instance_type", [("H200:8", "p5e.48xlarge"), ("trn2:16", "trn2.48xlarge")])
def test_aws_types_sold_only_as_capacity_blocks_are_refused_with_how_they_are_bought(
        accelerator: str, instance_type: str) -> None:
    # p5e.48xlarge and trn2.48xlarge are sold through EC2 Capacity Blocks for ML (AWS's Capacity
    # Blocks guide lists both in us-east-2; no on-demand or spot price is published for them): a
    # plain RunInstances has nothing to buy. No offer, and the error says how they are bought.
    from skyward.errors import NoOfferError

    assert all(o.on_demand is None and o.spot is None for o in load("aws") if o.instance_type == instance_type)
    assert instance_type not in {o.instance_type for o in sky.offers(accelerator, provider=_aws())}
    by_type = sky.AWS(region="us-east-2", instance_type=instance_type, detect_address=False, allow_ssh_from=[CLIENT])
    for provider, spec in ((by_type, sky.Spec(provider=by_type)),
                           (_aws(), sky.Spec(provider=_aws(), accelerator=accelerator, region="us-east-2"))):
        if accelerator == "H200:8" and provider is not by_type:  # p5en.48xlarge is sold on demand
            assert provider.offer(spec).instance_type == "p5en.48xlarge"
            assert provider.preview(spec)["offer"]["instance_type"] == "p5en.48xlarge"
            continue
        for call in (provider.offer, provider.preview):
            with pytest.raises(NoOfferError, match=rf"{instance_type}.*Capacity Blocks for ML, not on demand.*"
                                                   rf"describe-capacity-block-offerings.*sky\.SSH.*another instance type"):
                call(spec)


def test_aws_types_sold_on_demand_besides_capacity_blocks_are_offered() -> None:
    # p5en.48xlarge and p6-b200.48xlarge have on-demand prices (AWS's price list, as
    # instances.vantage.sh shows it) besides their Capacity Blocks: offered, on demand.
    for accelerator, region, instance_type in (("H200:8", "us-west-2", "p5en.48xlarge"),
                                               ("B200:8", "us-east-1", "p6-b200.48xlarge")):
        spec = sky.Spec(provider=_aws(), accelerator=accelerator, region=region)
        offer = _aws().offer(spec)
        assert (offer.instance_type, offer.market("spot-if-available")) == (instance_type, "on-demand")


def test_the_preview_says_a_spot_nodes_disks_go_with_it() -> None:
    spec = sky.Spec(provider=_gcp(), accelerator="T4", allocation="spot", volumes=[sky.Disk(200, mount="/data")])
    rows = {r["name"]: r["detail"] for r in _gcp().preview(spec)["resources"]}
    assert rows["node-0-disk-0"] == "200 GB pd-balanced in us-central1-a"
    assert "deleted when preempted" in rows["node-0"]
    assert "its 1 disk marked auto-delete at boot: deleted with it" in rows["node-0"]


# -- item 6: a prefix grant's IAM condition needs uniform bucket-level access ----------------------
@pytest.mark.parametrize("uniform", [True, False])
def test_a_prefix_grant_checks_the_bucket_takes_iam_conditions(uniform: bool) -> None:
    # Cloud Storage accepts IAM Conditions only on buckets with uniform bucket-level access; on a
    # bucket with fine-grained ACLs the grant (and the pool's `up`) would fail with a raw API error.
    from skyward.stacks.plan import BucketPlan

    mocks = fresh_mocks()
    mocks.gcs_uniform = {"data": uniform}
    plan = make_plan(instance_type="e2-standard-4", zone="us-central1-b",
                     settings={"project": "proj"})
    plan = replace(plan, buckets=(BucketPlan("data", "v1"), BucketPlan("whole")))
    seen: dict[str, Any] = {}

    @pulumi.runtime.test
    def go() -> Any:
        declared = gcp.program(plan)
        return pulumi.Output.all(*[g.id for g in declared.grants[0]]).apply(lambda ids: seen.update(ids=ids))

    if uniform:
        go()
        members = mocks.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
        assert {m.inputs["bucket"]: bool(m.inputs.get("condition")) for m in members} == {"data": True, "whole": False}
        assert [c.args["name"] for c in mocks.calls if c.token == "gcp:storage/getBucket:getBucket"] == ["data"]
    else:
        with pytest.raises(Exception, match=r"bucket 'data'.*uniform bucket-level access.*"
                                            r"gcloud storage buckets update gs://data --uniform-bucket-level-access"):
            go()
