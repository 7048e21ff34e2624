"""Storage attached to nodes: ``sky.Disk`` (a block volume made with each cloud node) and
``sky.Volume`` (a bucket mounted on every node).

    sky.Compute(provider=sky.AWS(), nodes=2, volumes=[sky.Disk(200, mount="/data")])
    sky.Compute(provider=sky.AWS(), volumes=[sky.Volume("my-data", mount="/data")])

Each node gets its own new, empty disk of ``size_gb``, formatted (ext4) and mounted at
``mount`` before the bootstrap runs, and deleted with the pool. AWS: an EBS volume (``type``
defaults to gp3; io1/io2 need ``iops``); GCP: a persistent disk (``type`` defaults to
pd-balanced, or hyperdisk-balanced on the machine series that take Hyperdisk only). Each cloud's
rules (types, minimum sizes, how many) are checked before anything is created
(stacks/disks.py).

A ``Volume`` is mounted by the bootstrap (its own ``volumes`` phase) with rclone over FUSE,
before any task runs, and unmounted when the pool ends. ``prefix`` is the root of the mount;
``read_only`` volumes are mounted read-only (a write fails with EROFS). ``storage=None`` is
the provider's own object store: on AWS and GCP the pool's stack grants the nodes exactly the
volumes' buckets and prefixes (an IAM role / a service account), so no keys travel; Local and
SSH pools have no object store of their own and need ``storage=``.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from .storage import Storage

_RESERVED = ("/", "/opt", "/opt/skyward", "/root", "/tmp", "/home", "/usr", "/etc", "/var", "/boot")


@dataclass(frozen=True, slots=True)
class Disk:
    """A new block volume of ``size_gb`` GB on every node, mounted at ``mount``."""

    size_gb: int
    mount: str = "/data"
    type: str | None = None
    # Provisioned IOPS, for the types that take them (EBS gp3/io1/io2 -- io1/io2 need them --,
    # GCP pd-extreme and Hyperdisk); each cloud's rules are checked before its pool is created.
    iops: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.size_gb, bool) or not isinstance(self.size_gb, int) or self.size_gb < 1:
            raise ConfigError(f"Disk(size_gb={self.size_gb!r}) is not valid: a whole number of GB >= 1.")
        if self.iops is not None and (isinstance(self.iops, bool) or not isinstance(self.iops, int) or self.iops < 1):
            raise ConfigError(f"Disk(iops={self.iops!r}) is not valid: a whole number of IOPS >= 1, or None.")
        mount = self.mount.rstrip("/") or "/" if isinstance(self.mount, str) else ""
        if not mount.startswith("/") or mount in _RESERVED or any(c.isspace() for c in mount):
            raise ConfigError(
                f"Disk(mount={self.mount!r}) is not valid: an absolute path without spaces, not one of "
                f"{', '.join(_RESERVED)}. Use e.g. mount='/data'."
            )


# A bucket mounted over one of these would hide (or be hidden by) what the node runs from.
_VOLUME_RESERVED = ("/", "/opt", "/opt/skyward", "/root", "/tmp", "/home", "/usr", "/etc", "/var",
                    "/boot", "/bin", "/sbin", "/lib", "/lib64", "/dev", "/proc", "/sys", "/run", "/srv")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")  # fullmatch: "$" passes a trailing newline


@dataclass(frozen=True, slots=True)
class Volume:
    """Bucket ``bucket`` (from ``prefix`` down) mounted at ``mount`` on every node."""

    bucket: str
    mount: str
    prefix: str = ""
    read_only: bool = True
    storage: Storage | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.bucket, str) or not _BUCKET.fullmatch(self.bucket):
            raise ConfigError(
                f"Volume(bucket={self.bucket!r}) is not valid: a bucket name (3-222 lower-case letters, "
                f"digits, '.', '-', '_'), without 's3://' or a path; put a path in prefix=."
            )
        object.__setattr__(self, "mount", _check_mount(self.mount))
        if not isinstance(self.prefix, str) or ".." in self.prefix.split("/"):
            raise ConfigError(f"Volume(prefix={self.prefix!r}) is not valid: a path inside the bucket, like 'datasets/v1'.")
        object.__setattr__(self, "prefix", self.prefix.strip("/"))
        if not isinstance(self.read_only, bool):
            raise ConfigError(f"Volume(read_only={self.read_only!r}) is not valid: True or False.")
        if self.storage is not None:
            from .storage import Storage

            if not isinstance(self.storage, Storage):
                raise ConfigError(
                    f"Volume(storage={self.storage!r}) is not valid: pass a sky.Storage, e.g. "
                    f"sky.storage.S3(region='us-east-1'), or None for the provider's own store."
                )

    @property
    def source(self) -> str:
        """``bucket`` or ``bucket/prefix``: what the mount shows at its root."""
        return f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket


def _check_mount(mount: object) -> str:
    why = ""
    norm = ""
    if not isinstance(mount, str) or not mount.startswith("/"):
        why = "it must be an absolute path"
    elif any(c.isspace() or c in "\\'\"$`" for c in mount):
        why = "it may not contain spaces, quotes, '$' or backslashes"
    else:
        norm = posixpath.normpath(mount)
        if norm.startswith("//"):
            norm = norm[1:]
        if norm in _VOLUME_RESERVED:
            why = f"{norm} is a system folder the node needs (not one of {', '.join(_VOLUME_RESERVED)})"
        elif norm.startswith("/opt/skyward/") or "/.skyward" in norm or norm.startswith("/proc/") \
                or norm.startswith("/sys/") or norm.startswith("/dev/"):
            why = "it is inside skyward's own folders on the node (or a kernel file system)"
        elif norm.count("/") == 2 and norm.startswith("/home/"):
            why = f"{norm} is a user's home: the bucket would hide the node's ~/.skyward (and the rest of it)"
    if why:
        raise ConfigError(
            f"Volume(mount={mount!r}) is not valid: {why}. Use a folder of its own, e.g. mount='/data' "
            f"or '/mnt/datasets'."
        )
    return norm
