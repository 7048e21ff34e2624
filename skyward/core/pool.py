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
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
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
from .autoscale import Autoscaler
from .batches import Batches
from .dispatch import Dispatcher, decode_result
from .function import PendingFunction, PendingFunctionGroup, RemoteFunction
from .healing import Healing
from .membership import Membership, PoolSnapshot
from .target import DispatchTarget, active_pool

if TYPE_CHECKING:
    from ..providers.base import Cluster
    from ..serve.endpoint import Endpoint

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
    autoscaler: Autoscaler
    shared: ClientState

    def __init__(
        self, spec: PoolSpec, options: Options, worker: Worker, *,
        cluster: Cluster | None = None, name: str | None = None,
        pool_id: str | None = None, launched: Cluster | None = None, label: str | None = None,
    ) -> None:
        """``cluster``: nodes that already run (a named pool another process started, from
        ``provider.attach``); the pool then connects to them and, on close, detaches and leaves
        them running instead of destroying them. ``launched``: this pool's own nodes, already
        starting (``provider.launch``, under ``pool_id``); the pool owns them as if it had
        created them. ``label``: the name a Session gave a pool it described
        (``session.compute(..., name=...)``): shown in the console, events and record; never a
        named pool's name (nothing attaches to it)."""
        self.spec = spec
        self.options = options
        self.worker = worker
        self.id = pool_id or os.urandom(4).hex()  # 8 hex digits (uuid would load platform: 2 ms)
        self.name = name
        self.label = label
        self._owned = cluster is None
        self._on_close: list[Callable[[], None]] = []  # named pools: registry and audit trail
        self._before_close: list[Callable[[Pool], None]] = []  # named pools: sleep when the last client leaves
        self._tokens: list[contextvars.Token[Any]] = []
        self._emit = ev.emit  # Error messages redacted
        # The parts, lowest first; each is handed what it uses.
        self.members = members = Membership(self.id, name, spec, options, worker, self._emit)
        self.shared = ClientState(options, members.head, self.id, check=members.check_owner)
        self.healing = Healing(members, options, self.shared, self._emit)  # checks health_checker=
        self.dispatcher = Dispatcher(members, options, self._emit)
        self.batches = Batches(self.dispatcher, options, worker, self._settle)
        self.autoscaler = Autoscaler(members, options, worker)
        members.on_lost = self.healing.node_lost
        members.on_nested = self.dispatcher.route_nested
        members.on_heartbeat.append(self.dispatcher.audit)  # a task whose outcome went missing
        members.on_stopped = self._stopped_from_outside
        members.state_address = self.shared.address
        members.ask_state = self.shared.ask
        members.on_head_gone = self.shared.head_gone
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
        provider = getattr(spec.provider, "kind", type(spec.provider).__name__)
        # Views outside skyward, before the first event: OTEL_* variables ask for traces
        # (nothing is loaded without them), metrics_port for a Prometheus endpoint.
        self.dispatcher.tracer = tracing.start(self.id, name or label, provider, spec.node_spec.desired)
        if options.metrics_port is not None:
            from ..observe import prometheus

            try:
                prometheus.expose(self, options.metrics_port)
            except BaseException:
                self._stop_views()
                raise
        if cluster is None:
            from ..records import record

            self._origin = record.origin_soon()  # for the record, while the nodes start
            self._emit(ev.ClusterRequested(pool=self.id, provider=provider, nodes=spec.node_spec.desired,
                                           label=label))
            if spec.node_spec.desired:
                self._emit(ev.InstanceRequested(pool=self.id, provider=provider, count=spec.node_spec.desired))
        try:
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
        secrets.register(self.cluster.token)  # the agents' token never shows in logs either
        _open_pools.add(self)
        # Where CUDA tensors received while it is open land (and who hears that they landed on the CPU).
        serialize.pool_opened(self.id, options.tensor_device == "cpu", self._emit)
        self._on_close.append(lambda: serialize.pool_closed(self.id))
        try:
            complete = members.start()  # all nodes, or Nodes(min=) of them (the rest join later)
            if complete and not self._owned and self.cluster.heal_at_attach:
                self.attach_events = self.healing.replace_unreachable()  # its dead nodes, now
            self.healing.wait_warm()  # a health checker's first pass on each node (warming)
        except BaseException as exc:
            self._emit(ev.Error(pool=self.id, message=str(exc), raised=True))
            self.close()
            raise
        if self._owned:
            self._write_record()
        if complete:
            members.ready_at_last()
        dashboard_hook.listen(self)  # before the first task, while a dashboard runs; else one failed read
        # The pool's own threads start from one that nobody waits for: Thread.start() waits
        # until the new thread runs, which on a busy machine puts a few ms each on the way to
        # the first task. (A pool closed before then finds them stopping at once.)
        _thread.start_new_thread(self._start_threads, ())

    def _start_threads(self) -> None:
        try:
            self.members.start_heartbeat(self.spec.ttl)
            dashboard_hook.opened(self)  # on `skyward dashboard` while one runs; else a stat a second
            self.autoscaler.start()
            self.healing.start_health_checks()
        except Exception:
            log.exception("pool %s: starting its background threads failed", self.name or self.id)

    def _write_record(self) -> None:
        """The pool's record (skyward.records.record): who, where from, the spec, the offer, the lock."""
        from ..records import record

        try:
            self.record: dict[str, Any] | None = record.write(record.for_pool(self, self._origin))
        except Exception:  # the pool works without it; say so loudly
            log.exception("pool %s: writing its record failed; it cannot be reproduced", self.id)
            self.record = None
            return
        self._on_close.append(lambda: record.closed(self.id) if self._owned else None)

    # -- what skyward's own tools read (named pools, records, the dashboard, plugins) ----------
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

    # -- dispatch (skyward.core.dispatch, skyward.core.batches) --------------------------------
    def run(self, pending: PendingFunction[T], *, target: int | str | None = None) -> T:
        """Run on one node (round-robin, or ``target``: 'head' or a rank) and return the result."""
        return self.dispatcher.run(pending, target=target)

    def run_async(self, pending: PendingFunction[T], *, target: int | str | None = None) -> Future[T]:
        """Like ``run`` but returns at once with a Future."""
        return self.dispatcher.run_async(pending, target=target)

    def broadcast(self, pending: PendingFunction[T]) -> list[T]:
        """Run on every node; results in node order."""
        return self.dispatcher.broadcast(pending)

    def run_parallel(self, group: PendingFunctionGroup) -> tuple[Any, ...] | Iterator[Any]:
        """Run a group's functions at once over the nodes; a tuple, or an iterator when streaming."""
        return self.batches.run_parallel(group)

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
        return self.batches.map(fn, items, chunksize=chunksize, timeout=timeout)

    def serve(self, app: Any, **options: Any) -> Endpoint:
        """Serve an ASGI app (the app, a factory returning one, or ``"module:attr"``) from this
        pool's nodes, one replica per node by default, behind an endpoint on this machine; see
        skyward.serve.endpoint.Endpoint for ``options`` (``replicas_per_node``, ``ready``,
        ``timeout``, ``auth``, ``host``, ``port``...). Use it as a context manager, or close it."""
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
        """How many nodes are connected and take tasks now."""
        return self.members.current_nodes()

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
        """The nodes as they are now: rank, state, host, slots and the tasks each is running."""
        return self.members.snapshot()

    def resize(self, nodes: NodeSpec) -> None:
        """Change the pool's size (and, with sky.Nodes, its elastic range) now.

        Removed nodes finish their running tasks first. With ``Nodes(desired, max=...)`` the
        pool keeps autoscaling between ``desired`` and ``max``.
        """
        self.dispatcher.check_open()
        members = self.members
        size = Nodes.of(nodes)
        if isinstance(nodes, int) and members.nodes.max is not None and size.desired <= members.nodes.max:
            size = Nodes(desired=size.desired, max=members.nodes.max)  # keep the elastic range
        members.check_growth(members.size(), size.desired)  # before the range changes
        members.nodes = size
        members.scale_to(size.desired)
        self.autoscaler.start()

    def set_range(self, nodes: Nodes) -> None:
        """Change the elastic range without resizing now: the autoscaler moves the pool within
        it from here on (an attached named pool of ``nodes = [0, N]`` that has nodes running gets
        its floor of 0 back, so that it sleeps when idle)."""
        self.dispatcher.check_open()
        self.members.nodes = nodes
        self.autoscaler.start()

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Pool:
        self._tokens.append(target.enter(self))
        if len(self._tokens) == 1 and self.spec.plugins:
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
            self._client_hooks = enter_client_hooks(self.spec.plugins, self, self.cluster)
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
        hooks, self._before_close = self._before_close, []
        if not self.members.closed and self.members.stopped is None:
            for before in hooks:
                try:
                    before(self)
                except Exception:  # closing goes on: the hook's work is a courtesy
                    log.exception("pool %s: a hook before closing failed", self.name or self.id)
        if not self.members.closed:
            self.shared.flush()  # the client's buffered eventual writes
        channels = self.members.close()
        if channels is None:
            return
        _open_pools.discard(self)
        owned = self._owned
        if owned:
            self._emit(ev.ShutdownRequested(pool=self.id, nodes=len(channels)))
        began, ok = time.monotonic(), False
        try:
            for ch in channels:
                ch.close(shutdown_agent=owned)
            if owned:
                self.cluster.close()
            else:
                self.cluster.detach()
            ok = True
        finally:
            if owned:
                for ch in channels:
                    self._emit(ev.InstanceDestroyed(pool=self.id, node=ch.node))
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
