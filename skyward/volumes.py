"""Storage attached to nodes: ``sky.Disk`` (a block volume made with each cloud node).

    sky.Compute(provider=sky.AWS(), nodes=2, volumes=[sky.Disk(200, mount="/data")])

Each node gets its own new, empty disk of ``size_gb``, formatted (ext4) and mounted at
``mount`` before the bootstrap runs, and deleted with the pool. AWS: an EBS volume (``type``
defaults to gp3); GCP: a persistent disk (``type`` defaults to pd-balanced).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

_RESERVED = ("/", "/opt", "/opt/skyward", "/root", "/tmp", "/home", "/usr", "/etc", "/var", "/boot")


@dataclass(frozen=True, slots=True)
class Disk:
    """A new block volume of ``size_gb`` GB on every node, mounted at ``mount``."""

    size_gb: int
    mount: str = "/data"
    type: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.size_gb, bool) or not isinstance(self.size_gb, int) or self.size_gb < 1:
            raise ConfigError(f"Disk(size_gb={self.size_gb!r}) is not valid: a whole number of GB >= 1.")
        mount = self.mount.rstrip("/") or "/" if isinstance(self.mount, str) else ""
        if not mount.startswith("/") or mount in _RESERVED or any(c.isspace() for c in mount):
            raise ConfigError(
                f"Disk(mount={self.mount!r}) is not valid: an absolute path without spaces, not one of "
                f"{', '.join(_RESERVED)}. Use e.g. mount='/data'."
            )
