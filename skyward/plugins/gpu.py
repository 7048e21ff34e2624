"""GPU plugins: cuML, MIG and MPS. They render image changes, bootstrap ops and env; what
they do on the GPU needs NVIDIA drivers on the nodes (none of them runs on Local without)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from skyward.errors import ConfigError, PluginError

from .plugin import Plugin

# GPU slices of a whole A100/H100 per compute profile ("3g.40gb" -> 3 of 7 slices).
_SLICES = 7


def cuml(*, cuda: str = "cu12") -> Plugin:
    """RAPIDS cuML: installs ``cuml-<cuda>`` from NVIDIA's index and, on every worker, turns on
    ``cuml.accel`` so scikit-learn estimators run on the GPU unchanged."""
    if not re.fullmatch(r"cu\d+", cuda):
        raise ConfigError(f"cuml(cuda={cuda!r}) is not valid: use 'cu12' (or another 'cuNN').")
    package = f"cuml-{cuda}"

    def transform(image: Any, cluster: Any) -> Any:
        from skyward.spec import PipIndex

        pip = image.pip if package in image.pip else (*image.pip, package)
        return replace(image, pip=pip, pip_indexes=(
            *image.pip_indexes, PipIndex(url="https://pypi.nvidia.com", packages=(package,))))

    @contextlib.contextmanager
    def around_app(info: Any) -> Iterator[None]:
        import cuml.accel

        cuml.accel.install()
        yield

    return Plugin.create("cuml").with_image_transform(transform).with_around_app(around_app)


def mig_instances(profile: str) -> int:
    """How many instances of ``profile`` ("1g.10gb", "3g.40gb"...) fit on one GPU."""
    match = re.fullmatch(r"(\d)g\.(\d+)gb", profile)
    if not match or int(match.group(1)) not in (1, 2, 3, 4, 7):
        raise ConfigError(
            f"mig({profile!r}) is not a MIG profile: use '<slices>g.<memory>gb' such as "
            f"'1g.10gb', '2g.20gb', '3g.40gb', '4g.40gb' or '7g.80gb'."
        )
    return _SLICES // int(match.group(1))


def mig(profile: str) -> Plugin:
    """Partition every GPU into MIG instances of ``profile`` and give each worker one.

    Bootstrap enables MIG mode and creates ``7 // slices`` instances per node's GPU 0; each
    worker process then sees only its instance (CUDA_VISIBLE_DEVICES = its MIG UUID, by
    worker index). Use it with ``Worker(executor="process", concurrency=<instances>)`` so
    that each instance gets a process of its own."""
    count = mig_instances(profile)

    def transform(image: Any, cluster: Any) -> Any:
        return replace(image, env={**image.env, "SKYWARD_MIG_PROFILE": profile,
                                   "SKYWARD_MIG_INSTANCES": str(count)})

    def bootstrap(cluster: Any) -> tuple[str, ...]:
        profiles = ",".join([profile] * count)
        return (
            "sudo nvidia-smi -i 0 -mig 1",
            "sudo nvidia-smi mig -i 0 -dci || true",
            "sudo nvidia-smi mig -i 0 -dgi || true",
            f"sudo nvidia-smi mig -i 0 -cgi {profiles} -C",
        )

    @contextlib.contextmanager
    def around_app(info: Any) -> Iterator[None]:
        devices = _mig_uuids()
        if info.worker >= len(devices):
            raise PluginError(
                f"mig({profile!r}): worker {info.worker} on node {info.node} has no MIG instance "
                f"({len(devices)} found); use Worker(executor='process', concurrency={count})."
            )
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[info.worker]
        yield

    return (Plugin.create("mig").with_image_transform(transform).with_bootstrap(bootstrap)
            .with_around_app(around_app))


def _mig_uuids() -> list[str]:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return re.findall(r"\(UUID: (MIG-[^)]+)\)", out)


def mps(*, active_thread_percentage: int | None = None, pinned_memory_limit: str | None = None) -> Plugin:
    """NVIDIA MPS: concurrent tasks share each GPU through one MPS daemon per node.

    Sets CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY, optionally
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (1-100, the share of SMs per client) and
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=4G" or "4G" for every device), and starts the daemon
    during bootstrap (on Local, once for the machine).

    With a fractional accelerator count on Local (``sky.accelerators.A100(count=0.5)``: nodes
    that share one GPU), each node's processes get its share of the GPU's SMs as
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (50 for 0.5) unless ``active_thread_percentage`` (or the
    image's env) says otherwise."""
    if active_thread_percentage is not None and not 1 <= active_thread_percentage <= 100:
        raise ConfigError(
            f"mps(active_thread_percentage={active_thread_percentage!r}) is not valid: use 1-100."
        )
    env = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_LOG_DIRECTORY": "/tmp/nvidia-mps-log"}
    if active_thread_percentage is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(active_thread_percentage)
    if pinned_memory_limit is not None:
        limit = pinned_memory_limit if "=" in pinned_memory_limit else f"0={pinned_memory_limit}"
        if not re.fullmatch(r"(\d+=\d+[KMG],?)+", limit):
            raise ConfigError(
                f"mps(pinned_memory_limit={pinned_memory_limit!r}) is not valid: use '4G' or "
                f"per device '0=4G,1=2G'."
            )
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = limit

    def transform(image: Any, cluster: Any) -> Any:
        return replace(image, env={**image.env, **env})

    def bootstrap(cluster: Any) -> tuple[str, ...]:
        return (
            'mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"',
            "pgrep -x nvidia-cuda-mps-control >/dev/null || nvidia-cuda-mps-control -d",
        )

    @contextlib.contextmanager
    def around_app(info: Any) -> Iterator[None]:
        share = os.environ.get("SKYWARD_GPU_SHARE")  # a Local node's share of its GPU
        if share and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ:
            with contextlib.suppress(ValueError):
                percent = round(float(share) * 100)
                os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(100, max(1, percent)))
        yield

    return (Plugin.create("mps").with_image_transform(transform).with_bootstrap(bootstrap)
            .with_around_app(around_app))
