"""sky.AWS(): pools of EC2 instances, each pool one Pulumi stack.

    sky.Compute(provider=sky.AWS(region="us-east-1"), accelerator="A10G", nodes=2)

Selection reads the shipped offer catalogue (no credentials needed); ``create`` brings the
pool's stack up (stacks/aws.py declares what is in it) and hands the instances to the SSH
bootstrap like any other hosts. Needs ``pip install 'skyward[aws]'``, the Pulumi CLI and AWS
credentials (the usual chain: environment, ``profile=``, instance role...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from skyward.errors import ConfigError, NoOfferError

from .cloud import CloudProvider

if TYPE_CHECKING:
    from skyward.catalogue import Offer
    from skyward.spec import Spec

DEFAULT_REGION = "us-east-1"
# Instance families AWS no longer sells (the EC2 API no longer describes them, or only accounts
# that ran them in the last year may launch them): never in the catalogue (a test checks), and
# refused by name with where the accelerator is still rented.
RETIRED_FAMILIES = {
    "p2": "K80", "g2": "GRID K520", "g3": "M60", "g3s": "M60", "f1": "FPGA",
    "p3": "V100", "p3dn": "V100",  # dstackai/gpuhunt#233: "AWS API no longer describes p3 instances"
    "g4ad": "Radeon Pro V520",  # gone from AWS's instance-types-by-Region lists (2026-09)
}
# Families AWS sells that skyward does not launch, and why: dl1 (Gaudi) needs the Habana driver,
# which no image skyward picks has, and its nodes would be admitted without a device check.
UNDRIVEN_FAMILIES = {"dl1": "Gaudi"}


def undriven(family: str) -> str:
    """Why skyward does not launch this AWS family, and what to use instead."""
    accelerator = UNDRIVEN_FAMILIES[family]
    return (
        f"skyward does not launch AWS {family} instances ({accelerator}): no image it picks has the "
        f"Habana (Intel Gaudi) driver, so a node would boot without a working device. Run on {accelerator} "
        f"machines you have set up with the driver (a {family} instance launched from an image that has "
        f"it, or Intel's Tiber cloud) through sky.SSH(hosts=[...]), or pick an accelerator skyward drives "
        f"on AWS: Trainium (accelerator='Trainium1'), Inferentia, or an NVIDIA GPU (sky.offers(provider='aws'))."
    )


@dataclass(frozen=True, slots=True)
class AWS(CloudProvider):
    """Amazon EC2.

    ``region``/``zone``: where (default: the spec's region, else AWS_REGION /
    AWS_DEFAULT_REGION, else us-east-1; a zone picks the default subnet there).
    ``profile``: the AWS credentials profile. ``subnet``: launch into this subnet (and its VPC)
    instead of the default VPC. ``ami``: the image (default: latest Ubuntu 24.04 for CPU
    nodes, the Deep Learning base AMI for GPU nodes). ``instance_type``: skip selection and
    use this type (it must be in the catalogue). ``user``: the login user of the AMI.
    ``allow_ssh_from``: CIDRs allowed to reach port 22 besides this machine's address
    (``detect_address=False`` to not add it). ``max_duration``: seconds after which nodes power
    off whatever happens. ``workspace``: how stacks are run (default: the Pulumi CLI via the
    automation API; tests pass a fake). ``fanout=True``: the client logs into the first node
    only, which starts the others over the pool's network and carries the client's links to
    their agents (as ``sky.SSH(fanout=True)``): for large pools, one login instead of one per node.
    """

    region: str | None = None
    zone: str | None = None
    profile: str | None = None
    subnet: str | None = None
    ami: str | None = None
    instance_type: str | None = None
    user: str = "ubuntu"
    allow_ssh_from: tuple[str, ...] = ()
    detect_address: bool = True
    max_duration: float | None = None
    # How nodes get packages (see sky.SSH): cloud nodes have internet, so from their index;
    # "wheelhouse" ships wheels the client built (same platform as the client only).
    install: str = "index"
    workspace: Any = field(default=None, repr=False, compare=False)
    fanout: bool = False
    kind: ClassVar[str] = "aws"
    label: ClassVar[str] = "sky.AWS"
    extra: ClassVar[str] = "aws"
    sdk: ClassVar[tuple[str, ...]] = ("pulumi", "pulumi_aws")
    plugin_package: ClassVar[str] = "pulumi-aws"
    volume_kind: ClassVar[str] = "block volumes"

    # dataclass(slots=True) would write its own pickling methods over the base's.
    __getstate__ = CloudProvider.__getstate__
    __setstate__ = CloudProvider.__setstate__

    def __post_init__(self) -> None:
        self._check_common()
        if isinstance(self.allow_ssh_from, str):
            raise ConfigError(f"AWS(allow_ssh_from={self.allow_ssh_from!r}) is a list of CIDRs: write [{self.allow_ssh_from!r}].")
        object.__setattr__(self, "allow_ssh_from", tuple(self.allow_ssh_from))
        from skyward.stacks.network import check_cidrs

        check_cidrs(self.allow_ssh_from, "sky.AWS(allow_ssh_from=...)")  # refused where given, not at `up`
        if self.max_duration is not None and self.max_duration <= 0:
            raise ConfigError(f"AWS(max_duration={self.max_duration!r}) is not valid: seconds > 0, or None for no cap.")

    # -- selection -------------------------------------------------------------------------
    def region_for(self, spec: Spec) -> str:
        return spec.region or self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION

    def offer(self, spec: Spec) -> Offer:
        """The cheapest catalogue offer for ``spec`` (NoOfferError listing the closest)."""
        from skyward.catalogue import Want, select

        if spec.region and self.region and spec.region != self.region:
            raise NoOfferError(
                f"Spec(region={spec.region!r}) and AWS(region={self.region!r}) disagree; give the region in one place."
            )
        region = self.region_for(spec)
        family = (self.instance_type or "").split(".")[0]
        if family in RETIRED_FAMILIES:
            elsewhere = " (GCP still rents V100s: provider=sky.GCP())" if RETIRED_FAMILIES[family] == "V100" else ""
            raise NoOfferError(
                f"AWS retired the {family} family ({RETIRED_FAMILIES[family]}): {self.instance_type} can no longer "
                f"be launched{elsewhere}. Pick a current instance type (sky.offers(provider='aws') lists them)."
            )
        if family in UNDRIVEN_FAMILIES:
            raise NoOfferError(f"AWS(instance_type={self.instance_type!r}): {undriven(family)}")
        want = Want.of(spec, region=region, instance_type=self.instance_type)
        for undriven_family, accelerator in UNDRIVEN_FAMILIES.items():
            if want.accelerator is not None and want.accelerator.name == accelerator:
                raise NoOfferError(f"no aws offer has {want.accelerator}: {undriven(undriven_family)}")
        if self.zone and not self.zone.startswith(region):
            raise NoOfferError(f"AWS(zone={self.zone!r}) is not in region {region!r}; pick a zone of that region.")
        return select("aws", want)

    # -- provisioning ----------------------------------------------------------------------
    def _stack_args(self, spec: Spec, offer: Offer) -> dict[str, Any]:
        """What the stack program is given besides the spec and offer (create and preview)."""
        # The catalogue row says which AMI family its hardware needs (Neuron for trn/inf). Every
        # NVIDIA GPU AWS still sells is Turing or newer, which the OSS-driver DLAMIs drive (the
        # V100 machines, which needed the Amazon Linux 2 proprietary-driver image, are retired).
        family = offer.extra.get("family")
        from skyward.stacks.disks import aws_check
        from skyward.stacks.plan import DiskPlan
        from skyward.volumes import Disk

        # Checked here, before a preview or a stack exists: EC2 would refuse them at `up`.
        aws_check([DiskPlan(v.size_gb, v.mount, v.type, v.iops) for v in spec.volumes if isinstance(v, Disk)],
                  offer.instance_type)
        user = self.user
        return {
            "zone": self.zone, "image": self.ami, "user": user,
            "settings": {"profile": self.profile, "subnet": self.subnet, "family": family},
            "allow_ssh_from": self.allow_ssh_from, "detect_address": self.detect_address,
            "max_duration": self.max_duration,
        }
