"""A live pool: the ``Pool`` its users hold, made of three parts that read on their own:
membership (skyward.core.membership: nodes, heartbeat, resize), dispatch (skyward.core.dispatch: one
task at a time) and batches (skyward.core.batches: map and gather)."""

from __future__ import annotations

import atexit
import contextvars
import itertools
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from skyward.bootstrap.channel import NodeChannel

from ..dashboard import hook as dashboard_hook
from ..errors import ConfigError
from ..observe import app, console, logs, secrets
from ..observe import events as ev
from ..observe.console import Console
from ..spec import Options, PoolSpec, Worker
from . import target
from .batches import Batches
from .dispatch import decode_result
from .function import not_pending
from .healing import Healing
from .target import DispatchTarget, active_pool

if TYPE_CHECKING:
    from ..providers.base import Cluster

__all__ = ["Pool", "active_pool", "decode_result"]

log = logging.getLogger("skyward")

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


class Pool(Batches, Healing, DispatchTarget):
    """Nodes ready to run tasks. Made by ``sky.Compute`` or ``Session.compute``; close it when done."""

    def __init__(
        self, spec: PoolSpec, options: Options, worker: Worker, *,
        cluster: Cluster | None = None, name: str | None = None,
    ) -> None:
        """``cluster``: nodes that already run (a named pool another process started, from
        ``provider.attach``); the pool then connects to them and, on close, detaches and leaves
        them running instead of destroying them."""
        self.spec = spec
        self.options = options
        self.worker = worker
        self.id = uuid.uuid4().hex[:8]
        self.name = name
        self._owned = cluster is None
        self._on_close: list[Callable[[], None]] = []  # named pools: registry and audit trail
        self._channels: list[NodeChannel] = []
        self._endpoints: list[Any] = []
        self._rr = itertools.count()
        self._lock = threading.RLock()
        self._print_lock = threading.Lock()
        self._closed = False
        self._drift: dict[str, tuple[str, str, int]] = {}  # package versions that differ on nodes
        self._stop = threading.Event()
        self._tokens: list[contextvars.Token[Any]] = []
        self._nodes = spec.node_spec
        self._resize_lock = threading.Lock()
        self._autoscaler: threading.Thread | None = None
        self._requested = time.monotonic()
        self._init_healing()
        try:
            self._log = logs.configure(options.logging)
        except ConfigError as exc:
            if options.logging is not True:
                raise  # the user asked for this file: tell them it cannot be written
            # The default log file is a convenience; an unwritable home must not stop the pool.
            log.warning("not writing the skyward log file: %s", exc)
            self._log = logs.configure(False)
        secrets.register_env(spec.image.env)  # before anything can log or print them
        title = f"pool {name or self.id}"
        self._event_log = console.EventLog(self.id, title)
        # Inside sky.App the App's console shows this pool; it opens none of its own.
        mode = "silent" if app.current() is not None else console.resolve(options.console)
        self._console = Console(mode, self.id, title).start()
        provider = getattr(spec.provider, "kind", type(spec.provider).__name__)
        if cluster is None:
            self._emit(ev.ClusterRequested(pool=self.id, provider=provider, nodes=spec.node_spec.desired))
        try:
            self._cluster = cluster if cluster is not None else spec.provider.create(spec, self.id, self.options, name=name)
        except BaseException as exc:
            self._emit(ev.Error(pool=self.id, message=str(exc), raised=True))
            self._stop_views()
            raise
        secrets.register(self._cluster.token)  # the agents' token never shows in logs either
        _open_pools.add(self)
        try:
            complete = self._start_nodes()  # all nodes, or Nodes(min=) of them (the rest join later)
        except BaseException as exc:
            self._emit(ev.Error(pool=self.id, message=str(exc), raised=True))
            self.close()
            raise
        if self._owned:
            self._write_record()
        if complete:
            self._ready_at_last()
        ttl = spec.ttl
        self._beat = threading.Thread(target=self._heartbeat, args=(ttl,), name="skyward-lease", daemon=True)
        self._beat.start()
        dashboard_hook.opened(self)  # on `skyward dashboard` while one runs; else a stat a second
        self._start_autoscaler()
        self._start_health_checks()

    def _write_record(self) -> None:
        """The pool's record (skyward.records.record): who, where from, the spec, the offer, the lock."""
        from ..records import record

        try:
            self.record: dict[str, Any] | None = record.write(record.for_pool(self))
        except Exception:  # the pool works without it; say so loudly
            log.exception("pool %s: writing its record failed; it cannot be reproduced", self.id)
            self.record = None
            return
        self._on_close.append(lambda: record.closed(self.id) if self._owned else None)

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
            self._exit_plugins()
        self.close()

    # `value >> pool` where value is no pending call: a plain function's result, computed here.
    def __rrshift__(self, value: Any) -> Any:
        raise not_pending(value, ">>")

    def __rmatmul__(self, value: Any) -> Any:
        raise not_pending(value, "@")

    def __lt__(self, value: Any) -> Any:  # `value > pool`, reflected
        raise not_pending(value, ">")

    # -- plugins (skyward.plugins) -------------------------------------------------------------
    def _enter_plugins(self) -> None:
        """around_client hooks, in plugin order, in this (the user's) thread: joblib's backend
        setting is thread-local. On failure the pool is closed and PluginError raised."""
        from ..plugins.compose import enter_client_hooks

        try:
            self._client_hooks = enter_client_hooks(self.spec.plugins, self, self._cluster)
        except BaseException:
            target.leave(self._tokens.pop())
            self.close()
            raise

    def _exit_plugins(self) -> None:
        hooks = getattr(self, "_client_hooks", None)
        self.__dict__.pop("_client_hooks", None)
        if hooks is not None:
            hooks.close()  # in reverse order of entry

    def close(self) -> None:
        """Stop every node and destroy what the provider created. Safe to call twice.

        A pool that attached to running nodes (a named pool) only disconnects: its nodes keep
        running for the next client, until their ttl passes with no client or ``skyward down``."""
        if not self._closed:
            self._flush_collections()  # the client's buffered eventual writes (dispatch.py)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channels, self._channels = self._channels, []
        self._stop.set()
        _open_pools.discard(self)
        owned = self._owned
        try:
            for ch in channels:
                ch.close(shutdown_agent=owned)
            if owned:
                self._cluster.close()
            else:
                self._cluster.detach()
        finally:
            if owned:
                for ch in channels:
                    self._emit(ev.InstanceDestroyed(pool=self.id, node=ch.node))
                self._emit(ev.ClusterDestroyed(pool=self.id))
            elif self._stopped is not None:  # stopped from outside: its nodes do not keep running
                self._emit(ev.ClusterDestroyed(pool=self.id))
            else:
                self._emit(ev.ClusterDetached(pool=self.id, nodes=len(channels)))
            self._stop_views()
            for hook in self._on_close:
                try:
                    hook()
                except Exception:  # the trail must not turn a clean exit into a failure
                    log.exception("pool %s: recording its close failed", self.name or self.id)

    def detach(self) -> None:
        """Disconnect and leave the nodes running (what ``skyward up`` does once they are
        ready): they stop when no client has renewed their lease for ``ttl`` seconds."""
        self._owned = False
        self.close()

    def _stop_views(self) -> None:
        self._console.stop()  # flushes the event queue first
        self._event_log.close()
        self._log.close()

    def subscribe(self, callback: Callable[[ev.Event], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event of this pool from now on (in order, on
        skyward's event thread); returns a function that unsubscribes. For the events of a
        pool from its very start, use ``sky.subscribe`` before opening it."""
        return ev.bus.subscribe(callback, self.id)

    def events(self) -> Iterator[ev.Event]:
        """Iterate over this pool's events as they happen; ends once the pool is destroyed."""
        return ev.stream(self.id, stop=lambda e: isinstance(e, ev.ClusterDestroyed | ev.ClusterDetached))
