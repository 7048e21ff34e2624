"""The Plugin type: one named bundle of hooks, and the records its launcher hook works on.

A plugin is data: a frozen dataclass whose fields are optional callables. Built-in plugins
are factory functions that close over their parameters and chain ``with_*`` builders; a
user's plugin is built the same way. This module imports nothing heavy (it is unpickled on
every node, inside the agent too).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from skyward.errors import ConfigError

if TYPE_CHECKING:
    from skyward.core.pool import Pool
    from skyward.providers.base import Cluster
    from skyward.runtime.info import InstanceInfo
    from skyward.spec import Image

# One shell command, run with bash on the node after the Image's own bootstrap phases.
Op = str
ImageTransform = Callable[["Image", "Cluster"], "Image"]
BootstrapFactory = Callable[["Cluster"], "tuple[Op, ...]"]
TaskDecorator = Callable[[Callable[..., Any]], Callable[..., Any]]
AppLifecycle = Callable[["InstanceInfo"], AbstractContextManager[None]]
ProcessLifecycle = Callable[["InstanceInfo"], AbstractContextManager[None]]
ClientLifecycle = Callable[["Pool", "Cluster"], AbstractContextManager[None]]


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """How a node starts one worker: ``launcher`` (a wrapper such as ``accelerate launch
    --num_machines 2``; empty = none) runs ``entrypoint`` (a shell fragment) with ``args``."""

    launcher: str = ""
    entrypoint: str = ""
    args: tuple[str, ...] = ()

    def render(self) -> str:
        """The whole command as one shell string (args are quoted, the rest is taken as is)."""
        parts = [self.launcher.strip(), self.entrypoint.strip(), *map(shlex.quote, self.args)]
        return " ".join(p for p in parts if p)


@dataclass(frozen=True, slots=True)
class LaunchContext:
    """What a launcher hook knows about the node whose worker it wraps.

    ``casty_port`` keeps the reference API's name: here it is the pool's rendezvous port
    (``InstanceInfo.head_port``).
    """

    node_id: int
    num_nodes: int
    head_addr: str
    casty_port: int
    private_ip: str
    python_bin: str
    venv_dir: str
    concurrency: int
    executor: str


LauncherTransform = Callable[[LaunchCommand, LaunchContext], LaunchCommand]


class AccelerateConfig(TypedDict, total=False):
    """``accelerate config`` YAML as a dict. Topology fields (num_machines, machine_rank,
    main_process_ip, main_process_port, compute_environment) are filled in per node;
    ``num_processes`` counts processes over the whole pool (default: one per node)."""

    distributed_type: Literal["NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED", "XLA"]
    mixed_precision: Literal["no", "fp16", "bf16", "fp8"]
    num_processes: int
    num_cpu_threads_per_process: int
    gpu_ids: str
    same_network: bool
    debug: bool
    downcast_bf16: bool
    rdzv_backend: str
    fsdp: dict[str, Any]
    deepspeed: dict[str, Any]


_HOOKS = ("transform", "bootstrap", "decorate", "around_app", "around_process", "around_client", "launcher")


@dataclass(frozen=True, slots=True)
class Plugin:
    """A named bundle of optional hooks; docs/guides/plugins.md says when each one runs.

    ``transform(image, cluster) -> Image`` and ``bootstrap(cluster) -> tuple[str, ...]`` run
    on the client before the nodes start; ``around_client(pool, cluster)`` wraps the pool's
    ``with`` block in your thread; ``around_app(info)`` wraps each worker process's life,
    ``around_process(info)`` each process-executor worker from its first task,
    ``decorate(fn)`` each call, and ``launcher(cmd, ctx)`` rewrites how workers start.
    """

    name: str
    transform: ImageTransform | None = None
    bootstrap: BootstrapFactory | None = None
    decorate: TaskDecorator | None = None
    around_app: AppLifecycle | None = None
    around_process: ProcessLifecycle | None = None
    around_client: ClientLifecycle | None = None
    launcher: LauncherTransform | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"Plugin(name={self.name!r}) is not valid: give the plugin a non-empty name.")
        for hook in _HOOKS:
            value = getattr(self, hook)
            if value is not None and not callable(value):
                raise ConfigError(
                    f"Plugin {self.name!r}: {hook}={value!r} is not callable; pass a function "
                    f"(or leave the hook out)."
                )

    @staticmethod
    def create(name: str) -> Plugin:
        """An empty plugin; attach hooks with the ``with_*`` methods."""
        return Plugin(name)

    def with_image_transform(self, transform: ImageTransform) -> Plugin:
        return replace(self, transform=transform)

    def with_bootstrap(self, factory: BootstrapFactory) -> Plugin:
        return replace(self, bootstrap=factory)

    def with_decorator(self, decorate: TaskDecorator) -> Plugin:
        return replace(self, decorate=decorate)

    def with_around_app(self, around: AppLifecycle) -> Plugin:
        return replace(self, around_app=around)

    def with_around_process(self, around: ProcessLifecycle) -> Plugin:
        return replace(self, around_process=around)

    def with_around_client(self, around: ClientLifecycle) -> Plugin:
        return replace(self, around_client=around)

    def with_launcher(self, launcher: LauncherTransform) -> Plugin:
        return replace(self, launcher=launcher)

    @property
    def hooks(self) -> tuple[str, ...]:
        """The names of the hooks this plugin sets."""
        return tuple(h for h in _HOOKS if getattr(self, h) is not None)


def around_app(name: str, around: AppLifecycle) -> Plugin:
    """A plugin with only a worker lifecycle hook."""
    return Plugin.create(name).with_around_app(around)


def around_process(name: str, around: ProcessLifecycle) -> Plugin:
    """A plugin with only a per-process (process executor) lifecycle hook."""
    return Plugin.create(name).with_around_process(around)


def around_client(name: str, around: ClientLifecycle) -> Plugin:
    """A plugin with only a client-side lifecycle hook."""
    return Plugin.create(name).with_around_client(around)
