"""sky.RunPod and sky.VastAI: the reference API's GPU-marketplace configurations, as names only.

This version of skyward cannot rent from either marketplace. The classes exist so that code
written for the reference API builds its configurations (a ``sky.containers`` image in
``RunPod(container_image=...)``, ``VastAI(docker_image=...)``) and a pool that lists them among
several specs falls through to the next one; a pool with no other spec fails before anything is
created, saying what to use instead (``check``, read by ``select_spec``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from skyward.containers import DockerImage
from skyward.errors import ConfigError

from .base import ProviderConfig

if TYPE_CHECKING:
    from skyward.spec import Spec


def _check_image(owner: str, field: str, value: object) -> None:
    if value is None or isinstance(value, DockerImage):
        return
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"sky.{owner}({field}={value!r}): give an image tag or a sky.DockerImage, e.g. "
            f"{field}=sky.containers.cuda('12.9')."
        )


def _not_here(name: str, image: str | DockerImage | None) -> str:
    try_it = f"sky.Container(image={str(image)!r})" if image is not None else "sky.Container(image=...)"
    return (
        f"this version of skyward cannot rent {name} machines; run the same image on this machine "
        f"with {try_it}, or use sky.AWS(), sky.GCP() or sky.SSH(hosts=[...]) for GPUs"
    )


@dataclass(frozen=True, slots=True)
class RunPod(ProviderConfig):
    """RunPod's GPU pods (not rented by this version: see the module's docstring)."""

    container_image: str | DockerImage | None = None
    kind: ClassVar[str] = "runpod"

    def __post_init__(self) -> None:
        _check_image("RunPod", "container_image", self.container_image)

    def check(self, spec: Spec) -> str | None:
        return _not_here("RunPod", self.container_image)


@dataclass(frozen=True, slots=True)
class VastAI(ProviderConfig):
    """Vast.ai's GPU market (not rented by this version: see the module's docstring)."""

    docker_image: str | DockerImage | None = None
    kind: ClassVar[str] = "vastai"

    def __post_init__(self) -> None:
        _check_image("VastAI", "docker_image", self.docker_image)

    def check(self, spec: Spec) -> str | None:
        return _not_here("Vast.ai", self.docker_image)
