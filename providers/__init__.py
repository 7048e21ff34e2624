"""Providers: one module per way of getting nodes (Local, SSH, Slurm, Container, AWS, GCP).

``PROVIDERS`` names them by kind (``provider = "aws"`` in skyward.toml, the CLI's
``--provider``); a provider's module loads only when a pool uses it.
"""

from __future__ import annotations

import importlib

from skyward.errors import ConfigError

TYPE_CHECKING = False  # (not from typing: node processes import this; see skyward/__init__)

if TYPE_CHECKING:
    from .base import ProviderConfig

# provider kind -> (module, class); a module loads only when a pool uses it.
PROVIDERS: dict[str, tuple[str, str]] = {
    "local": ("skyward.providers.local", "Local"),
    "ssh": ("skyward.providers.ssh", "SSH"),
    "slurm": ("skyward.providers.slurm", "Slurm"),
    "container": ("skyward.providers.container", "Container"),
    "aws": ("skyward.providers.aws", "AWS"),
    "gcp": ("skyward.providers.gcp", "GCP"),
}


def provider_class(kind: str) -> type[ProviderConfig]:
    module, name = PROVIDERS[kind]
    try:
        cls: type[ProviderConfig] = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise ConfigError(
            f"provider {kind!r} is not available in this version of skyward ({module} is "
            f"missing); use provider = 'local' (or another that `skyward --help` lists)."
        ) from None
    return cls


def default_provider() -> ProviderConfig:
    """sky.Local(): the provider of a Spec that names none (skyward/__init__.py hands this to
    skyward.spec)."""
    from .local import Local

    return Local()
