"""Base container images by name: ``sky.containers.cuda("12.9")`` instead of a tag typed by hand.

Each helper returns a :class:`DockerImage`, whose ``str()`` is the full tag and which also says
which CUDA and Ubuntu it carries (``None`` when it carries none, or when nobody said)::

    sky.containers.cuda("12.9")                          # nvidia/cuda:12.9.1-cudnn-runtime-ubuntu22.04
    sky.containers.cuda("12.9", variant="devel", ubuntu="24.04")
    sky.containers.cuda("12.9", repository="nvidia")     # the same image from nvcr.io
    sky.containers.ubuntu("24.04")                       # ubuntu:24.04
    sky.containers.pytorch("2.8")                        # NVIDIA's NGC PyTorch image
    sky.containers.runpod_pytorch("2.8")                 # RunPod's PyTorch image
    sky.DockerImage.of("my-registry.io/team/base:3", cuda="12.8", ubuntu="22.04")

A ``DockerImage`` goes wherever a tag string does: ``sky.Container(image=...)``.

The tables below name the releases this version of skyward knows. A CUDA release it does not
know still gives a tag (its ``.0`` patch release, which NVIDIA publishes first); a PyTorch or
RunPod version it does not know gives the repository's ``latest``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from skyward.errors import ConfigError

CudaVariant = Literal["runtime", "devel", "base", "cudnn-runtime", "cudnn-devel"]
Repository = Literal["dockerhub", "nvidia"]

# CUDA major.minor -> the newest patch release NVIDIA publishes images of.
CUDA_RELEASES: dict[str, str] = {
    "11.8": "11.8.0",
    "12.1": "12.1.1",
    "12.2": "12.2.2",
    "12.4": "12.4.1",
    "12.6": "12.6.3",
    "12.8": "12.8.1",
    "12.9": "12.9.1",
}

# PyTorch major.minor -> (NGC container release, the CUDA it is built with).
NGC_PYTORCH: dict[str, tuple[str, str]] = {
    "2.6": ("24.11", "12.6"),
    "2.7": ("25.03", "12.8"),
    "2.8": ("25.04", "12.9"),
}

# CUDA major.minor -> RunPod's base image of it.
RUNPOD_BASE: dict[str, str] = {
    "12.6": "runpod/base:1.0.3-cuda1260-ubuntu2204",
    "12.8": "runpod/base:1.0.3-cuda1280-ubuntu2204",
    "12.9": "runpod/base:1.0.3-cuda1290-ubuntu2204",
}

# PyTorch major.minor -> (RunPod's PyTorch image, the CUDA in it).
RUNPOD_PYTORCH: dict[str, tuple[str, str]] = {
    "2.6": ("runpod/pytorch:2.6.0-py3.12-cuda12.6.3-devel-ubuntu24.04", "12.6"),
    "2.7": ("runpod/pytorch:2.7.0-py3.13-cuda12.8.1-devel-ubuntu24.04", "12.8"),
    "2.8": ("runpod/pytorch:2.8.0-py3.13-cuda12.8.1-devel-ubuntu24.04", "12.8"),
}

_VARIANTS = ("runtime", "devel", "base", "cudnn-runtime", "cudnn-devel")
_REGISTRIES = {"dockerhub": "nvidia/cuda", "nvidia": "nvcr.io/nvidia/cuda"}


@dataclass(frozen=True, slots=True)
class DockerImage:
    """A container image's tag (``str(image)``), with the CUDA and Ubuntu versions it carries."""

    tag: str
    cuda: str | None = None
    ubuntu: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tag, str) or not self.tag.strip() or any(c.isspace() for c in self.tag):
            raise ConfigError(
                f"DockerImage(tag={self.tag!r}) is not an image tag: give one such as "
                f"'docker.io/library/python:3.12-slim'."
            )
        for name in ("cuda", "ubuntu"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(
                    f"DockerImage({name}={value!r}) is not valid: give a version string such as "
                    f"{'12.8' if name == 'cuda' else '24.04'!r}, or leave it out."
                )

    def __str__(self) -> str:
        return self.tag

    @classmethod
    def of(cls, tag: str, *, cuda: str | None = None, ubuntu: str | None = None) -> DockerImage:
        """Any tag, with the CUDA and Ubuntu versions it carries when you know them."""
        return cls(tag=tag, cuda=cuda, ubuntu=ubuntu)


def _minor(version: str, what: str) -> str:
    parts = version.split(".") if isinstance(version, str) else []
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise ConfigError(
            f"{what}({version!r}) is not a version: give major.minor, e.g. {what}('12.9')."
        )
    return ".".join(parts[:2])


def cuda(
    version: str,
    *,
    variant: CudaVariant = "cudnn-runtime",
    ubuntu: str = "22.04",
    repository: Repository = "dockerhub",
) -> DockerImage:
    """NVIDIA's CUDA image: ``nvidia/cuda:<release>-<variant>-ubuntu<ubuntu>``.

    ``version`` is major.minor (its newest known patch release is used) or a full release
    (``"12.4.1"``, used as given). ``variant``: ``"cudnn-runtime"`` (default), ``"runtime"``,
    ``"devel"``, ``"cudnn-devel"`` or ``"base"``. ``repository``: ``"dockerhub"`` (default) or
    ``"nvidia"`` (the same images from ``nvcr.io``).
    """
    minor = _minor(version, "sky.containers.cuda")
    if variant not in _VARIANTS:
        raise ConfigError(
            f"sky.containers.cuda(variant={variant!r}) is not one of NVIDIA's variants: use "
            f"{', '.join(repr(v) for v in _VARIANTS)}."
        )
    if repository not in _REGISTRIES:
        raise ConfigError(
            f"sky.containers.cuda(repository={repository!r}) is not known: use 'dockerhub' "
            f"(nvidia/cuda) or 'nvidia' (nvcr.io/nvidia/cuda)."
        )
    release = version if version.count(".") == 2 else CUDA_RELEASES.get(minor, f"{minor}.0")
    tag = f"{_REGISTRIES[repository]}:{release}-{variant}-ubuntu{ubuntu}"
    return DockerImage(tag=tag, cuda=minor, ubuntu=ubuntu)


def ubuntu(version: str = "24.04") -> DockerImage:
    """Ubuntu's own image, ``ubuntu:<version>`` (no CUDA)."""
    return DockerImage(tag=f"ubuntu:{version}", ubuntu=version)


def pytorch(version: str, *, cuda: str | None = None) -> DockerImage:
    """NVIDIA's NGC PyTorch image of that PyTorch release (``nvcr.io/nvidia/pytorch:YY.MM-py3``).

    ``cuda`` overrides the CUDA version recorded on the image (default: the one NGC builds that
    release with). A version this table does not know gives ``nvcr.io/nvidia/pytorch:latest``,
    whose CUDA is then only what ``cuda`` says.
    """
    known = NGC_PYTORCH.get(version)
    if known is None:
        return DockerImage(tag="nvcr.io/nvidia/pytorch:latest", cuda=cuda)
    release, built_with = known
    return DockerImage(tag=f"nvcr.io/nvidia/pytorch:{release}-py3", cuda=cuda or built_with)


def runpod_base(*, cuda: str = "12.9") -> DockerImage:
    """RunPod's base image (Ubuntu with CUDA, SSH and Jupyter) for that CUDA version."""
    return DockerImage(tag=RUNPOD_BASE.get(cuda, "runpod/base:latest"), cuda=cuda)


def runpod_pytorch(version: str = "2.8", *, cuda: str | None = None) -> DockerImage:
    """RunPod's PyTorch image of that PyTorch release (``cuda`` overrides the recorded CUDA)."""
    tag, built_with = RUNPOD_PYTORCH.get(version, ("runpod/pytorch:latest", None))
    return DockerImage(tag=tag, cuda=cuda or built_with)


__all__ = [
    "CUDA_RELEASES",
    "NGC_PYTORCH",
    "RUNPOD_BASE",
    "RUNPOD_PYTORCH",
    "CudaVariant",
    "DockerImage",
    "Repository",
    "cuda",
    "pytorch",
    "runpod_base",
    "runpod_pytorch",
    "ubuntu",
]
