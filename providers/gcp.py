"""sky.GCP(): pools of Compute Engine instances, each pool one Pulumi stack.

    sky.Compute(provider=sky.GCP(project="my-project", zone="us-central1-a"), accelerator="L4")

Selection reads the shipped offer catalogue (no credentials needed); ``create`` brings the
pool's stack up (stacks/gcp.py declares what is in it) and hands the instances to the SSH
bootstrap like any other hosts. Needs ``pip install 'skyward[gcp]'``, the Pulumi CLI and
Google credentials (``gcloud auth application-default login`` or a service account).
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

DEFAULT_REGION = "us-central1"


@dataclass(frozen=True, slots=True)
class GCP(CloudProvider):
    """Google Compute Engine.

    ``project``: the GCP project (default: GOOGLE_CLOUD_PROJECT / CLOUDSDK_CORE_PROJECT, else
    what the Google provider finds in your gcloud configuration). ``zone``/``region``: where
    (default: the spec's region, else us-central1; zone ``<region>-a``). ``network`` /
    ``subnetwork``: the VPC to use (default network "default"). ``image``: boot image
    (default: Ubuntu 24.04, or Canonical's NVIDIA-driver image for GPU nodes).
    ``instance_type``: skip selection and use this catalogue entry. ``user``: the login user
    made from the ssh-keys metadata. ``allow_ssh_from`` / ``detect_address``: who may reach port
    22 (this machine's address is added unless detect_address=False). ``max_duration``: seconds
    after which Compute Engine deletes the nodes (``max_run_duration``). ``workspace``: how
    stacks are run (default: the Pulumi CLI via the automation API; tests pass a fake).
    """

    project: str | None = None
    zone: str | None = None
    region: str | None = None
    network: str = "default"
    subnetwork: str | None = None
    image: str | None = None
    instance_type: str | None = None
    user: str = "skyward"
    allow_ssh_from: tuple[str, ...] = ()
    detect_address: bool = True
    max_duration: float | None = None
    # How nodes get packages (see sky.SSH): cloud nodes have internet, so from their index;
    # "wheelhouse" ships wheels the client built (same platform as the client only).
    install: str = "index"
    workspace: Any = field(default=None, repr=False, compare=False)
    kind: ClassVar[str] = "gcp"
    label: ClassVar[str] = "sky.GCP"
    extra: ClassVar[str] = "gcp"
    sdk: ClassVar[tuple[str, ...]] = ("pulumi", "pulumi_gcp")
    plugin_package: ClassVar[str] = "pulumi-gcp"
    volume_kind: ClassVar[str] = "persistent disks"

    # dataclass(slots=True) would write its own pickling methods over the base's.
    __getstate__ = CloudProvider.__getstate__
    __setstate__ = CloudProvider.__setstate__

    def __post_init__(self) -> None:
        self._check_common()
        if isinstance(self.allow_ssh_from, str):
            raise ConfigError(f"GCP(allow_ssh_from={self.allow_ssh_from!r}) is a list of CIDRs: write [{self.allow_ssh_from!r}].")
        object.__setattr__(self, "allow_ssh_from", tuple(self.allow_ssh_from))
        if self.max_duration is not None and self.max_duration < 30:
            raise ConfigError(f"GCP(max_duration={self.max_duration!r}) is not valid: seconds >= 30, or None for no cap.")
        if self.zone and self.region and not self.zone.startswith(self.region + "-"):
            raise ConfigError(f"GCP(zone={self.zone!r}, region={self.region!r}): the zone is not in the region; give one of them.")

    # -- selection -------------------------------------------------------------------------
    def region_for(self, spec: Spec) -> str:
        zone_region = self.zone.rsplit("-", 1)[0] if self.zone else None
        return spec.region or self.region or zone_region or DEFAULT_REGION

    def zone_for(self, spec: Spec) -> str:
        return self.zone or f"{self.region_for(spec)}-a"

    def offer(self, spec: Spec) -> Offer:
        """The cheapest catalogue offer for ``spec`` (NoOfferError listing the closest)."""
        from skyward.catalogue import Want, select

        mine = self.region or (self.zone.rsplit("-", 1)[0] if self.zone else None)
        if spec.region and mine and spec.region != mine:
            raise NoOfferError(
                f"Spec(region={spec.region!r}) and GCP(zone/region={self.zone or self.region!r}) disagree; "
                f"give the location in one place."
            )
        return select("gcp", Want.of(spec, region=self.region_for(spec), instance_type=self.instance_type))

    # -- provisioning ----------------------------------------------------------------------
    def _stack_args(self, spec: Spec, offer: Offer) -> dict[str, Any]:
        """What the stack program is given besides the spec and offer (create and preview)."""
        project = self.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")
        settings = {
            "project": project, "network": self.network, "subnetwork": self.subnetwork,
            "machine_type": offer.extra.get("machine_type") or offer.instance_type,
            "accelerator_type": offer.extra.get("accelerator_type"), "attach": bool(offer.extra.get("attach")),
            "accelerator_count": offer.accelerator_count,
        }
        return {
            "zone": self.zone_for(spec), "image": self.image, "user": self.user, "settings": settings,
            "allow_ssh_from": self.allow_ssh_from, "detect_address": self.detect_address,
            "max_duration": self.max_duration,
        }
