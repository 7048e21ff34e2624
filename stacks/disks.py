"""Which block volumes each cloud takes, checked before anything is created.

Pulumi's mocks accept any disk type and size, and the clouds refuse them only at ``up``, after
the pool's network and identities exist: so the rules that matter are encoded here, and both
the providers (before a preview or a stack) and the stack programs (for a plan reopened from a
record) check a pool's ``sky.Disk`` list against them.

Sources (checked 2026): EC2's EBS volume types (size ranges, io1/io2 need provisioned IOPS,
st1/sc1 start at 125 GiB), the instance's block device names (``/dev/sdf``..``/dev/sdp``
here: eleven extra volumes); Compute Engine's disk types (Persistent Disk from 10 GB,
pd-extreme from 500 GB; Hyperdisk sizes per type), and the machine series that take only
Hyperdisk (A3 Ultra, A4, A4X, C4, C4A, C4D, N4, N4A, N4D, X4, M4, H4D, G4) or no Hyperdisk at
all (N1, E2 and the shared-core types).
"""

from __future__ import annotations

from collections.abc import Sequence

from skyward.errors import ConfigError

from .plan import DiskPlan

# -- AWS ----------------------------------------------------------------------------------
AWS_DEVICE_LETTERS = "fghijklmnop"  # /dev/sdf../dev/sdp: the names the AMI-independent mapping uses
AWS_MIN_GB = {"standard": 1, "gp2": 1, "gp3": 1, "io1": 4, "io2": 4, "st1": 125, "sc1": 125}
AWS_NEEDS_IOPS = ("io1", "io2")
AWS_TAKES_IOPS = ("gp3", "io1", "io2")

# -- GCP ----------------------------------------------------------------------------------
GCP_MIN_GB = {
    "pd-standard": 10, "pd-balanced": 10, "pd-ssd": 10, "pd-extreme": 500,
    "hyperdisk-balanced": 4, "hyperdisk-ml": 4, "hyperdisk-extreme": 64, "hyperdisk-throughput": 2048,
    "hyperdisk-balanced-high-availability": 4,
}
GCP_TAKES_IOPS = ("pd-extreme", "hyperdisk-balanced", "hyperdisk-extreme", "hyperdisk-balanced-high-availability")
# Machine series (the machine type's first part) that accept Hyperdisk only: a Persistent Disk,
# boot disk included, makes the instance insert fail.
HYPERDISK_ONLY = ("a3-ultragpu", "a4-", "a4x-", "c4-", "c4a-", "c4d-", "n4-", "n4a-", "n4d-", "x4-", "m4-",
                  "h4d-", "g4-")
# ... and the series that take no Hyperdisk at all.
PERSISTENT_DISK_ONLY = ("n1-", "e2-", "f1-", "g1-")


def aws_check(disks: Sequence[DiskPlan], instance_type: str) -> None:
    """ConfigError for the first ``sky.Disk`` EC2 would refuse for ``instance_type``."""
    if len(disks) > len(AWS_DEVICE_LETTERS):
        raise ConfigError(
            f"sky.AWS: {len(disks)} sky.Disk volumes per node, but a node takes at most "
            f"{len(AWS_DEVICE_LETTERS)} (device names /dev/sdf to /dev/sdp); use fewer, larger disks."
        )
    for disk in disks:
        kind = disk.type or "gp3"
        if kind not in AWS_MIN_GB:
            hint = " (that is a GCP disk type)" if kind in GCP_MIN_GB else ""
            raise ConfigError(
                f"sky.Disk(type={kind!r}) is not an EBS volume type{hint}; on AWS use one of "
                f"{', '.join(AWS_MIN_GB)} (default gp3)."
            )
        if disk.size_gb < AWS_MIN_GB[kind]:
            raise ConfigError(
                f"sky.Disk({disk.size_gb}, type={kind!r}): EBS {kind} volumes are at least "
                f"{AWS_MIN_GB[kind]} GiB; give size_gb >= {AWS_MIN_GB[kind]} or type='gp3'."
            )
        if kind in AWS_NEEDS_IOPS and not disk.iops:
            raise ConfigError(
                f"sky.Disk({disk.size_gb}, type={kind!r}) has no iops: EBS {kind} volumes are created "
                f"with provisioned IOPS; give iops=... (e.g. iops=3000) or use type='gp3'."
            )
        if disk.iops and kind not in AWS_TAKES_IOPS:
            raise ConfigError(
                f"sky.Disk(type={kind!r}, iops={disk.iops}): only {', '.join(AWS_TAKES_IOPS)} volumes "
                f"take provisioned IOPS; drop iops= or change the type."
            )


def gcp_default_type(machine_type: str) -> str:
    """The boot disk's type, and a ``sky.Disk``'s when it names none, for this machine type."""
    return "hyperdisk-balanced" if machine_type.startswith(HYPERDISK_ONLY) else "pd-balanced"


def gcp_check(disks: Sequence[DiskPlan], machine_type: str) -> None:
    """ConfigError for the first ``sky.Disk`` Compute Engine would refuse on ``machine_type``."""
    series = machine_type.split("-", 1)[0].upper()
    for disk in disks:
        kind = disk.type or gcp_default_type(machine_type)
        if kind not in GCP_MIN_GB:
            hint = " (that is an AWS EBS type)" if kind in AWS_MIN_GB else ""
            raise ConfigError(
                f"sky.Disk(type={kind!r}) is not a Compute Engine disk type{hint}; on GCP use one of "
                f"{', '.join(GCP_MIN_GB)} (default {gcp_default_type(machine_type)} for {machine_type})."
            )
        if machine_type.startswith(HYPERDISK_ONLY) and not kind.startswith("hyperdisk-"):
            raise ConfigError(
                f"sky.Disk(type={kind!r}) on {machine_type}: the {series} series takes Hyperdisk only, "
                f"no Persistent Disk; use type='hyperdisk-balanced' (or leave type out)."
            )
        if machine_type.startswith(PERSISTENT_DISK_ONLY) and kind.startswith("hyperdisk-"):
            raise ConfigError(
                f"sky.Disk(type={kind!r}) on {machine_type}: the {series} series takes no Hyperdisk; "
                f"use type='pd-balanced' (or leave type out)."
            )
        if disk.size_gb < GCP_MIN_GB[kind]:
            raise ConfigError(
                f"sky.Disk({disk.size_gb}, type={kind!r}): Compute Engine {kind} disks are at least "
                f"{GCP_MIN_GB[kind]} GB; give size_gb >= {GCP_MIN_GB[kind]}."
            )
        if disk.iops and kind not in GCP_TAKES_IOPS:
            raise ConfigError(
                f"sky.Disk(type={kind!r}, iops={disk.iops}): only {', '.join(GCP_TAKES_IOPS)} disks take "
                f"provisioned IOPS; drop iops= or change the type."
            )
