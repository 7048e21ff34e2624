"""Every accelerator AWS and GCP rent is in their catalogues, dated, and selectable where sold."""

from __future__ import annotations

import datetime
import re

import pytest

import skyward as sky
from skyward import catalogue
from skyward.accelerators import Accelerator, names, parse

# What the issue asks each cloud's catalogue to rent (canonical accelerator names).
AWS_FAMILIES = {
    "g5g": "T4G", "inf1": "Inferentia1", "inf2": "Inferentia2",
    "trn1": "Trainium1", "trn2": "Trainium2", "g6": "L4", "g6e": "L40S",
    "p5e": "H200", "p5en": "H200", "p6-b200": "B200", "g4dn": "T4", "g5": "A10G", "p4d": "A100", "p5": "H100",
}
GCP_FAMILIES = {
    "a3-highgpu": "H100", "a3-megagpu": "H100", "a3-ultragpu": "H200", "a4-highgpu": "B200", "g2-standard": "L4",
    "a2-highgpu": "A100", "a2-ultragpu": "A100", "tpu-v2": "TPUv2", "tpu-v3": "TPUv3", "tpu-v4": "TPUv4",
    "tpu-v5litepod": "TPUv5e", "tpu-v5p": "TPUv5p", "tpu-v6e": "TPUv6",
}


def _family(instance_type: str) -> str:
    return instance_type.split(".")[0] if "." in instance_type else instance_type.rsplit("-", 1)[0]


@pytest.mark.parametrize(("provider", "families"), [("aws", AWS_FAMILIES), ("gcp", GCP_FAMILIES)])
def test_each_family_the_issue_names_is_in_the_catalogue_with_its_accelerator(provider: str, families: dict[str, str]) -> None:
    found = {(_family(o.instance_type), o.accelerator) for o in catalogue.load(provider)}
    for family, accelerator in families.items():
        assert (family, accelerator) in found, f"{provider}: no {family} row with {accelerator}"


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_every_catalogue_accelerator_is_a_catalogue_name_and_dated(provider: str) -> None:
    for offer in catalogue.load(provider):
        if offer.accelerator is not None:
            assert offer.accelerator in names(), offer
            assert parse(offer.accelerator).name == offer.accelerator  # strings in toml/CLI resolve
            assert offer.accelerator_count >= 1 and offer.accelerator_memory_gb
        assert datetime.date.fromisoformat(offer.as_of) <= datetime.date.today(), offer
        # A row not sold on demand and with no spot price (GCP A3 Ultra, A4) is kept to say how it
        # is bought (tests/stacks/test_cloud_rules.py), not offered.
        assert offer.on_demand is not None or offer.spot is not None or offer.extra.get("sold_as"), offer


def _cases(provider: str) -> list[tuple[str, str, str, float]]:
    seen = {}
    for o in catalogue.load(provider):
        if o.accelerator is not None and (o.on_demand is not None or o.spot is not None):
            seen.setdefault((o.instance_type, o.region), (o.accelerator, o.accelerator_count, o.accelerator_memory_gb))
    return [(it, region, *acc) for (it, region), acc in sorted(seen.items())]


@pytest.mark.parametrize(("instance_type", "region", "name", "count", "memory"), _cases("aws"))
def test_every_aws_accelerator_row_yields_an_offer_where_it_is_sold(instance_type: str, region: str, name: str,
                                                                    count: float, memory: float) -> None:
    acc = Accelerator(name, count=count, memory=f"{memory:g}GB", manufacturer=parse(name).manufacturer)
    offer = sky.AWS(region=region).offer(sky.Spec(provider=sky.AWS(region=region), accelerator=acc))
    assert (offer.region, offer.accelerator) == (region, name)
    assert offer.accelerator_count >= count
    pinned = sky.AWS(region=region, instance_type=instance_type)
    assert pinned.offer(sky.Spec(provider=pinned, accelerator=acc)).instance_type == instance_type


@pytest.mark.parametrize(("instance_type", "region", "name", "count", "memory"), _cases("gcp"))
def test_every_gcp_accelerator_row_yields_an_offer_where_it_is_sold(instance_type: str, region: str, name: str,
                                                                    count: float, memory: float) -> None:
    acc = Accelerator(name, count=count, memory=f"{memory:g}GB", manufacturer=parse(name).manufacturer)
    gcp = sky.GCP(project="p", region=region)
    offer = gcp.offer(sky.Spec(provider=gcp, accelerator=acc))
    assert (offer.region, offer.accelerator) == (region, name)
    pinned = sky.GCP(project="p", region=region, instance_type=instance_type)
    assert pinned.offer(sky.Spec(provider=pinned, accelerator=acc)).instance_type == instance_type


@pytest.mark.parametrize(
    ("accelerator", "provider", "instance_type"),
    [
        (sky.accelerators.T4G(), sky.AWS(), "g5g.xlarge"),
        (sky.accelerators.Inferentia1(), sky.AWS(), "inf1.xlarge"),
        (sky.accelerators.Trainium1(count=16), sky.AWS(), "trn1.32xlarge"),
        (sky.accelerators.L40S(count=8), sky.AWS(), "g6e.48xlarge"),
        (sky.accelerators.H200(count=8), sky.AWS(region="us-east-2"), "p5en.48xlarge"),  # p5e: Capacity Blocks only
        (sky.accelerators.B200(count=8), sky.AWS(region="us-west-2"), "p6-b200.48xlarge"),
        (sky.accelerators.TPUv5e_4(), sky.GCP(project="p"), "tpu-v5litepod-4"),
        (sky.accelerators.TPUv6(count=8), sky.GCP(project="p", region="us-east5"), "tpu-v6e-8"),
        (sky.accelerators.TPUv5p_8(), sky.GCP(project="p", region="us-east5"), "tpu-v5p-8"),
        (sky.accelerators.TPUv4(count=8), sky.GCP(project="p", region="us-central2"), "tpu-v4-8"),
        (sky.accelerators.L4(count=8), sky.GCP(project="p"), "g2-standard-96"),
        (sky.accelerators.P4(), sky.GCP(project="p"), "n1-standard-4+p4"),
    ],
)
def test_the_factories_find_their_machine(accelerator: Accelerator, provider: object, instance_type: str) -> None:
    spec = sky.Spec(provider=provider, accelerator=accelerator)
    assert provider.offer(spec).instance_type == instance_type  # type: ignore[attr-defined]


def test_a_string_from_skyward_toml_finds_a_tpu() -> None:
    spec = sky.Spec(provider=sky.GCP(project="p"), accelerator="v5litepod-8")
    assert spec.provider.offer(spec).instance_type == "tpu-v5litepod-8"


def test_machines_with_only_on_demand_prices_serve_spot_if_available_but_not_spot() -> None:
    h200 = sky.accelerators.H200(count=8)
    aws = sky.AWS(region="us-east-2")
    assert aws.offer(sky.Spec(provider=aws, accelerator=h200)).market("spot-if-available") == "on-demand"
    with pytest.raises(sky.NoOfferError, match=r"without the allocation limit:\n.*p5en\.48xlarge"):
        aws.offer(sky.Spec(provider=aws, accelerator=h200, allocation="spot"))


def test_a_multi_host_tpu_slice_says_which_sizes_there_are() -> None:
    gcp = sky.GCP(project="p", region="us-central2")
    with pytest.raises(sky.NoOfferError) as info:
        gcp.offer(sky.Spec(provider=gcp, accelerator=sky.accelerators.TPUv4_64()))
    message = str(info.value)
    assert "without the accelerator count limit" in message and "tpu-v4-8" in message
    assert "larger than one host" in message


def test_the_catalogue_date_is_the_newest_row_date() -> None:
    for provider in ("aws", "gcp"):
        assert catalogue.as_of(provider) == max(o.as_of for o in catalogue.load(provider))
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", catalogue.as_of(provider))


def test_the_other_cloud_is_named_when_it_rents_the_accelerator() -> None:
    with pytest.raises(sky.NoOfferError, match=r"TPUv5e is rented by GCP, not by AWS: use provider=sky\.GCP\(\)"):
        sky.AWS().offer(sky.Spec(provider=sky.AWS(), accelerator=sky.accelerators.TPUv5e()))
    with pytest.raises(sky.NoOfferError, match=r"Trainium1 is rented by AWS, not by GCP"):
        sky.GCP().offer(sky.Spec(provider=sky.GCP(), accelerator=sky.accelerators.Trainium()))
