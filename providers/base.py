"""What every provider gives the pool: a Cluster of reachable nodes running the agent."""

from __future__ import annotations

import abc
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from skyward.spec import Spec


@dataclass(frozen=True)
class NodeEndpoint:
    """One running node: where its agent is and how to open a connection to it."""

    index: int
    private_ip: str
    public_ip: str | None
    hostname: str
    connect: Callable[[], socket.socket]


class Cluster(abc.ABC):
    """A provider's live nodes for one pool; destroyed by ``close`` (idempotent)."""

    token: str
    head_port: int
    interface: str = "lo"
    # A directory the client and the nodes both see (Local only): large buffers travel as
    # files there instead of through the sockets. None for remote nodes.
    spill_dir: Path | None = None

    @abc.abstractmethod
    def start(self, count: int) -> list[NodeEndpoint]:
        """Start ``count`` more nodes (indices continue after the existing ones)."""

    @abc.abstractmethod
    def stop(self, endpoints: list[NodeEndpoint]) -> None:
        """Stop these nodes (their agents were already asked to shut down)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Destroy every node and everything created for them."""


class ProviderConfig:
    """Base of sky.Local, sky.SSH, sky.AWS, sky.GCP: configuration plus a factory of clusters."""

    is_skyward_provider: ClassVar[bool] = True
    kind: ClassVar[str] = "?"

    def check(self, spec: Spec) -> str | None:
        """Why this provider cannot serve ``spec`` (None when it can)."""
        return None

    def hourly_cost(self, spec: Spec) -> float | None:
        """Estimated cost per node-hour in USD (None when unknown)."""
        return None

    def create(self, spec: Spec, pool_id: str) -> Cluster:
        raise NotImplementedError
