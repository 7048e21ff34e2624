"""InstanceInfo: where the running task sits in the pool."""

from __future__ import annotations

import socket
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from . import context


class PeerInfo(BaseModel):
    """One node of the pool as a task sees it: its rank and addresses."""

    model_config = ConfigDict(frozen=True)

    node: int
    private_ip: str
    public_ip: str | None = None


def _own_devices() -> tuple[str, ...]:
    """The GPUs that are this node's own, as sky.Local hands them out (SKYWARD_GPUS, what its
    CUDA_VISIBLE_DEVICES names); () where the node's GPUs are all of its machine's."""
    import os

    return tuple(d for d in os.environ.get("SKYWARD_GPUS", "").split(",") if d)


class AcceleratorInfo(BaseModel):
    """The accelerators of this node: type, count (a fraction: its share of one) and memory per
    device (GB). ``devices``: on a Local node, the GPUs that are its own (their UUIDs, as its
    CUDA_VISIBLE_DEVICES names them); empty where the node has all of its machine's."""

    model_config = ConfigDict(frozen=True)

    type: str
    count: float
    memory_gb: float | None = None
    is_trainium: bool = False
    devices: tuple[str, ...] = Field(default_factory=_own_devices)


class NetworkInfo(BaseModel):
    """This node's network interface and, where known, its bandwidth."""

    model_config = ConfigDict(frozen=True)

    interface: str
    bandwidth_gbps: float | None = None


class InstanceInfo(BaseModel):
    """This worker's place in the pool. ``worker`` indexes worker processes on a node: with the
    thread executor every task of a node runs in worker 0; with the process executor each
    process is a worker (``workers_per_node`` = concurrency)."""

    model_config = ConfigDict(frozen=True)

    node: int
    worker: int = 0
    total_nodes: int
    workers_per_node: int = 1
    accelerators: float = 0
    total_accelerators: float = 0
    head_addr: str
    head_port: int
    job_id: str
    peers: list[PeerInfo]
    accelerator: AcceleratorInfo | None = None
    network: NetworkInfo
    # The node's group (skyward.core.group): its name, the node's rank within it, the group's
    # size, nodes and first node. In a pool of one group these are the pool's own.
    group: str = "default"
    group_rank: int = -1
    group_size: int = -1
    group_peers: list[PeerInfo] = Field(default_factory=list)
    group_head_addr: str = ""
    group_head_port: int = 0

    @model_validator(mode="before")
    @classmethod
    def _group_defaults(cls, data: Any) -> Any:
        """A topology without group fields (one group, an older sender): the group is the pool."""
        if isinstance(data, dict) and "group_rank" not in data:
            data = {**data, "group_rank": data.get("node"), "group_size": data.get("total_nodes"),
                    "group_peers": data.get("peers", []), "group_head_addr": data.get("head_addr"),
                    "group_head_port": data.get("head_port")}
        return data

    @property
    def group_worker_index(self) -> int:
        """This worker's rank within its group (what a framework's world over the group uses)."""
        return self.group_rank * self.workers_per_node + self.worker

    @property
    def group_workers(self) -> int:
        return self.group_size * self.workers_per_node

    @property
    def global_worker_index(self) -> int:
        return self.node * self.workers_per_node + self.worker

    @property
    def total_workers(self) -> int:
        return self.total_nodes * self.workers_per_node

    @property
    def is_head(self) -> bool:
        return self.global_worker_index == 0

    @property
    def hostname(self) -> str:
        return socket.gethostname()

    @classmethod
    def current(cls) -> InstanceInfo:
        """The info of the task running in this thread, as ``sky.instance_info()`` (raises
        NoActivePoolError outside a task)."""
        return instance_info()


_cache: tuple[int, InstanceInfo] | None = None


def instance_info() -> InstanceInfo:
    """The InstanceInfo of the task running in this thread (raises outside a task)."""
    global _cache
    topo = context.topology()
    version = context.version()
    if _cache is None or _cache[0] != version:
        _cache = (version, InstanceInfo.model_validate(topo))
    return _cache[1]


current_instance_info = instance_info


def is_head(info: InstanceInfo | None = None) -> bool:
    """True on exactly one worker of the pool: node 0, worker 0."""
    return (info or instance_info()).is_head
