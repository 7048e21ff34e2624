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
# Service accounts a project may have by default (Google's IAM quotas page); a pool makes one per node.
SERVICE_ACCOUNT_QUOTA = 100


# Compute Engine refuses a scheduling.termination_time more than 120 days after the request.
MAX_DURATION_LIMIT = 120 * 86400


@dataclass(frozen=True, slots=True)
class GCP(CloudProvider):
    """Google Compute Engine.

    ``project``: the GCP project (default: GOOGLE_CLOUD_PROJECT / CLOUDSDK_CORE_PROJECT, else
    ``gcloud config get-value project``; none of them: an error before anything is made).
    ``zone``/``region``: where (default: the spec's region, else us-central1; the zones of the
    region that have the machine type, tried in turn when one has no capacity). ``network`` /
    ``subnetwork``: the VPC to use (default network "default"). ``image``: boot image
    (default: Ubuntu 24.04, or Canonical's NVIDIA-driver image for GPU nodes).
    ``instance_type``: skip selection and use this catalogue entry. ``user``: the login user
    made from the ssh-keys metadata. ``allow_ssh_from`` / ``detect_address``: who may reach port
    22 (this machine's address is added unless detect_address=False). ``max_duration``: seconds
    after which Compute Engine deletes the nodes (an absolute ``termination_time``, the same
    for nodes added later). ``image``: must run cloud-init (Ubuntu does; Debian and COS do not). ``workspace``: how
    stacks are run (default: the Pulumi CLI via the automation API; tests pass a fake).
    ``fanout=True``: the client logs into the first node only, which starts the others over the
    pool's network and carries the client's links to their agents (as ``sky.SSH(fanout=True)``).
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
    fanout: bool = False
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
        from skyward.stacks.network import check_cidrs

        check_cidrs(self.allow_ssh_from, "sky.GCP(allow_ssh_from=...)")  # refused where given, not at `up`
        if self.max_duration is not None and self.max_duration < 30:
            raise ConfigError(f"GCP(max_duration={self.max_duration!r}) is not valid: seconds >= 30, or None for no cap.")
        if self.max_duration is not None and self.max_duration > MAX_DURATION_LIMIT:
            raise ConfigError(
                f"GCP(max_duration={self.max_duration!r}) is {self.max_duration / 86400:g} days: Compute Engine "
                f"refuses a termination_time more than 120 days ahead ({MAX_DURATION_LIMIT} s). Give at most "
                f"{MAX_DURATION_LIMIT}, or None for no cap."
            )
        if self.image:
            check_image(self.image)
        if self.zone and self.region and not self.zone.startswith(self.region + "-"):
            raise ConfigError(f"GCP(zone={self.zone!r}, region={self.region!r}): the zone is not in the region; give one of them.")

    # -- selection -------------------------------------------------------------------------
    def region_for(self, spec: Spec) -> str:
        zone_region = self.zone.rsplit("-", 1)[0] if self.zone else None
        return spec.region or self.region or zone_region or DEFAULT_REGION

    def zones_for(self, spec: Spec, offer: Offer | None = None) -> list[str]:
        """The zones a pool may use, in the order they are tried: the given zone, else the zones
        of the region that have the offer's machine type (the catalogue's), else the region's."""
        if self.zone:
            return [self.zone]
        region = offer.region if offer is not None else self.region_for(spec)
        listed = ((offer.extra.get("zones") or {}).get(region) if offer is not None else None) or REGION_ZONES.get(region)
        if not listed:
            raise ConfigError(
                f"sky.GCP: no zone is known for region {region!r}; give one as GCP(zone='{region}-b') "
                f"(see `gcloud compute zones list --filter=region:{region}`)."
            )
        return [z if z.startswith(region + "-") else f"{region}-{z}" for z in listed]

    def zone_for(self, spec: Spec) -> str:
        return self.zones_for(spec)[0]

    def project_for(self) -> str:
        """The project: given, from the environment, else gcloud's configured one."""
        project = self.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")
        return project or gcloud_project() or ""

    def preflight(self, spec: Spec) -> None:
        CloudProvider.preflight(self, spec)  # (no super(): slots dataclasses break its cell)
        if not self.project_for():
            raise ConfigError(
                "sky.GCP: no project. Give it as GCP(project='my-project'), or set GOOGLE_CLOUD_PROJECT, "
                "or configure gcloud: gcloud config set project my-project."
            )
        if self.workspace is None:  # a real account: a missing role ends the pool before anything exists
            from skyward.stacks import gcp_permissions
            from skyward.volumes import Volume

            offer = self.offer(spec)
            gcp_permissions.check(self.project_for(), tpu=bool(offer.extra.get("tpu")),
                                  buckets=[v.bucket for v in spec.volumes if isinstance(v, Volume) and v.storage is None])

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
    def _pool_settings(self, specs: dict[str, Spec], offers: dict[str, Offer],
                       args: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
        """One stack for these groups: none holds TPUs (a TPU pool is its own program), and some
        zone has every group's machine (the zones the pool tries are the ones all can use)."""
        if any(o.extra.get("tpu") for o in offers.values()):
            return None
        settings = CloudProvider._pool_settings(self, specs, offers, args)  # slots: no zero-arg super()
        if settings is None:
            return None
        zones = [z for z in settings.get("zones") or []
                 if all(z in (a["settings"].get("zones") or [z]) for a in args.values())]
        if settings.get("zones") and not zones and not self.zone:
            return None
        return {**settings, "zones": zones}

    def _stack_args(self, spec: Spec, offer: Offer) -> dict[str, Any]:
        """What the stack program is given besides the spec and offer (create and preview)."""
        from skyward.stacks.disks import gcp_check
        from skyward.stacks.plan import DiskPlan
        from skyward.volumes import Disk

        # Checked here, before a preview or a stack exists: Compute Engine would refuse them at `up`.
        if not offer.extra.get("tpu"):  # TPU VMs take no sky.Disk (stacks/gcp_tpu.py says so)
            gcp_check([DiskPlan(v.size_gb, v.mount, v.type, v.iops) for v in spec.volumes if isinstance(v, Disk)],
                      offer.extra.get("machine_type") or offer.instance_type)
        nodes = max(spec.node_spec.desired, getattr(spec.node_spec, "max", None) or 0)
        if nodes > SERVICE_ACCOUNT_QUOTA:
            raise ConfigError(
                f"a GCP pool of {nodes} nodes: skyward makes one service account per node (each may "
                f"delete only its own node at the TTL), and projects have {SERVICE_ACCOUNT_QUOTA} per project "
                f"by default (IAM quotas). Use fewer nodes per pool, or raise the project's service "
                f"account quota and set skyward.providers.gcp.SERVICE_ACCOUNT_QUOTA to it."
            )
        settings = {
            "project": self.project_for() or None, "network": self.network, "subnetwork": self.subnetwork,
            "machine_type": offer.extra.get("machine_type") or offer.instance_type,
            "accelerator_type": offer.extra.get("accelerator_type"), "attach": bool(offer.extra.get("attach")),
            "accelerator_count": offer.accelerator_count, "zones": self.zones_for(spec, offer),
        }
        if offer.extra.get("tpu"):  # a Cloud TPU row: its runtime version and hosts (stacks/gcp_tpu.py)
            settings["tpu"] = offer.extra["tpu"]
        return {
            "zone": self.zone, "image": self.image, "user": self.user, "settings": settings,
            "allow_ssh_from": self.allow_ssh_from, "detect_address": self.detect_address,
            "max_duration": self.max_duration,
        }


# Zones per region (where a catalogue row does not list its own): every zone that exists, as
# of the catalogue's date. Not every region has an "-a" zone (us-east1: b, c, d).
REGION_ZONES: dict[str, list[str]] = {
    "us-central1": ["a", "b", "c", "f"],
    "us-central2": ["b"],  # Cloud TPU v4 only
    "us-south1": ["a", "b", "c"],
    "us-east1": ["b", "c", "d"],
    "us-east4": ["a", "b", "c"],
    "us-east5": ["a", "b", "c"],
    "us-west1": ["a", "b", "c"],
    "us-west4": ["a", "b", "c"],
    "europe-west1": ["b", "c", "d"],
    "europe-west4": ["a", "b", "c"],
    "asia-southeast1": ["a", "b", "c"],
    "asia-northeast1": ["a", "b", "c"],
}

# Images whose boot does not run cloud-init: the node would get no host key, watchdog or disk
# mounts. Refused by name rather than failing at the first SSH connection.
NO_CLOUD_INIT = ("debian-cloud", "cos-cloud", "fedora-coreos-cloud", "windows-cloud", "suse-cloud", "rhel-cloud",
                 "centos-cloud", "rocky-linux-cloud", "debian-", "cos-")


def check_image(image: str) -> None:
    name = image.rsplit("/", 1)[-1]
    parts = image.split("/")
    project = parts[parts.index("projects") + 1] if "projects" in parts[:-1] else ""
    if project in NO_CLOUD_INIT or any(name.startswith(p) for p in NO_CLOUD_INIT if p.endswith("-")):
        raise ConfigError(
            f"GCP(image={image!r}): this image does not run cloud-init, which skyward nodes boot with "
            f"(their host key, TTL watchdog and disk mounts come from its user data). Use an Ubuntu image "
            f"(the default), or an image of your own that includes cloud-init."
        )


def gcloud_project() -> str | None:
    """``gcloud config get-value project``, or None when gcloud is missing or has none."""
    import shutil
    import subprocess

    exe = shutil.which("gcloud")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "config", "get-value", "project"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    value = out.stdout.strip()
    return value if out.returncode == 0 and value and value != "(unset)" else None
