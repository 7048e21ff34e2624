"""Plugins: bring a framework into a pool with one line.

    import skyward as sky

    with sky.Compute(nodes=2, plugins=[sky.plugins.torch()]) as pool:
        ...

``Plugin`` and its builders are light; each built-in loads on first use and imports its
framework only where a hook runs (on the nodes, or in the pool block for joblib/sklearn).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .plugin import (
    AccelerateConfig,
    LaunchCommand,
    LaunchContext,
    Plugin,
    around_app,
    around_client,
    around_process,
)

_LAZY = {
    "prepare": "skyward.plugins.compose",
    "torch": "skyward.plugins.frameworks",
    "jax": "skyward.plugins.frameworks",
    "keras": "skyward.plugins.frameworks",
    "accelerate": "skyward.plugins.frameworks",
    "huggingface": "skyward.plugins.frameworks",
    "joblib": "skyward.plugins.parallel",
    "sklearn": "skyward.plugins.parallel",
    "cuml": "skyward.plugins.gpu",
    "mig": "skyward.plugins.gpu",
    "mps": "skyward.plugins.gpu",
    "mlflow": "skyward.plugins.trackers",
    "wandb": "skyward.plugins.trackers",
    "SkywardBackend": "skyward.plugins.backend",
}

if TYPE_CHECKING:
    from .backend import SkywardBackend
    from .compose import prepare
    from .frameworks import accelerate, huggingface, jax, keras, torch
    from .gpu import cuml, mig, mps
    from .parallel import joblib, sklearn
    from .trackers import mlflow, wandb


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'skyward.plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AccelerateConfig",
    "LaunchCommand",
    "LaunchContext",
    "Plugin",
    "SkywardBackend",
    "accelerate",
    "around_app",
    "around_client",
    "around_process",
    "cuml",
    "huggingface",
    "jax",
    "joblib",
    "keras",
    "mig",
    "mlflow",
    "mps",
    "prepare",
    "sklearn",
    "torch",
    "wandb",
]
