"""Skyward: run Python functions on pools of machines you rent or own.

    import skyward as sky

    @sky.function
    def square(x):
        return x * x

    with sky.Compute(nodes=2) as pool:        # sky.Local() by default
        print(pool.map(square, range(10)))

Everything public is re-exported here. Importing this module stays light: the parts that
need cloudpickle, pydantic or a provider load on first use.
"""

from __future__ import annotations

import importlib
import sys as _sys

from . import defaults as _defaults
from . import joblib_name as _joblib_name  # noqa: F401  (Parallel(backend="skyward") anywhere)
from .core.target import SkywardModule as _SkywardModule
from .errors import (
    AcceleratorError,
    BootstrapError,
    CollectionError,
    CollectionTimeoutError,
    ConfigError,
    DispatchError,
    HostKeyError,
    InheritedPoolError,
    NoActivePoolError,
    NodeLostError,
    NoOfferError,
    NoOffersError,
    PendingOperationsError,
    PluginError,
    PoolAsleepError,
    PoolBusyError,
    PoolClosedError,
    PoolExistsError,
    PoolNotFoundError,
    PoolStoppedError,
    ProtocolError,
    ProviderError,
    ProvisioningError,
    PulumiNotFoundError,
    RemoteError,
    SerializationError,
    ServeError,
    SkywardError,
    StackError,
    StackLockedError,
    StorageError,
    TaskCancelledError,
    TaskTimeoutError,
    WorkerDiedError,
)
from .providers import default_provider as _default_provider
from .version import __version__

# Not `from typing import TYPE_CHECKING`: node processes import this module, and typing
# would cost them a fifth of their start-up (type checkers know this spelling too).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Spec() with no provider gets sky.Local(): spec.py sits below the providers, so the package
# hands it the factory (skyward/defaults.py; it imports skyward.providers.local on first use).
_defaults.provider = _default_provider

# `1 >> sky` (a plain function's result pushed at the module) explains itself. The module and
# sky.sky (the reference project's singleton) both stand for the active pool.
_sys.modules[__name__].__class__ = _SkywardModule

# name -> module that defines it; imported on first attribute access.
_LAZY = {
    "accelerators": "skyward.accelerators",
    "containers": "skyward.containers",
    "DockerImage": "skyward.containers",
    "DEFAULT_IMAGE": "skyward.spec",
    "time": "skyward.time",
    "PendingFunction": "skyward.core.function",
    "PendingFunctionGroup": "skyward.core.function",
    "RemoteFunction": "skyward.core.function",
    "function": "skyward.core.function",
    "gather": "skyward.core.function",
    "sky": "skyward.core.function",
    "AllocationStrategy": "skyward.spec",
    "Image": "skyward.spec",
    "Nodes": "skyward.spec",
    "NodeSpec": "skyward.spec",
    "Options": "skyward.spec",
    "PipIndex": "skyward.spec",
    "PoolSpec": "skyward.spec",
    "SelectionStrategy": "skyward.spec",
    "Spec": "skyward.spec",
    "SpecKwargs": "skyward.spec",
    "Worker": "skyward.spec",
    "WorkerExecutor": "skyward.spec",
    "metrics": "skyward.metrics",
    "LogConfig": "skyward.observe.logs",
    "Secret": "skyward.observe.secrets",
    "secret": "skyward.observe.secrets",
    "subscribe": "skyward.observe.events",
    "Event": "skyward.observe.events",
    "ClusterRequested": "skyward.observe.events",
    "ClusterProvisioned": "skyward.observe.events",
    "ClusterReady": "skyward.observe.events",
    "ClusterAsleep": "skyward.observe.events",
    "ClusterWoke": "skyward.observe.events",
    "ClusterDestroyed": "skyward.observe.events",
    "ClusterDetached": "skyward.observe.events",
    "InstanceRequested": "skyward.observe.events",
    "InstanceProvisioned": "skyward.observe.events",
    "BootstrapPhase": "skyward.observe.events",
    "InstanceBootstrapped": "skyward.observe.events",
    "InstanceLost": "skyward.observe.events",
    "InstancePreempted": "skyward.observe.events",
    "InstanceReplaced": "skyward.observe.events",
    "InstanceDestroyed": "skyward.observe.events",
    "ResourceChanged": "skyward.observe.events",
    "ShutdownRequested": "skyward.observe.events",
    "ShutdownCompleted": "skyward.observe.events",
    "EndpointReady": "skyward.observe.events",
    "EndpointUpdated": "skyward.observe.events",
    "EndpointClosed": "skyward.observe.events",
    "EndpointStats": "skyward.observe.events",
    "ReplicaReady": "skyward.observe.events",
    "ReplicaLost": "skyward.observe.events",
    "Endpoint": "skyward.serve.endpoint",
    "ReplicaInfo": "skyward.serve.endpoint",
    "JobQueued": "skyward.observe.events",
    "BatchStarted": "skyward.observe.events",
    "BatchFinished": "skyward.observe.events",
    "TaskStarted": "skyward.observe.events",
    "TaskCompleted": "skyward.observe.events",
    "Metric": "skyward.observe.events",
    "Log": "skyward.observe.events",
    "Error": "skyward.observe.events",
    "Compute": "skyward.core.compute",
    "Session": "skyward.core.compute",
    "Pool": "skyward.core.pool",
    "HealthChecker": "skyward.health",
    "Offer": "skyward.catalogue",
    "InstanceType": "skyward.catalogue",
    "App": "skyward.observe.app",
    "main": "skyward.named.runscript",
    "NodeSnapshot": "skyward.core.membership",
    "PoolSnapshot": "skyward.core.membership",
    "offers": "skyward.catalogue",
    "Disk": "skyward.volumes",
    "Volume": "skyward.volumes",
    "Storage": "skyward.storage",
    "storage": "skyward.storage",
    "plugins": "skyward.plugins",
    "Local": "skyward.providers.local",
    "AWS": "skyward.providers.aws",
    "GCP": "skyward.providers.gcp",
    "SSH": "skyward.providers.ssh",
    "SSHHost": "skyward.providers.ssh",
    "Slurm": "skyward.providers.slurm",
    "Container": "skyward.providers.container",
    "RunPod": "skyward.providers.marketplaces",
    "VastAI": "skyward.providers.marketplaces",
    "InstanceInfo": "skyward.runtime.info",
    "PeerInfo": "skyward.runtime.info",
    "AcceleratorInfo": "skyward.runtime.info",
    "NetworkInfo": "skyward.runtime.info",
    "instance_info": "skyward.runtime.info",
    "is_head": "skyward.runtime.info",
    "shard": "skyward.runtime.shard",
    "stdout": "skyward.runtime.output",
    "stderr": "skyward.runtime.output",
    "silent": "skyward.runtime.output",
    "redirect_output": "skyward.runtime.output",
    "CallbackWriter": "skyward.runtime.output",
    "dict": "skyward.runtime.collections",
    "set": "skyward.runtime.collections",
    "counter": "skyward.runtime.collections",
    "queue": "skyward.runtime.collections",
    "barrier": "skyward.runtime.collections",
    "lock": "skyward.runtime.collections",
}

if TYPE_CHECKING:
    from . import accelerators, containers, metrics, plugins, storage, time
    from .catalogue import InstanceType, Offer, offers
    from .containers import DockerImage
    from .core.compute import Compute, Session
    from .core.function import (
        PendingFunction,
        PendingFunctionGroup,
        RemoteFunction,
        function,
        gather,
        sky,
    )
    from .core.membership import NodeSnapshot, PoolSnapshot
    from .core.pool import Pool
    from .health import HealthChecker
    from .named.runscript import main
    from .observe.app import App
    from .observe.events import (
        BatchFinished,
        BatchStarted,
        BootstrapPhase,
        ClusterAsleep,
        ClusterDestroyed,
        ClusterDetached,
        ClusterProvisioned,
        ClusterReady,
        ClusterRequested,
        ClusterWoke,
        EndpointClosed,
        EndpointReady,
        EndpointStats,
        EndpointUpdated,
        Error,
        Event,
        InstanceBootstrapped,
        InstanceDestroyed,
        InstanceLost,
        InstancePreempted,
        InstanceProvisioned,
        InstanceReplaced,
        InstanceRequested,
        JobQueued,
        Log,
        Metric,
        ReplicaLost,
        ReplicaReady,
        ResourceChanged,
        ShutdownCompleted,
        ShutdownRequested,
        TaskCompleted,
        TaskStarted,
        subscribe,
    )
    from .observe.logs import LogConfig
    from .observe.secrets import Secret, secret
    from .providers.aws import AWS
    from .providers.container import Container
    from .providers.gcp import GCP
    from .providers.local import Local
    from .providers.marketplaces import RunPod, VastAI
    from .providers.slurm import Slurm
    from .providers.ssh import SSH, SSHHost
    from .runtime.collections import make_barrier as barrier
    from .runtime.collections import make_counter as counter
    from .runtime.collections import make_dict as dict
    from .runtime.collections import make_lock as lock
    from .runtime.collections import make_queue as queue
    from .runtime.collections import make_set as set
    from .runtime.info import (
        AcceleratorInfo,
        InstanceInfo,
        NetworkInfo,
        PeerInfo,
        instance_info,
        is_head,
    )
    from .runtime.output import CallbackWriter, redirect_output, silent, stderr, stdout
    from .runtime.shard import shard
    from .spec import (
        DEFAULT_IMAGE,
        AllocationStrategy,
        Image,
        Nodes,
        NodeSpec,
        Options,
        PipIndex,
        PoolSpec,
        SelectionStrategy,
        Spec,
        SpecKwargs,
        Worker,
        WorkerExecutor,
    )
    from .storage import Storage
    from .volumes import Disk, Volume


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'skyward' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if mod.__name__ == f"skyward.{name}" else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [  # noqa: RUF022 - plain sorted order (checked by tests/test_public_api.py)
    "AWS",
    "AcceleratorError",
    "AcceleratorInfo",
    "AllocationStrategy",
    "App",
    "BatchFinished",
    "BatchStarted",
    "BootstrapError",
    "BootstrapPhase",
    "CallbackWriter",
    "ClusterAsleep",
    "ClusterDestroyed",
    "ClusterDetached",
    "ClusterProvisioned",
    "ClusterReady",
    "ClusterRequested",
    "ClusterWoke",
    "CollectionError",
    "CollectionTimeoutError",
    "Compute",
    "ConfigError",
    "Container",
    "DEFAULT_IMAGE",
    "Disk",
    "DispatchError",
    "DockerImage",
    "Endpoint",
    "EndpointClosed",
    "EndpointReady",
    "EndpointStats",
    "EndpointUpdated",
    "Error",
    "Event",
    "GCP",
    "HealthChecker",
    "HostKeyError",
    "Image",
    "InheritedPoolError",
    "InstanceBootstrapped",
    "InstanceDestroyed",
    "InstanceInfo",
    "InstanceLost",
    "InstancePreempted",
    "InstanceProvisioned",
    "InstanceReplaced",
    "InstanceRequested",
    "InstanceType",
    "JobQueued",
    "Local",
    "Log",
    "LogConfig",
    "Metric",
    "NetworkInfo",
    "NoActivePoolError",
    "NoOfferError",
    "NoOffersError",
    "NodeLostError",
    "NodeSnapshot",
    "NodeSpec",
    "Nodes",
    "Offer",
    "Options",
    "PeerInfo",
    "PendingFunction",
    "PendingFunctionGroup",
    "PendingOperationsError",
    "PipIndex",
    "PluginError",
    "Pool",
    "PoolAsleepError",
    "PoolBusyError",
    "PoolClosedError",
    "PoolExistsError",
    "PoolNotFoundError",
    "PoolSnapshot",
    "PoolSpec",
    "PoolStoppedError",
    "ProtocolError",
    "ProviderError",
    "ProvisioningError",
    "PulumiNotFoundError",
    "RemoteError",
    "RemoteFunction",
    "ReplicaInfo",
    "ReplicaLost",
    "ReplicaReady",
    "ResourceChanged",
    "RunPod",
    "SSH",
    "SSHHost",
    "Secret",
    "SelectionStrategy",
    "SerializationError",
    "ServeError",
    "Session",
    "ShutdownCompleted",
    "ShutdownRequested",
    "SkywardError",
    "Slurm",
    "Spec",
    "SpecKwargs",
    "StackError",
    "StackLockedError",
    "Storage",
    "StorageError",
    "TaskCancelledError",
    "TaskCompleted",
    "TaskStarted",
    "TaskTimeoutError",
    "VastAI",
    "Volume",
    "Worker",
    "WorkerDiedError",
    "WorkerExecutor",
    "__version__",
    "accelerators",
    "barrier",
    "containers",
    "counter",
    "dict",
    "function",
    "gather",
    "instance_info",
    "is_head",
    "lock",
    "main",
    "metrics",
    "offers",
    "plugins",
    "queue",
    "redirect_output",
    "secret",
    "set",
    "shard",
    "silent",
    "sky",
    "stderr",
    "stdout",
    "storage",
    "subscribe",
    "time",
]
