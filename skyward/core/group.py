"""Groups: a pool is a set of named groups of nodes, each with its own spec and provider.

A pool opened from one spec is one group (``DEFAULT_GROUP``); ``sky.Compute(groups={...})``
gives it several. Each ``Group`` holds the parts that run one kind of node (membership,
dispatch, batches, healing, the autoscaler: what skyward.core.pool describes); the pool holds
the groups, the collections they share and the lifecycle. ``pool["name"]`` is a ``GroupTarget``:
a dispatch target for that group's nodes only.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigError
from ..spec import Nodes, NodeSpec, Options, Spec, Worker
from .batches import Batches
from .dispatch import Dispatcher
from .healing import Healing
from .membership import Membership
from .target import DispatchTarget

if TYPE_CHECKING:
    from ..observe import events as ev
    from ..providers.base import Cluster
    from ..runtime.collections import ClientState
    from .autoscale import Autoscaler
    from .function import PendingFunction, PendingFunctionGroup
    from .membership import PoolSnapshot
    from .pool import Pool

T = TypeVar("T")

DEFAULT_GROUP = "default"
"""The name of the one group of a pool opened from one spec (``pool["default"]``)."""

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")


def check_groups(groups: Any, head: Any) -> dict[str, tuple[Spec, ...]]:
    """``sky.Compute(groups=...)`` as ``{name: alternatives}``, refusing what cannot be a pool."""
    if not isinstance(groups, Mapping) or not groups:
        raise ConfigError(
            f"groups={groups!r} is not valid: give a dict of group name -> sky.Spec, e.g. "
            f"groups={{'prep': sky.Spec(nodes=4), 'train': sky.Spec(nodes=2, accelerator='A100')}}."
        )
    out: dict[str, tuple[Spec, ...]] = {}
    for name, value in groups.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigError(
                f"group name {name!r} is not valid: a name starts with a letter and has up to 32 "
                f"letters, digits, '-' or '_' (e.g. 'prep', 'train-a100')."
            )
        specs = value if isinstance(value, tuple) else (value,)
        if not specs or not all(isinstance(s, Spec) for s in specs):
            raise ConfigError(
                f"groups[{name!r}]={value!r} is not valid: a group is a sky.Spec(...), or a tuple of "
                f"alternative sky.Spec(...) picked by Options(selection=...)."
            )
        out[name] = specs
    if head is not None and head not in out:
        raise ConfigError(
            f"head={head!r} names no group of this pool (its groups: {', '.join(map(repr, out))}); "
            f"name the group whose first node holds the pool's collections, or leave head= out."
        )
    return out


class Group:
    """The parts that run one group's nodes (see skyward.core.pool for each part)."""

    def __init__(self, name: str, spec: Spec, pool_id: str, pool_name: str | None, options: Options,
                 worker: Worker, emit: Callable[[ev.Event], None]) -> None:
        self.name, self.spec = name, spec
        self.members = Membership(pool_id, pool_name, spec, options, worker, emit)
        self.members.group = name

    def wire(self, shared: ClientState, options: Options, worker: Worker, emit: Callable[[ev.Event], None],
             settle: Callable[[], None]) -> None:
        """Build the parts on the group's membership (``shared``: the pool's collections)."""
        members = self.members
        self.healing = Healing(members, options, shared, emit)
        self.dispatcher = Dispatcher(members, options, emit)
        self.batches = Batches(self.dispatcher, options, worker, settle)
        # The autoscaler is made when first used (``autoscaler``): a pool that is never elastic
        # and that nothing asks for it does not load skyward.core.autoscale (0.6 ms of its start).
        self._autoscaler: Autoscaler | None = None
        self._autoscaler_lock = threading.Lock()
        self._options, self._worker = options, worker
        members.on_lost = self.healing.node_lost
        members.on_nested = self.dispatcher.route_nested
        members.on_heartbeat.append(self.dispatcher.audit)

    @property
    def autoscaler(self) -> Autoscaler:
        """The group's elastic size loop (skyward.core.autoscale), made on first use."""
        if self._autoscaler is None:
            from .autoscale import Autoscaler

            with self._autoscaler_lock:
                if self._autoscaler is None:
                    self._autoscaler = Autoscaler(self.members, self._options, self._worker)
        return self._autoscaler

    def start_autoscaler(self) -> None:
        """Start the autoscaler's loop if the group is elastic now. A group that is not does not
        make one (its ``Autoscaler.start`` would return at once)."""
        if self.members.nodes.elastic:
            self.autoscaler.start()

    @property
    def cluster(self) -> Cluster:
        return self.members.cluster

    def resize(self, nodes: NodeSpec) -> None:
        """The group's new size (and, with sky.Nodes, its elastic range), now."""
        self.dispatcher.check_open()
        members = self.members
        if nodes == 0 and isinstance(nodes, int) and not isinstance(nodes, bool):
            # to sleep: the next task wakes it, up to the size it had (or its elastic ceiling)
            nodes = Nodes(desired=0, max=members.nodes.max or max(1, members.nodes.desired))
        size = Nodes.of(nodes)
        if isinstance(nodes, int) and members.nodes.max is not None and size.desired <= members.nodes.max:
            size = Nodes(desired=size.desired, max=members.nodes.max)  # keep the elastic range
        members.check_growth(members.size(), size.desired)  # before the range changes
        members.nodes = size
        members.scale_to(size.desired)
        self.autoscaler.start()


class GroupTarget(DispatchTarget):
    """``pool["name"]``: one group of a pool as a dispatch target (``>>``, ``@``, ``>``, ``&``,
    ``map``...): its work runs on that group's nodes only."""

    __slots__ = ("group", "pool")

    def __init__(self, pool: Pool, group: Group) -> None:
        self.pool, self.group = pool, group

    def __repr__(self) -> str:
        return f"<group {self.group.name!r} of pool {self.pool.name or self.pool.label or self.pool.id}>"

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def spec(self) -> Spec:
        return self.group.spec

    def run(self, pending: PendingFunction[T], *, target: int | str | None = None) -> T:
        """Run on one of the group's nodes (``target``: 'head' or a rank within the group)."""
        return self.group.dispatcher.run(pending, target=target)

    def run_async(self, pending: PendingFunction[T], *, target: int | str | None = None) -> Future[T]:
        return self.group.dispatcher.run_async(pending, target=target)

    def broadcast(self, pending: PendingFunction[T]) -> list[T]:
        """Run on every node of the group; results in group-rank order."""
        return self.group.dispatcher.broadcast(pending)

    def run_parallel(self, items: PendingFunctionGroup) -> tuple[Any, ...] | Iterator[Any]:
        return self.group.batches.run_parallel(items)

    def map(self, fn: Callable[..., Any], items: Iterable[Any], *, chunksize: int | None = None,
            timeout: float | None = None) -> list[Any]:
        """``fn(item)`` for every item over the group's nodes; results in input order."""
        return self.group.batches.map(fn, items, chunksize=chunksize, timeout=timeout)

    def current_nodes(self) -> int:
        return self.group.members.current_nodes()

    @property
    def concurrency(self) -> int:
        return self.current_nodes() * self.pool.worker.slots

    def snapshot(self) -> PoolSnapshot:
        return self.group.members.snapshot()

    def resize(self, nodes: NodeSpec) -> None:
        """Change this group's size now (0 puts it to sleep; a task sent to it wakes it)."""
        self.group.resize(nodes)
