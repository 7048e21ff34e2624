"""A live pool: the ``Pool`` its users hold, and the wiring of its parts.

Each part is an object with its own state; dependencies run one way, and the pool wires them:

* ``members`` (skyward.core.membership): the node table and each node's readiness, connecting,
  configuring and resizing nodes, the lease heartbeat. Calls no other part: what happens on a
  loss, a nested task or a stop from outside is wired in here.
* ``dispatcher`` (skyward.core.dispatch): one task at a time, on membership.
* ``batches`` (skyward.core.batches): ``map`` and gather, on dispatch.
* ``healing`` (skyward.core.healing): replacements and health checks, on membership.
* ``autoscaler`` (skyward.core.autoscale): the elastic size loop, on membership.
* ``shared`` (skyward.runtime.collections.ClientState): the client's side of the collections.

The pool itself holds the lifecycle (open, ``with``, plugins' client hooks, close, detach), the
views of its events (console, log file) and the public methods, which hand the work to a part.
"""

from __future__ import annotations

import _thread
import atexit
import contextvars
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ..bootstrap import serialize
from ..dashboard import hook as dashboard_hook
from ..errors import ConfigError
from ..observe import app, console, logs, secrets, tracing
from ..observe import events as ev
from ..observe.console import Console
from ..runtime.collections import Barrier, ClientState, Consistency, Counter, Dict, Lock, Queue, Set
from ..spec import Nodes, NodeSpec, Options, PoolSpec, Worker
from . import target
from .batches import Batches
from .dispatch import Dispatcher, decode_result, results
from .function import PendingFunction, PendingFunctionGroup, RemoteFunction
from .group import DEFAULT_GROUP, Group, GroupTarget
from .healing import Healing
from .membership import Membership, PoolSnapshot
from .target import DispatchTarget, active_pool

if TYPE_CHECKING:
    from ..providers.base import Cluster
    from ..serve.endpoint import Endpoint
    from .autoscale import Autoscaler

__all__ = ["Pool", "active_pool", "decode_result"]

log = logging.getLogger("skyward")
T = TypeVar("T")

# Pools a program opened and never closed (a Session without `with`, say) are closed when the
# interpreter exits, instead of leaving their nodes to the lease watchdog.
_open_pools: weakref.WeakSet[Pool] = weakref.WeakSet()


@atexit.register
def _close_leftovers() -> None:
    for pool in list(_open_pools):
        try:
            pool.close()
        except Exception:  # pragma: no cover - best effort at exit
            log.exception("closing pool %s at exit failed", pool.id)


def _labelled(emit: Callable[[ev.Event], None], group: str) -> Callable[[ev.Event], None]:
    """``emit`` for one group's parts: each event names the group."""
    from dataclasses import replace

    def labelled(event: ev.Event) -> None:
        emit(event if event.group is not None else replace(event, group=group))

    return labelled


def _forget_parents_pools() -> None:
    """In a forked child: the open pools are the parent's, not this process's to close at exit
    (``Pool.close`` refuses them too, for a child that leaves their ``with`` block)."""
    global _open_pools
    _open_pools = weakref.WeakSet()  # a new set: another thread may have held the old one's guard


os.register_at_fork(after_in_child=_forget_parents_pools)


class Pool(DispatchTarget):
    """Nodes ready to run tasks. Made by ``sky.Compute`` or ``Session.compute``; close it when done."""

    # Its parts (see the module's doc); skyward's own tools and plugins read a pool through them.
    members: Membership
    dispatcher: Dispatcher
    batches: Batches
    healing: Healing
    shared: ClientState

    def __init__(
        self, spec: PoolSpec, options: Options, worker: Worker, *,
        cluster: Cluster | None = None, name: str | None = None,
        pool_id: str | None = None, launched: Cluster | None = None, label: str | None = None,
        groups: Mapping[str, PoolSpec] | None = None, head: str | None = None,
        clusters: Mapping[str, Cluster] | None = None,
    ) -> None:
        """``cluster``: nodes that already run (a named pool another process started, from
        ``provider.attach``); the pool then connects to them and, on close, detaches and leaves
        them running instead of destroying them. ``launched``: this pool's own nodes, already
        starting (``provider.launch``, under ``pool_id``); the pool owns them as if it had
        created them. ``label``: the name a Session gave a pool it described
        (``session.compute(..., name=...)``): shown in the console, events and record; never a
        named pool's name (nothing attaches to it). ``groups``: the pool's groups, name -> spec
        (skyward.core.group; ``spec`` is then the head group's), ``head`` the one whose first node
        holds the collections (the first by default); without them the pool is one group.
        ``clusters``: with ``groups``, each group's running nodes (a named pool of several groups,
        as ``cluster`` is for one group)."""
        specs = dict(groups) if groups else {DEFAULT_GROUP: spec}
        head = head or next(iter(specs))
        spec = specs[head]
        self.spec = spec
        self.options = options
        self.worker = worker
        self.id = pool_id or os.urandom(4).hex()  # 8 hex digits (uuid would load platform: 2 ms)
        self.name = name
        self.label = label
        self._owned = cluster is None and clusters is None
        self._on_close: list[Callable[[], None]] = []  # named pools: registry and audit trail
        self._record: dict[str, Any] | None = None
        self._record_due = False  # an owned pool, up, whose record is not written yet
        self._record_lock = threading.Lock()
        self._before_close: list[Callable[[Pool], None]] = []  # named pools: sleep when the last client leaves
        self._tokens: list[contextvars.Token[Any]] = []
        self._emit = ev.emit  # Error messages redacted
        # The groups and their parts, lowest first; each part is handed what it uses. The head
        # group's parts are the pool's own (what skyward's tools read); a pool of one group has
        # no other.
        # In a pool of several groups each group's events name it (Event.group).
        self.groups = {g: Group(g, s, self.id, name, options, worker,
                                self._emit if len(specs) == 1 else _labelled(self._emit, g))
                       for g, s in specs.items()}
        self.head_group = self.groups[head]
        self.members = members = self.head_group.members
        self.shared = ClientState(options, members.head, self.id, check=members.check_owner)
        for group in self.groups.values():
            group.wire(self.shared, options, worker, group.members.emit, self._settle)
            group.members.on_stopped = self._stopped_from_outside
            if group is not self.head_group:  # its nodes reach the collections on the head group's first node
                group.members.holds_state = False
                group.members.state_address = self._state_elsewhere
            if len(self.groups) > 1:
                group.members.layout = self._layout
                group.members.on_configured = self._spread
        self.healing, self.dispatcher = self.head_group.healing, self.head_group.dispatcher  # checks health_checker=
        self.batches = self.head_group.batches
        members.state_address = self.shared.address
        members.ask_state = self.shared.ask
        members.on_head_gone = self.shared.head_gone
        self._rr = itertools.count()  # which group takes `>> pool` on a tie
        self.endpoints: list[Endpoint] = []  # open ones (pool.serve): what the views show
        self.attach_events: list[ev.Event] = []  # what replacing dead nodes at attach told (for the trail)
        try:
            self._log = logs.configure(options.logging)
        except ConfigError as exc:
            if options.logging is not True:
                raise  # the user asked for this file: tell them it cannot be written
            # The default log file is a convenience; an unwritable home must not stop the pool.
            log.warning("not writing the skyward log file: %s", exc)
            self._log = logs.configure(False)
        secrets.register_env(spec.image.env)  # before anything can log or print them
        title = f"pool {name or label or self.id}"
        self._event_log = console.EventLog(self.id, title)
        # Inside sky.App the App's console shows this pool; it opens none of its own.
        mode = "silent" if app.current() is not None else console.resolve(options.console)
        self._console = Console(mode, self.id, title).start()
        provider = "+".join(dict.fromkeys(getattr(g.spec.provider, "kind", type(g.spec.provider).__name__)
                                          for g in self.groups.values()))
        # Views outside skyward, before the first event: OTEL_* variables ask for traces
        # (nothing is loaded without them), metrics_port for a Prometheus endpoint.
        desired = sum(g.spec.node_spec.desired for g in self.groups.values())
        self.dispatcher.tracer = tracing.start(self.id, name or label, provider, desired)
        if options.metrics_port is not None:
            from ..observe import prometheus

            try:
                prometheus.expose(self, options.metrics_port)
            except BaseException:
                self._stop_views()
                raise
        if self._owned:
            from ..records import record

            self._origin = record.origin_soon()  # for the record, while the nodes start
            self._emit(ev.ClusterRequested(pool=self.id, provider=provider, nodes=desired, label=label))
            if desired:
                self._emit(ev.InstanceRequested(pool=self.id, provider=provider, count=desired))
        try:
            if len(self.groups) > 1:
                self._create_groups(clusters)
            else:
                if cluster is None and launched is not None:  # nodes this pool starts: already starting
                    cluster = launched
                elif cluster is None:  # or now; reproducing a pool (`with pkglock.pinned(...)`): its packages
                    from ..records.pkglock import current_pin

                    cluster = spec.provider.create(spec, self.id, self.options, name=name, pin=current_pin())
                members.attach(cluster)
        except BaseException as exc:
            self._emit(ev.Error(pool=self.id, message=str(exc), raised=True))
            self._stop_views()
            raise
        for group in self.groups.values():
            secrets.register(group.cluster.token)  # the agents' token never shows in logs either
        _open_pools.add(self)
        # Where CUDA tensors received while it is open land (and who hears that they landed on the CPU).
        serialize.pool_opened(self.id, options.tensor_device == "cpu", self._emit)
        self._on_close.append(lambda: serialize.pool_closed(self.id))
        try:
            complete = self._start_groups()
            self.healing.wait_warm()  # a health checker's first pass on each node (warming)
            for group in self.groups.values():
                if group is not self.head_group:
                    group.healing.wait_warm()
        except BaseException as exc:
            self._emit(ev.Error(pool=self.id, message=str(exc), raised=True))
            self.close()
            raise
        self._record_due = self._owned  # written beside the first task (_start_threads), or when read
        self._record_context = contextvars.copy_context()  # (as opened: a reproduction says what it reproduces)
        for group, done in complete.items():
            if done:
                group.members.ready_at_last()
        dashboard_hook.listen(self)  # before the first task, while a dashboard runs; else one failed read
        # The pool's own threads start from one that nobody waits for: Thread.start() waits
        # until the new thread runs, which on a busy machine puts a few ms each on the way to
        # the first task. (A pool closed before then finds them stopping at once.)
        _thread.start_new_thread(self._start_threads, ())

    def _create_groups(self, clusters: Mapping[str, Cluster] | None) -> None:
        """Each group's nodes, from its own provider, all at once (a pool of several groups).
        A group's cluster is named after the pool and the group; if one cannot be created, those
        that were are destroyed before the error goes on. ``clusters``: nodes that already run."""
        if clusters is not None:
            missing = set(self.groups) - set(clusters)
            if missing:
                raise ConfigError(f"pool {self.id}: no running nodes were given for group(s) {sorted(missing)}.")
            for group in self.groups.values():
                group.members.attach(clusters[group.name])
            return
        from ..records.pkglock import current_pin

        pin = current_pin()
        made: dict[str, Cluster] = {}
        errors: list[BaseException] = []

        # Groups on one provider that can make them together (a cloud: one stack for the pool)
        # are made in one call; each other group on its own; all at the same time.
        batches: list[list[Group]] = []
        for group in self.groups.values():
            same = next((b for b in batches if b[0].spec.provider == group.spec.provider), None)
            if same is None:
                batches.append([group])
            else:
                same.append(group)

        def create(batch: list[Group]) -> None:
            names = ", ".join(repr(g.name) for g in batch)
            try:
                provider = batch[0].spec.provider
                together = provider.create_together({g.name: g.spec for g in batch}, self.id, self.options,
                                                    name=self.name, pin=pin) if len(batch) > 1 else None
                if together is not None:
                    made.update(together)
                    return
                for group in batch:
                    names = repr(group.name)
                    made[group.name] = provider.create(group.spec, f"{self.id}-{group.name}", self.options,
                                                       name=self.name, pin=pin)
            except BaseException as exc:
                exc.add_note(f"(while creating group {names} of pool {self.id})")
                errors.append(exc)

        threads = [threading.Thread(target=create, args=(b,), name="skyward-groups", daemon=True) for b in batches]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            for made_cluster in made.values():
                try:
                    made_cluster.close()
                except Exception:
                    log.exception("pool %s: destroying a group's nodes after another group failed", self.id)
            raise errors[0]
        for group in self.groups.values():
            group.members.attach(made[group.name])

    def _start_groups(self) -> dict[Group, bool]:
        """Start every group's nodes at once; for each, whether all of its nodes are ready (else
        the rest join later: Nodes(min=)). The first error raised is the pool's."""
        complete: dict[Group, bool] = {}
        errors: list[BaseException] = []

        def start(group: Group) -> None:
            try:
                complete[group] = done = group.members.start()  # all nodes, or Nodes(min=) of them
                if done and not self._owned and group.cluster.heal_at_attach:
                    self.attach_events += group.healing.replace_unreachable()  # its dead nodes, now
            except BaseException as exc:
                if len(self.groups) > 1:
                    exc.add_note(f"(while starting group {group.name!r})")
                errors.append(exc)

        if len(self.groups) == 1:
            start(self.head_group)
        else:
            threads = [threading.Thread(target=start, args=(g,), name=f"skyward-group-{g.name}", daemon=True)
                       for g in self.groups.values()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        return complete

    def _layout(self, members: Membership) -> dict[str, Any]:
        """The pool-wide part of a node's topology in a pool of several groups: the nodes of all
        groups, numbered in group order, and the offset of ``members``' group among them."""
        peers: list[dict[str, Any]] = []
        offset = 0
        for group in self.groups.values():
            if group.members is members:
                offset = len(peers)
            for endpoint, _ in group.members.pairs():
                peers.append({"node": len(peers), "private_ip": endpoint.private_ip, "public_ip": endpoint.public_ip})
        head = self.members.pairs()
        return {"offset": offset, "total_nodes": len(peers), "peers": peers,
                "head_addr": head[0][0].private_ip if head else "", "head_port": self.cluster.head_port}

    def _state_elsewhere(self, pairs: Any) -> dict[str, Any] | None:
        """Where a node of a group other than the head's reaches the collections: the head's
        server over TCP, with the head's collections key (its own agent has another secret)."""
        where = self.shared.address(self.members.pairs())
        if not where or "error" in where:
            return where
        from ..bootstrap.handshake import COLLECTIONS, derive

        where = {k: v for k, v in where.items() if k != "unix"}  # the head's own workers' socket
        return {**where, "key": derive(self.cluster.token, COLLECTIONS).hex()}

    def _spread(self, changed: Membership) -> None:
        """A group's nodes changed: the other groups' nodes hear their new pool-wide numbers."""
        for group in self.groups.values():
            if group.members is not changed and group.members.table and not group.members.closed:
                group.members.configure_all(spread=False)

    def _start_threads(self) -> None:
        self._write_record()
        try:
            for group in self.groups.values():
                group.members.start_heartbeat(group.spec.ttl)
            dashboard_hook.opened(self)  # on `skyward dashboard` while one runs; else a stat a second
            for group in self.groups.values():
                group.start_autoscaler()
                group.healing.start_health_checks()
        except Exception:
            log.exception("pool %s: starting its background threads failed", self.name or self.id)

    @property
    def record(self) -> dict[str, Any] | None:
        """The pool's record as written (skyward.records.record); None for a pool that attached
        to running nodes, or whose record could not be written."""
        self._write_record()
        return self._record

    def _write_record(self) -> None:
        """The pool's record (skyward.records.record): who, where from, the spec, the offer, the
        lock. Once, after the nodes are up: on the pool's own thread beside its first task (its
        files and the audit trail cost the start 5-10 ms), or first by whoever reads it or
        closes the pool."""
        with self._record_lock:
            if not self._record_due:
                return
            self._record_due = False
            from ..records import record

            try:
                self._record = record.write(self._record_context.run(record.for_pool, self, self._origin))
            except Exception:  # the pool works without it; say so loudly
                log.exception("pool %s: writing its record failed; it cannot be reproduced", self.id)
                return
            self._on_close.append(lambda: record.closed(self.id) if self._owned else None)

    # -- what skyward's own tools read (named pools, records, the dashboard, plugins) ----------
    @property
    def autoscaler(self) -> Autoscaler:
        """The head group's autoscaler (made on first use: see ``Group.autoscaler``)."""
        return self.head_group.autoscaler

    @property
    def cluster(self) -> Cluster:
        """The provider's handle on the nodes (``describe``, ``unreachable``, ``spill_dir``...)."""
        return self.members.cluster

    @property
    def owned(self) -> bool:
        """True when closing the pool destroys its nodes (False once attached or detached)."""
        return self._owned

    def on_close(self, hook: Callable[[], None], *, first: bool = False) -> None:
        """Call ``hook()`` once the pool has closed (``first``: before the hooks added so far)."""
        if first:
            self._on_close.insert(0, hook)
        else:
            self._on_close.append(hook)

    def before_close(self, hook: Callable[[Pool], None]) -> None:
        """Call ``hook(pool)`` once when the pool starts closing, while its nodes are still
        connected (not when it was stopped from outside); a hook that fails is logged."""
        self._before_close.append(hook)

    # -- groups (skyward.core.group) -----------------------------------------------------------
    def __getitem__(self, name: str) -> GroupTarget:
        """``pool["train"]``: the group called ``name``, a dispatch target for its nodes alone."""
        group = self.groups.get(name) if isinstance(name, str) else None
        if group is None:
            raise ConfigError(
                f"pool[{name!r}]: this pool has no group called {name!r}; its groups are "
                f"{', '.join(map(repr, self.groups))}. Name one of them (groups come from "
                f"sky.Compute(groups={{...}}); a pool opened from one spec is the one group {DEFAULT_GROUP!r})."
            )
        return GroupTarget(self, group)

    def _pick(self, target: int | str | None) -> tuple[Group, int | str | None]:
        """The group that takes a task sent to the whole pool, and the target within it: the
        group whose ready nodes are the least busy (a task waits for a node where none is ready);
        a pool-wide rank is the node at that place in group order; 'head' the head group's first."""
        if len(self.groups) == 1:
            return self.head_group, target
        if target == "head":
            return self.head_group, target
        if target is not None:
            if isinstance(target, bool) or not isinstance(target, int):
                raise ConfigError(f"target={target!r} is not valid: use 'head' or a node rank of the pool.")
            rank = target
            for group in self.groups.values():
                size = group.members.size()
                if rank < size:
                    return group, rank
                rank -= size
            raise ConfigError(
                f"target={target!r} is not valid: the pool has {self.current_nodes()} node(s), ranks "
                f"0 to {self.current_nodes() - 1} across its groups; to pick within a group, use "
                f"pool[name].run(..., target=rank)."
            )
        self.dispatcher.check_open()
        slots = self.worker.slots
        best: tuple[float, int, Group] | None = None
        turn = next(self._rr)
        for i, group in enumerate(self.groups.values()):
            ready = group.members.ready()
            if not ready:
                continue
            load = sum(ch.inflight for ch in ready) / (len(ready) * slots)
            key = (load, (i - turn) % len(self.groups))
            if best is None or key < best[:2]:
                best = (*key, group)
        return (best[2] if best is not None else self.head_group), None

    def _awake(self) -> list[Group]:
        """The groups that have nodes (all of them when none has: "every node" then wakes them)."""
        awake = [g for g in self.groups.values() if g.members.size()]
        return awake or list(self.groups.values())

    # -- dispatch (skyward.core.dispatch, skyward.core.batches) --------------------------------
    def run(self, pending: PendingFunction[T], *, target: int | str | None = None) -> T:
        """Run on one node (round-robin, or ``target``: 'head' or a rank) and return the result."""
        group, within = self._pick(target)
        return group.dispatcher.run(pending, target=within)

    def run_async(self, pending: PendingFunction[T], *, target: int | str | None = None) -> Future[T]:
        """Like ``run`` but returns at once with a Future."""
        group, within = self._pick(target)
        return group.dispatcher.run_async(pending, target=within)

    def broadcast(self, pending: PendingFunction[T]) -> list[T]:
        """Run on every node; results in node order (in a pool of several groups: group by group,
        of the groups that have nodes)."""
        if len(self.groups) == 1:
            return self.dispatcher.broadcast(pending)
        futures: list[Future[T]] = []
        for group in self._awake():
            dispatch, members = group.dispatcher, group.members
            dispatch.check_open()
            if not members.size():
                members.wait_ready()
            encoded = dispatch.shared_payload(pending) if members.size() > 1 else None
            futures += [dispatch.submit(members.wait_rank(rank), pending, encoded=encoded)
                        for rank in range(members.size())]
        return results(futures)

    def run_parallel(self, group: PendingFunctionGroup) -> tuple[Any, ...] | Iterator[Any]:
        """Run a group's functions at once over the nodes; a tuple, or an iterator when streaming."""
        if len(self.groups) == 1:
            return self.batches.run_parallel(group)
        return self.batches.run_parallel(group, route=lambda: self._pick(None)[0].dispatcher)

    @overload
    def map(self, fn: RemoteFunction[..., T], items: Iterable[Any], *,
            chunksize: int | None = None, timeout: float | None = None) -> list[T]: ...
    @overload
    def map(self, fn: Callable[..., T], items: Iterable[Any], *,
            chunksize: int | None = None, timeout: float | None = None) -> list[T]: ...

    def map(self, fn: Callable[..., Any], items: Iterable[Any], *,
            chunksize: int | None = None, timeout: float | None = None) -> list[Any]:
        """``fn(item)`` for every item, spread over the nodes; results in input order.

        Items travel in chunks (``chunksize``, automatic by default) so that short calls are not
        dominated by round trips; ``timeout`` is per item (a chunk gets items x timeout).
        """
        if len(self.groups) == 1:
            return self.batches.map(fn, items, chunksize=chunksize, timeout=timeout)
        return self._map_groups(fn, items, chunksize, timeout)

    def _map_groups(self, fn: Callable[..., Any], items: Iterable[Any], chunksize: int | None,
                    timeout: float | None) -> list[Any]:
        """``map`` over a pool of several groups: the items in one contiguous part per group that
        has nodes, sized by its ready slots, each mapped by its group at the same time."""
        self.dispatcher.check_open()
        data = items if type(items) is list else list(items)
        groups = self._awake()
        weights = [max(1, len(g.members.ready())) for g in groups]
        cuts, total, acc = [0], sum(weights), 0
        for w in weights:
            acc += w
            cuts.append(len(data) * acc // total)
        parts: list[list[Any] | None] = [None] * len(groups)
        errors: list[BaseException] = []

        def one(i: int) -> None:
            try:
                part = data[cuts[i]:cuts[i + 1]]
                parts[i] = groups[i].batches.map(fn, part, chunksize=chunksize, timeout=timeout) if part else []
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,), name="skyward-map-group", daemon=True)
                   for i in range(1, len(groups))]
        for t in threads:
            t.start()
        one(0)
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return [value for part in parts for value in (part or [])]

    def serve(self, app: Any, **options: Any) -> Endpoint:
        """Serve an ASGI app (the app, a factory returning one, or ``"module:attr"``) from this
        pool's nodes, one replica per node by default, behind an endpoint on this machine; see
        skyward.serve.endpoint.Endpoint for ``options`` (``replicas_per_node``, ``ready``,
        ``timeout``, ``auth``, ``host``, ``port``, ``on``, ``allow_from``...). Use it as a context
        manager, or close it."""
        from ..serve.endpoint import Endpoint

        endpoint = Endpoint(self, app, **options)
        self.endpoints.append(endpoint)  # (the endpoint takes itself out when it closes)
        return endpoint

    def _settle(self) -> None:
        """Let the console print a batch's last line before the call that ran it returns (its
        lines would come after the caller's own output otherwise)."""
        if self._console.mode == "log":
            ev.bus.flush(2.0)

    # -- size (skyward.core.membership, skyward.core.autoscale) --------------------------------
    def current_nodes(self) -> int:
        """How many nodes are connected and take tasks now (in all groups)."""
        return sum(g.members.current_nodes() for g in self.groups.values())

    @property
    def is_active(self) -> bool:
        """True from the moment the pool is ready until it is closed (never in a forked child:
        the pool is its parent's)."""
        return not self.members.closed and not self.members.foreign()

    @property
    def concurrency(self) -> int:
        """How many tasks the pool runs at once: the ready nodes' slots together."""
        return self.current_nodes() * self.worker.slots

    def snapshot(self) -> PoolSnapshot:
        """The nodes as they are now: rank (within its group), group, state, host, slots and the
        tasks each is running."""
        snap = self.members.snapshot()
        if len(self.groups) == 1:
            return snap
        nodes = tuple(n for g in self.groups.values() for n in g.members.snapshot().nodes)
        return PoolSnapshot(pool=snap.pool, name=snap.name, active=snap.active, nodes=nodes)

    def resize(self, nodes: NodeSpec) -> None:
        """Change the pool's size (and, with sky.Nodes, its elastic range) now.

        Removed nodes finish their running tasks first. With ``Nodes(desired, max=...)`` the
        pool keeps autoscaling between ``desired`` and ``max``.
        """
        self._one_group("resize")
        self.head_group.resize(nodes)

    def _one_group(self, what: str) -> None:
        if len(self.groups) > 1:
            raise ConfigError(
                f"pool.{what}(...) on a pool of several groups ({', '.join(map(repr, self.groups))}): "
                f"say which group, e.g. pool[{next(iter(self.groups))!r}].{what}(...)."
            )

    def set_range(self, nodes: Nodes) -> None:
        """Change the elastic range without resizing now: the autoscaler moves the pool within
        it from here on (an attached named pool of ``nodes = [0, N]`` that has nodes running gets
        its floor of 0 back, so that it sleeps when idle)."""
        self._one_group("set_range")
        self.dispatcher.check_open()
        self.members.nodes = nodes
        self.autoscaler.start()

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Pool:
        self._tokens.append(target.enter(self))
        if len(self._tokens) == 1 and any(g.spec.plugins for g in self.groups.values()):
            self._enter_plugins()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tokens:
            target.leave(self._tokens.pop())
        if not self._tokens:
            self._exit_plugins(exc)
        self.close()

    def _enter_plugins(self) -> None:
        """around_client hooks, in plugin order, in this (the user's) thread: joblib's backend
        setting is thread-local. On failure the pool is closed and PluginError raised."""
        from ..plugins.compose import enter_client_hooks

        try:
            self._client_hooks = stack = enter_client_hooks(self.spec.plugins, self, self.cluster)
            for group in self.groups.values():  # the other groups' plugins, each with its own nodes
                if group is not self.head_group and group.spec.plugins:
                    stack.enter_context(enter_client_hooks(group.spec.plugins, self, group.cluster))
        except BaseException:
            target.leave(self._tokens.pop())
            self.close()
            raise

    def _exit_plugins(self, exc: tuple[object, ...] = (None, None, None)) -> None:
        hooks = getattr(self, "_client_hooks", None)
        self.__dict__.pop("_client_hooks", None)
        if hooks is not None and not self.members.foreign():  # a forked child's are the parent's
            # In reverse order of entry, each seeing what the block raised (a tracker's run
            # then ends FAILED); none can swallow it.
            hooks.__exit__(*exc)

    def _stopped_from_outside(self) -> None:
        """An agent said the pool is being stopped (``skyward down``): close this side in the
        background (dispatch raises PoolStoppedError from now on)."""
        threading.Thread(target=self.close, name="skyward-stopped", daemon=True).start()

    def close(self) -> None:
        """Stop every node and destroy what the provider created. Safe to call twice.

        A pool that attached to running nodes (a named pool) only disconnects: its nodes keep
        running for the next client, until their ttl passes with no client or ``skyward down``.

        In a process forked from the one that opened the pool it does nothing: the nodes, the
        connections and a named pool's registry entry are the parent's (a child leaving the
        pool's ``with`` block, or ending with the pool open, must not take them from it)."""
        if self.members.foreign():
            return
        self._write_record()  # (not written yet: the pool closes right after it came up)
        hooks, self._before_close = self._before_close, []
        if not self.members.closed and self.members.stopped is None:
            for before in hooks:
                try:
                    before(self)
                except Exception:  # closing goes on: the hook's work is a courtesy
                    log.exception("pool %s: a hook before closing failed", self.name or self.id)
        if not self.members.closed:
            self.shared.flush()  # the client's buffered eventual writes
        others = [(g, g.members.close()) for g in self.groups.values() if g is not self.head_group]
        channels = self.members.close()
        if channels is None:
            return
        said = {id(ch): self.head_group for ch in channels}  # whose node each is (its events name the group)
        said.update({id(ch): g for g, chs in others for ch in chs or ()})
        channels = channels + [ch for _, chs in others for ch in chs or ()]
        _open_pools.discard(self)
        owned = self._owned
        if owned:
            self._emit(ev.ShutdownRequested(pool=self.id, nodes=len(channels)))
        began, ok = time.monotonic(), False
        try:
            for ch in channels:
                ch.close(shutdown_agent=owned)
            self._end_clusters(owned)
            ok = True
        finally:
            if owned:
                for ch in channels:
                    said[id(ch)].members.emit(ev.InstanceDestroyed(pool=self.id, node=ch.node))
                self._emit(ev.ShutdownCompleted(pool=self.id, nodes=len(channels),
                                                seconds=time.monotonic() - began, ok=ok))
                self._emit(ev.ClusterDestroyed(pool=self.id))
            elif self.members.stopped is not None:  # stopped from outside: its nodes do not keep running
                self._emit(ev.ClusterDestroyed(pool=self.id))
            else:
                self._emit(ev.ClusterDetached(pool=self.id, nodes=len(channels)))
            if self.dispatcher.tracer is not None:  # the pool's spans end and leave before `with` does
                ev.bus.flush(5.0)
            self._stop_views()
            for hook in self._on_close:
                try:
                    hook()
                except Exception:  # the trail must not turn a clean exit into a failure
                    log.exception("pool %s: recording its close failed", self.name or self.id)

    def _end_clusters(self, owned: bool) -> None:
        """Destroy (or, ``owned`` False, let go of) every group's nodes; one group's failure does
        not leave the others' running: the first error is raised once all were tried."""
        first: BaseException | None = None
        for group in [self.head_group, *(g for g in self.groups.values() if g is not self.head_group)]:
            try:
                group.cluster.close() if owned else group.cluster.detach()
            except BaseException as exc:
                if len(self.groups) == 1:
                    raise
                log.exception("pool %s: ending group %s's nodes failed", self.id, group.name)
                first = first or exc
        if first is not None:
            raise first

    def detach(self) -> None:
        """Disconnect and leave the nodes running (what ``skyward up`` does once they are
        ready): they stop when no client has renewed their lease for ``ttl`` seconds. A forked
        child gets InheritedPoolError: the pool is its parent's to let go."""
        self.members.check_owner()
        self._owned = False
        self.close()

    def _stop_views(self) -> None:
        self._console.stop()  # flushes the event queue first
        self._event_log.close()
        self._log.close()

    # -- the pool's collections, from the client (skyward.runtime.collections) -----------------
    # The same objects the pool's tasks get from sky.dict(name)... : one name is one object for
    # every task and for this program, whether or not the pool is the active one here.
    def dict(self, name: str, *, consistency: Consistency | None = None) -> Dict:
        """The pool's dict called ``name`` (``sky.dict`` inside its tasks)."""
        return self.shared.dict(name, consistency)

    def set(self, name: str, *, consistency: Consistency | None = None) -> Set:
        """The pool's set called ``name`` (``sky.set`` inside its tasks)."""
        return self.shared.set(name, consistency)

    def counter(self, name: str, *, consistency: Consistency | None = None) -> Counter:
        """The pool's counter called ``name`` (``sky.counter`` inside its tasks)."""
        return self.shared.counter(name, consistency)

    def queue(self, name: str) -> Queue:
        """The pool's FIFO queue called ``name`` (``sky.queue`` inside its tasks)."""
        return self.shared.queue(name)

    def barrier(self, name: str, n: int) -> Barrier:
        """The pool's barrier called ``name`` for ``n`` participants (``sky.barrier``)."""
        return self.shared.barrier(name, n)

    def lock(self, name: str, timeout: float | None = 30) -> Lock:
        """The pool's lock called ``name`` (``sky.lock`` inside its tasks)."""
        return self.shared.lock(name, timeout)

    def subscribe(self, callback: Callable[[ev.Event], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event of this pool from now on (in order, on
        skyward's event thread); returns a function that unsubscribes. For the events of a
        pool from its very start, use ``sky.subscribe`` before opening it."""
        return ev.bus.subscribe(callback, self.id)

    def events(self) -> Iterator[ev.Event]:
        """Iterate over this pool's events as they happen; ends once the pool is destroyed."""
        return ev.stream(self.id, stop=lambda e: isinstance(e, ev.ClusterDestroyed | ev.ClusterDetached))
