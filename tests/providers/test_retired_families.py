"""Machines a cloud no longer sells are not in its catalogue, and asking for one
says where the accelerator is still rented instead of planning a machine nobody can buy."""

from __future__ import annotations

import pytest

import skyward as sky
from skyward import catalogue
from skyward.errors import NoOfferError

# Families AWS retired (no longer described by the EC2 API or listed as available in any region):
# P2, P3 and P3dn (V100; dstackai/gpuhunt#233, skypilot-org/skypilot#10107/#10113), G2, G3 and
# G3s (end of life 2025-10-31), G4ad (Radeon Pro V520; vantage-sh/ec2instances.info#996), F1
# (retired 2025-12-20). Written out here, not read from the code, so that a row put back fails.
RETIRED_AWS = {"p2", "p3", "p3dn", "g2", "g3", "g3s", "g4ad", "f1"}


def test_no_retired_aws_family_is_in_the_catalogue() -> None:
    families = {o.instance_type.split(".")[0] for o in catalogue.load("aws")}
    assert not families & RETIRED_AWS, sorted(families & RETIRED_AWS)


def test_the_code_knows_every_retired_family() -> None:
    from skyward.providers.aws import RETIRED_FAMILIES

    assert set(RETIRED_FAMILIES) >= RETIRED_AWS


def test_v100_on_aws_points_to_gcp() -> None:
    provider = sky.AWS()
    with pytest.raises(NoOfferError, match=r"V100.*sky\.GCP\(\)"):
        provider.offer(sky.Spec(provider=provider, accelerator="V100"))
    # GCP still rents it.
    gcp = sky.GCP(project="p")
    assert gcp.offer(sky.Spec(provider=gcp, accelerator="V100")).accelerator == "V100"


@pytest.mark.parametrize("instance_type", ["p3.2xlarge", "p3dn.24xlarge", "g4ad.xlarge", "g3.4xlarge"])
def test_a_retired_instance_type_is_refused_by_name(instance_type: str) -> None:
    provider = sky.AWS(instance_type=instance_type)
    with pytest.raises(NoOfferError, match=rf"retired the {instance_type.split('.')[0]} family"):
        provider.offer(sky.Spec(provider=provider))


def test_no_aws_row_needs_the_amazon_linux_2_image() -> None:
    # Amazon Linux 2 reached end of support on 2026-06-30; the only rows that booted it were p3.
    from skyward.stacks import aws

    assert not any("Amazon Linux 2" in pattern for _, pattern in aws._AMIS.values())


# dl1 (Gaudi) is sold, but no image skyward picks drives it: the row is gone and asking for it
# says what to use instead, by accelerator and by instance type.
def test_no_dl1_row_is_in_the_catalogue() -> None:
    assert not [o for o in catalogue.load("aws") if o.instance_type.startswith("dl1.") or o.accelerator == "Gaudi"]


@pytest.mark.parametrize("ask", [
    {"accelerator": "Gaudi"}, {"accelerator": sky.accelerators.Gaudi(count=8)}, {"accelerator": "dl1"},
])
def test_gaudi_on_aws_says_what_to_use(ask: dict) -> None:
    provider = sky.AWS()
    with pytest.raises(NoOfferError, match=r"(?s)does not launch AWS dl1.*Habana.*sky\.SSH\(hosts=.*Trainium"):
        provider.offer(sky.Spec(provider=provider, **ask))
    assert "Gaudi" in (provider.check(sky.Spec(provider=provider, **ask)) or "")


def test_dl1_by_instance_type_says_what_to_use() -> None:
    provider = sky.AWS(instance_type="dl1.24xlarge")
    with pytest.raises(NoOfferError, match=r"instance_type='dl1.24xlarge'.*does not launch AWS dl1"):
        provider.offer(sky.Spec(provider=provider))
