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
from typing import TYPE_CHECKING, Any

from . import accelerators, time
from .errors import (
    AcceleratorError,
    ConfigError,
    DispatchError,
    NoActivePoolError,
    NodeLostError,
    PoolClosedError,
    ProtocolError,
    ProviderError,
    RemoteError,
    SerializationError,
    SkywardError,
    TaskTimeoutError,
    WorkerDiedError,
)
from .function import PendingFunction, PendingFunctionGroup, RemoteFunction, function, gather
from .spec import Image, Nodes, Options, PipIndex, Spec, Worker

__version__ = "0.1.0"

# name -> module that defines it; imported on first attribute access.
_LAZY = {
    "Compute": "skyward.compute",
    "Session": "skyward.compute",
    "Pool": "skyward.pool",
    "Local": "skyward.providers.local",
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
}

if TYPE_CHECKING:
    from .compute import Compute, Session
    from .pool import Pool
    from .providers.local import Local
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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'skyward' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AcceleratorError",
    "AcceleratorInfo",
    "CallbackWriter",
    "Compute",
    "ConfigError",
    "DispatchError",
    "Image",
    "InstanceInfo",
    "Local",
    "NetworkInfo",
    "NoActivePoolError",
    "NodeLostError",
    "Nodes",
    "Options",
    "PeerInfo",
    "PendingFunction",
    "PendingFunctionGroup",
    "PipIndex",
    "Pool",
    "PoolClosedError",
    "ProtocolError",
    "ProviderError",
    "RemoteError",
    "RemoteFunction",
    "SerializationError",
    "Session",
    "SkywardError",
    "Spec",
    "TaskTimeoutError",
    "Worker",
    "WorkerDiedError",
    "__version__",
    "accelerators",
    "function",
    "gather",
    "instance_info",
    "is_head",
    "redirect_output",
    "shard",
    "silent",
    "stderr",
    "stdout",
    "time",
]
