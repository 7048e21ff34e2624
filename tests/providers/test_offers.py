"""Offers and selection: the shipped catalogues, sky.offers(), and choosing a spec (cheapest or
first) across AWS, GCP, Local and SSH. Pure logic: no credentials, no network, no CLI."""

from __future__ import annotations

import pytest

import skyward as sky
from skyward.catalogue import Want, load, select
from skyward.errors import NoOfferError
from skyward.spec import select_spec as _select

A = sky.accelerators


def test_catalogues_carry_their_date_and_sane_prices() -> None:
    for provider in ("aws", "gcp"):
        offers = load(provider)
        assert offers and all(o.as_of in ("2025-06-01", "2025-10-01") for o in offers)  # rows added later are dated apart
        for o in offers:
            assert o.vcpus > 0 and o.memory_gb > 0 and o.architecture in ("x86_64", "arm64")
            if o.extra.get("sold_as"):  # bought another way (reservations, Capacity Blocks): no on-demand price
                assert "on-demand" not in o.extra["sold_as"] and not o.on_demand, o
                continue
            assert o.on_demand is not None and o.on_demand > 0
            assert o.spot is None or 0 < o.spot < o.on_demand, o
            assert (o.accelerator is None) == (o.accelerator_count == 0)


def test_the_cheapest_viable_offer_wins() -> None:
    spec = sky.Spec(provider=sky.AWS(), accelerator=A.T4())
    assert sky.AWS().offer(spec).instance_type == "g4dn.xlarge"
    bigger = sky.Spec(provider=sky.AWS(), accelerator=A.T4(), vcpus=8)
    assert sky.AWS().offer(bigger).instance_type == "g4dn.2xlarge"
    four = sky.Spec(provider=sky.AWS(), accelerator=A.T4(count=4))
    assert sky.AWS().offer(four).instance_type == "g4dn.12xlarge"
    cpu = sky.Spec(provider=sky.AWS(), vcpus=4, memory_gb=16, allocation="on-demand")
    assert sky.AWS().offer(cpu).instance_type == "m7g.xlarge"  # arm is cheapest unless asked otherwise
    x86 = sky.Spec(provider=sky.AWS(), vcpus=4, memory_gb=16, allocation="on-demand", architecture="x86_64")
    assert sky.AWS().offer(x86).instance_type == "m7i.xlarge"


def test_accelerator_memory_and_allocation_decide_the_price() -> None:
    assert sky.AWS().offer(sky.Spec(provider=sky.AWS(), accelerator=A.A100())).instance_type == "p4de.24xlarge"
    forty = sky.Spec(provider=sky.AWS(), accelerator=A.A100(memory="40GB"))
    offer = sky.AWS().offer(forty)
    assert offer.instance_type == "p4d.24xlarge"
    assert offer.price("on-demand") == offer.on_demand and offer.price("spot") == offer.spot
    assert offer.price("spot-if-available") == offer.spot and offer.market("cheapest") == "spot"
    assert sky.AWS().hourly_cost(sky.Spec(provider=sky.AWS(), accelerator=A.A100(memory="40GB"),
                                          allocation="on-demand")) == offer.on_demand


def test_max_hourly_cost_excludes_offers() -> None:
    fits = sky.Spec(provider=sky.AWS(), accelerator=A.A10G(), max_hourly_cost=0.45)
    assert sky.AWS().offer(fits).instance_type == "g5.xlarge"  # spot $0.42
    on_demand = sky.Spec(provider=sky.AWS(), accelerator=A.A10G(), max_hourly_cost=0.45, allocation="on-demand")
    assert "max_hourly_cost" in (sky.AWS().check(on_demand) or "")


def test_an_impossible_spec_lists_the_closest_offers() -> None:
    spec = sky.Spec(provider=sky.AWS(), accelerator=A.H100(), max_hourly_cost=0.5)
    with pytest.raises(NoOfferError) as info:
        _select((spec,), sky.Options())
    text = str(info.value)
    assert "no aws offer has H100" in text and "at most $0.5/h" in text and "as of 2025-06-01" in text
    assert "Closest, without the max_hourly_cost limit" in text and "p5.48xlarge" in text and "$/h" not in text
    assert "Change max_hourly_cost" in text


def test_region_filters_and_prices_differ_by_region() -> None:
    us = sky.AWS(region="us-east-1").offer(sky.Spec(provider=sky.AWS(region="us-east-1"), accelerator=A.A10G()))
    eu = sky.AWS(region="eu-west-1").offer(sky.Spec(provider=sky.AWS(region="eu-west-1"), accelerator=A.A10G()))
    assert (us.region, eu.region) == ("us-east-1", "eu-west-1") and eu.on_demand > us.on_demand
    nowhere = sky.Spec(provider=sky.GCP(), accelerator=A.L4(), region="ap-south-9")
    why = sky.GCP().check(nowhere)
    assert why is not None and "without the region limit" in why and "g2-standard-4" in why
    clash = sky.Spec(provider=sky.AWS(region="us-east-1"), region="us-west-2")
    assert "disagree" in (sky.AWS(region="us-east-1").check(clash) or "")


def test_pinned_instance_type() -> None:
    spec = sky.Spec(provider=sky.AWS(instance_type="g5.12xlarge"))
    assert sky.AWS(instance_type="g5.12xlarge").offer(spec).accelerator_count == 4
    unknown = sky.Spec(provider=sky.AWS(instance_type="x9.huge"))
    assert "instance type x9.huge" in (sky.AWS(instance_type="x9.huge").check(unknown) or "")


def test_gcp_offers_carry_what_the_program_needs() -> None:
    offer = sky.GCP().offer(sky.Spec(provider=sky.GCP(), accelerator=A.T4()))
    assert offer.instance_type == "n1-standard-4+t4"
    assert {k: v for k, v in offer.extra.items() if k != "zones"} == {
        "machine_type": "n1-standard-4", "accelerator_type": "nvidia-tesla-t4", "attach": True}
    assert offer.extra["zones"][offer.region]
    a100 = sky.GCP().offer(sky.Spec(provider=sky.GCP(), accelerator=A.A100(memory="40GB")))
    assert a100.instance_type == "a2-highgpu-1g" and not a100.extra.get("attach")


def test_cheapest_across_providers() -> None:
    aws = sky.Spec(provider=sky.AWS(), accelerator=A.T4())
    gcp = sky.Spec(provider=sky.GCP(), accelerator=A.T4())
    assert _select((aws, gcp), sky.Options()) is gcp  # $0.18 spot < $0.21
    assert _select((aws, gcp), sky.Options(selection="first")) is aws
    # The pool's price counts: 1 AWS node is cheaper than 2 GCP nodes.
    gcp2 = sky.Spec(provider=sky.GCP(), accelerator=A.T4(), nodes=2)
    assert _select((aws, gcp2), sky.Options()) is aws
    # Machines you have cost nothing.
    local = sky.Spec(provider=sky.Local())
    assert _select((aws, local), sky.Options()) is local
    ssh = sky.Spec(provider=sky.SSH(hosts=["10.0.0.5"]))
    assert _select((aws, ssh), sky.Options()) is ssh
    assert _select((aws, ssh), sky.Options(selection="first")) is aws


def test_first_falls_through_to_the_next_spec_with_an_offer() -> None:
    impossible = sky.Spec(provider=sky.AWS(), accelerator=A.H100(), max_hourly_cost=0.5)
    gcp = sky.Spec(provider=sky.GCP(), accelerator=A.L4())
    local = sky.Spec(provider=sky.Local())
    assert _select((impossible, gcp, local), sky.Options(selection="first")) is gcp
    assert _select((impossible, local), sky.Options(selection="first")) is local
    with pytest.raises(NoOfferError) as info:
        _select((impossible, sky.Spec(provider=sky.GCP(), accelerator=A.H100(), max_hourly_cost=1)),
                sky.Options(selection="first"))
    assert "- AWS:" in str(info.value) and "- GCP:" in str(info.value) and "a3-highgpu-8g" in str(info.value)


def test_sky_offers_queries_every_catalogue() -> None:
    h100 = sky.offers("H100:8")
    assert h100 and {o.provider for o in h100} == {"aws", "gcp"}
    prices = [o.price("cheapest") for o in h100]
    assert prices == sorted(prices)
    aws_only = sky.offers(A.A10G(), provider=sky.AWS(), allocation="on-demand", max_hourly_cost=2)
    assert [o.instance_type for o in aws_only][:2] == ["g5.xlarge", "g5.xlarge"]
    assert all(o.on_demand <= 2 for o in aws_only)
    arm = sky.offers(provider="gcp", architecture="arm64", region="us-central1")
    assert [o.instance_type for o in arm] == ["t2a-standard-4", "t2a-standard-8"]
    assert "t2a-standard-4 (us-central1): 4 vCPU, 16 GB, arm64" in str(arm[0])
    with pytest.raises(sky.ConfigError):
        sky.offers(provider="azure")


def test_want_explains_a_misfit() -> None:
    offer = select("aws", Want(accelerator=A.T4()))
    assert Want(accelerator=A.T4(count=2)).misfit(offer) == "has 1 T4, fewer than 2"
    assert Want(architecture="arm64").misfit(offer) is not None


def test_catalogue_rows_list_only_where_a_type_is_sold() -> None:
    from skyward.catalogue import load
    from skyward.providers.gcp import REGION_ZONES

    aws = {(o.instance_type, o.region): o for o in load("aws")}
    # p5 and g6e are not sold in eu-west-1; p4de has no spot market.
    assert ("p5.48xlarge", "eu-west-1") not in aws and ("g6e.xlarge", "eu-west-1") not in aws
    assert all(o.spot is None for (t, _), o in aws.items() if t == "p4de.24xlarge")
    for o in load("gcp"):
        zones = o.extra["zones"][o.region]
        assert zones, o
        for zone in zones:  # a real zone of the row's region (us-east1 has no zone a)
            region, letter = zone.rsplit("-", 1)
            assert region == o.region and letter in REGION_ZONES[region], (o.instance_type, zone)
    gcp = {(o.instance_type, o.region): o for o in load("gcp")}
    assert ("a3-highgpu-8g", "us-east1") not in gcp
    assert gcp[("a3-highgpu-8g", "us-central1")].spot is None


def test_gcp_pools_start_in_a_zone_that_has_their_gpu() -> None:
    provider = sky.GCP(project="p")
    spec = sky.Spec(provider=provider, accelerator=A.V100(), region="us-east1")
    offer = provider.offer(spec)
    assert provider.zones_for(spec, offer) == ["us-east1-c"]  # the only us-east1 zone with V100s
    l4 = sky.Spec(provider=provider, accelerator=A.L4(), region="us-east1")
    assert provider.zones_for(l4, provider.offer(l4)) == ["us-east1-b", "us-east1-c", "us-east1-d"]
    assert sky.GCP(project="p", zone="us-east1-d").zones_for(l4, provider.offer(l4)) == ["us-east1-d"]
