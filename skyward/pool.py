"""A live pool: one channel per node and the methods behind the operators."""

from __future__ import annotations

import atexit
import collections
import contextvars
import dataclasses
import functools
import itertools
import logging
import math
import queue
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any, TypeVar

from skyward.bootstrap import serialize
from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import NESTED, Frame, Kind

from . import console, logs, secrets
from . import events as ev
from .autoscale import ScaleState, decide
from .console import Console
from .errors import (
    ConfigError,
    NodeLostError,
    PoolClosedError,
    RemoteError,
    RemoteTraceback,
    SerializationError,
)
from .function import PendingFunction, PendingFunctionGroup, RemoteFunction, unwrap
from .metrics import to_config
from .spec import Nodes, Options, Spec, Worker

if TYPE_CHECKING:
    from .providers.base import Cluster

log = logging.getLogger("skyward")
T = TypeVar("T")

_active: contextvars.ContextVar[Pool | None] = contextvars.ContextVar("skyward_active_pool", default=None)


def active_pool() -> Pool | None:
    return _active.get()


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


class Pool:
    """Nodes ready to run tasks. Made by ``sky.Compute`` or ``Session.compute``; close it when done."""

    def __init__(
        self, spec: Spec, options: Options, worker: Worker, *,
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
        self._stop = threading.Event()
        self._tokens: list[contextvars.Token[Pool | None]] = []
        self._nodes = spec.node_spec
        self._resize_lock = threading.Lock()
        self._autoscaler: threading.Thread | None = None
        self._requested = time.monotonic()
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
        self._console = Console(console.resolve(options.console), self.id, title).start()
        provider = getattr(spec.provider, "kind", type(spec.provider).__name__)
        if cluster is None:
            self._emit(ev.ClusterRequested(pool=self.id, provider=provider, nodes=spec.node_spec.desired))
        try:
            self._cluster = cluster if cluster is not None else spec.provider.create(spec, self.id, self.options, name=name)
        except BaseException as exc:
            self._emit(ev.Error(pool=self.id, message=str(exc)))
            self._stop_views()
            raise
        secrets.register(self._cluster.token)  # the agents' token never shows in logs either
        _open_pools.add(self)
        try:
            self._add_nodes(spec.node_spec.desired)
        except BaseException as exc:
            self._emit(ev.Error(pool=self.id, message=str(exc)))
            self.close()
            raise
        self._emit(ev.ClusterReady(
            pool=self.id, nodes=len(self._channels), seconds=time.monotonic() - self._requested,
        ))
        ttl = spec.ttl
        self._beat = threading.Thread(target=self._heartbeat, args=(ttl,), name="skyward-lease", daemon=True)
        self._beat.start()
        self._start_autoscaler()

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Pool:
        self._tokens.append(_active.set(self))
        if len(self._tokens) == 1 and self.spec.plugins:
            self._enter_plugins()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tokens:
            _active.reset(self._tokens.pop())
        if not self._tokens:
            self._exit_plugins()
        self.close()

    # -- plugins (skyward.plugins) -------------------------------------------------------------
    def _enter_plugins(self) -> None:
        """around_client hooks, in plugin order, in this (the user's) thread: joblib's backend
        setting is thread-local. On failure the pool is closed and PluginError raised."""
        from .plugins.compose import enter_client_hooks

        try:
            self._client_hooks = enter_client_hooks(self.spec.plugins, self, self._cluster)
        except BaseException:
            _active.reset(self._tokens.pop())
            self.close()
            raise

    def _exit_plugins(self) -> None:
        hooks = getattr(self, "_client_hooks", None)
        self.__dict__.pop("_client_hooks", None)
        if hooks is not None:
            hooks.close()  # in reverse order of entry

    def _node_plugins(self) -> str | None:
        """The plugins' node-side hooks as they travel in CONFIGURE (computed once)."""
        if not self.spec.plugins:
            return None
        if not hasattr(self, "_plugins_blob"):
            from .plugins.compose import encode_for_nodes

            self._plugins_blob = encode_for_nodes(self.spec.plugins)
        return self._plugins_blob

    def _route_nested(self, origin: NodeChannel, frame: Frame) -> None:
        """A task on ``origin`` submitted work (the client is the hub): run it on the node
        with the fewest tasks in flight and send the result back, neither of them unpickled."""
        _, kind = NESTED.unpack_from(frame.body, 0)
        payload = memoryview(frame.body)[NESTED.size:]

        def done(result: Frame | BaseException) -> None:
            if isinstance(result, BaseException):
                origin.reply(frame.task_id, *serialize.dumps_error(result, tb_text=""))
            else:
                origin.reply(frame.task_id, result.flags, result.body, result.buffers)

        live = [ch for ch in self._channels if ch.lost is None]
        if self._closed or not live:
            done(PoolClosedError("the pool is closed or has no node left; nested work cannot run."))
            return
        start = next(self._rr) % len(live)  # ties go round-robin
        target = min(live[start:] + live[:start], key=lambda c: c.inflight)
        try:
            target.submit(kind, frame.flags, payload, frame.buffers, done)
        except Exception as exc:  # the node was lost meanwhile; submit discarded the buffers
            done(exc)

    def close(self) -> None:
        """Stop every node and destroy what the provider created. Safe to call twice.

        A pool that attached to running nodes (a named pool) only disconnects: its nodes keep
        running for the next client, until their ttl passes with no client or ``skyward down``."""
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

    def _heartbeat(self, ttl: float) -> None:
        interval = max(0.2, min(2.0, ttl / 4)) if ttl > 0 else 2.0
        # A node silent this long (no answer to a ping, no byte at all) is lost: its tasks move.
        limit = max(10.0, 5 * interval)
        while not self._stop.wait(interval):
            for ch in list(self._channels):
                ch.ping()
            for ch in list(self._channels):
                ch.check_silence(limit)

    # -- nodes -------------------------------------------------------------------------------
    def _emit(self, event: ev.Event) -> None:
        if isinstance(event, ev.Error):  # an error message may quote a secret (Log events are
            event = dataclasses.replace(event, message=secrets.redact(event.message))  # built redacted)
        ev.bus.emit(event)

    def _add_nodes(self, count: int) -> None:
        endpoints = self._cluster.start(count)
        for e in endpoints:
            self._emit(ev.InstanceProvisioned(
                pool=self.id, node=e.index, hostname=e.hostname, private_ip=e.private_ip,
            ))
        self._emit(ev.ClusterProvisioned(pool=self.id, nodes=len(self._channels) + len(endpoints)))
        with ThreadPoolExecutor(max_workers=min(16, len(endpoints))) as ex:
            channels = list(ex.map(self._connect, endpoints))
        for ch in channels:
            self._emit(ev.InstanceBootstrapped(pool=self.id, node=ch.node))
        with self._lock:
            self._endpoints.extend(endpoints)
            self._channels.extend(channels)
        self._configure_all()

    def _connect(self, endpoint: Any) -> NodeChannel:
        return NodeChannel(
            endpoint.connect(),
            node=endpoint.index,
            token=self._cluster.token,
            ttl=self.spec.ttl,
            on_output=self._print_output,
            on_lost=self._node_lost,
            on_metric=self._metric,
            on_submit=self._route_nested,
        )

    def _metric(self, node: int, sample: dict[str, Any]) -> None:
        if ev.bus.wants(self.id, ev.Metric):
            self._emit(ev.Metric(
                pool=self.id, node=node, name=sample["name"], value=float(sample["value"]),
                unit=sample.get("unit", ""),
            ))

    def _node_lost(self, node: int, why: BaseException) -> None:
        if not self._closed:
            log.warning("pool %s: node %d was lost (%s)", self.id, node, why)
            self._emit(ev.InstanceLost(pool=self.id, node=node, reason=str(why) or type(why).__name__))
            try:
                self._cluster.node_lost(node)
            except Exception:  # the provider's bookkeeping must not break the pool
                log.exception("pool %s: the provider failed to drop lost node %d", self.id, node)

    def _configure_all(self) -> None:
        with self._lock:
            pairs = list(zip(self._endpoints, self._channels, strict=True))
        settings = self.worker.agent_settings()
        metrics = to_config(self.spec.image.metrics)  # Image normalized them already
        for position, (_, ch) in enumerate(pairs):
            ch.configure({
                "topology": self._topology(position, pairs),
                "worker": settings,
                "metrics": metrics,
                "spill": str(self._cluster.spill_dir) if self._cluster.spill_dir else None,
                "plugins": self._node_plugins(),
            })

    def _topology(self, position: int, pairs: list[tuple[Any, NodeChannel]]) -> dict[str, Any]:
        acc = self.spec.accelerator
        assert acc is None or not isinstance(acc, str)  # Spec converts strings
        count = float(getattr(acc, "count", 0) or 0)
        return {
            "node": position,
            "total_nodes": len(pairs),
            "head_addr": pairs[0][0].private_ip,
            "head_port": self._cluster.head_port,
            "job_id": self.id,
            "peers": [
                {"node": i, "private_ip": e.private_ip, "public_ip": e.public_ip}
                for i, (e, _) in enumerate(pairs)
            ],
            "accelerators": count,
            "total_accelerators": count * len(pairs),
            "accelerator": None if acc is None else {
                "type": acc.name, "count": count, "memory_gb": acc.memory_gb,
                "is_trainium": acc.name.lower().startswith("trainium"),
            },
            "network": {"interface": self._cluster.interface, "bandwidth_gbps": None},
        }

    def subscribe(self, callback: Callable[[ev.Event], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every event of this pool from now on (in order, on
        skyward's event thread); returns a function that unsubscribes. For the events of a
        pool from its very start, use ``sky.subscribe`` before opening it."""
        return ev.bus.subscribe(callback, self.id)

    def events(self) -> Iterator[ev.Event]:
        """Iterate over this pool's events as they happen; ends once the pool is destroyed."""
        return ev.stream(self.id, stop=lambda e: isinstance(e, ev.ClusterDestroyed | ev.ClusterDetached))

    def current_nodes(self) -> int:
        """How many nodes are connected and ready now."""
        return sum(1 for ch in self._channels if ch.lost is None)

    def resize(self, nodes: int | Nodes) -> None:
        """Change the pool's size (and, with sky.Nodes, its elastic range) now.

        Removed nodes finish their running tasks first. With ``Nodes(desired, max=...)`` the
        pool keeps autoscaling between ``desired`` and ``max``.
        """
        self._check_open()
        target = Nodes.of(nodes)
        if not isinstance(nodes, Nodes) and self._nodes.max is not None and target.desired <= self._nodes.max:
            target = Nodes(desired=target.desired, max=self._nodes.max)  # keep the elastic range
        self._nodes = target
        self._scale_to(target.desired)
        self._start_autoscaler()

    def _scale_to(self, target: int) -> None:
        with self._resize_lock:
            with self._lock:
                current = len(self._channels)
            if target > current:
                self._add_nodes(target - current)
                return
            if target == current:
                return
            with self._lock:
                leaving = self._channels[target:]
                endpoints = self._endpoints[target:]
                self._channels = self._channels[:target]
                self._endpoints = self._endpoints[:target]
            deadline = time.monotonic() + self.options.shutdown_timeout
            while any(ch.inflight for ch in leaving) and time.monotonic() < deadline:
                self._stop.wait(0.05)
            for ch in leaving:
                ch.close(shutdown_agent=True)
            self._cluster.stop(endpoints)
            for ch in leaving:
                self._emit(ev.InstanceDestroyed(pool=self.id, node=ch.node))
            self._configure_all()

    # -- elastic pools -----------------------------------------------------------------------
    def _start_autoscaler(self) -> None:
        if self._nodes.max is None or self._nodes.max <= self._nodes.desired:
            return
        with self._lock:
            if self._autoscaler is not None or self._closed:
                return
            self._autoscaler = threading.Thread(target=self._autoscale, name="skyward-autoscale", daemon=True)
        self._autoscaler.start()

    def _autoscale(self) -> None:
        """Tasks already queued on a node stay there; new nodes take their share of what is
        dispatched after they join (round-robin for >>, the next chunks of a running map)."""
        state = ScaleState(last_change=time.monotonic())
        while not self._stop.wait(min(1.0, self.options.reconcile_tick_interval)):
            with self._lock:
                live = [ch for ch in self._channels if ch.lost is None]
            busy = sum(ch.inflight for ch in live)
            target = decide(self._nodes, len(live), busy, self.worker.slots, time.monotonic(),
                            state, self.options)
            if target is None:
                continue
            log.info("autoscale: %d task(s) in flight on %d node(s); scaling to %d", busy, len(live), target)
            try:
                self._scale_to(target)
            except Exception as exc:  # a failed scale step must not end the pool
                if self._closed:
                    return
                log.warning("autoscale step failed: %s", exc)

    # -- dispatch ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError(
                "this pool is closed; dispatch inside its `with` block, or open a new one."
            )

    def _pick(self, target: int | str | None) -> NodeChannel:
        self._check_open()
        channels = self._channels
        if target is None:
            live = [ch for ch in channels if ch.lost is None] or channels
            return live[next(self._rr) % len(live)]
        if target == "head":
            return channels[0]
        if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < len(channels):
            raise ConfigError(
                f"target={target!r} is not valid: use 'head' or a node rank from 0 to {len(channels) - 1}."
            )
        return channels[target]

    def _retries(self, target: int | str | None) -> int:
        """Tasks pinned to a node stay there; the others move when their node is lost."""
        return self.options.retry_on_interruption if target is None else 0

    def _live_other_than(self, ch: NodeChannel) -> NodeChannel | None:
        live = [c for c in self._channels if c.lost is None and c is not ch]
        return min(live, key=lambda c: c.inflight) if live else None

    def _timeout(self, pending: PendingFunction[Any]) -> float | None:
        return pending.timeout if pending.timeout is not None else self.options.default_compute_timeout

    def _encode(self, payload: tuple[Any, ...], describe: Callable[[], str]) -> tuple[int, Any, Any]:
        try:
            return serialize.dumps(payload, self._cluster.spill_dir)
        except Exception as exc:
            raise SerializationError(
                f"{describe()}. Everything a task receives is pickled to reach the node: pass "
                f"plain data, or create such objects inside the function."
            ) from exc

    def _track(self, ch: NodeChannel, name: str, items: int = 1, batch: int | None = None) -> Callable[[bool], None] | None:
        """Emit TaskStarted; the function returned emits TaskCompleted. None when nobody listens."""
        if not ev.bus.wants(self.id, ev.TaskStarted):
            return None
        task, node, start = next(ev.bus.task_ids), ch.node, time.monotonic()
        self._emit(ev.TaskStarted(pool=self.id, task=task, name=name, node=node, items=items, batch=batch))

        def finish(ok: bool) -> None:
            self._emit(ev.TaskCompleted(
                pool=self.id, task=task, name=name, node=node, seconds=time.monotonic() - start,
                ok=ok, items=items, batch=batch,
            ))

        return finish

    def _batch(self, kind: Any, name: str, total: int) -> int | None:
        if not ev.bus.wants(self.id, ev.BatchStarted):
            return None
        batch = next(ev.bus.batch_ids)
        self._emit(ev.BatchStarted(pool=self.id, batch=batch, kind=kind, name=name, total=total))
        return batch

    def _submit(
        self, ch: NodeChannel, pending: PendingFunction[T], batch: int | None = None, retries: int = 0,
    ) -> Future[T]:
        """Send one task to ``ch``. ``retries``: how many times the task may move to another
        node if ``ch``'s node is lost while it runs (calls not tied to one node)."""
        if not isinstance(pending, PendingFunction):
            raise ConfigError(
                f"expected a pending function (a call of a @sky.function function), got {type(pending).__name__}."
            )
        flags, body, buffers = self._encode(
            (pending.fn, pending.args, pending.kwargs, self._timeout(pending)),
            lambda: serialize.describe_unpicklable(pending.fn, pending.args, pending.kwargs),
        )
        future: Future[T] = Future()
        future.set_running_or_notify_cancel()
        name = pending.name
        finish = self._track(ch, name, 1, batch)

        def done(result: Frame | BaseException) -> None:
            if isinstance(result, NodeLostError) and retries > 0 and not self._closed:
                other = self._live_other_than(ch)
                if other is not None:
                    if finish is not None:
                        finish(False)
                    log.warning("node %d was lost while running %s; retrying it on node %d (%d retr%s left)",
                                ch.node, name, other.node, retries - 1, "y" if retries == 2 else "ies")
                    try:
                        _chain(self._submit(other, pending, batch, retries - 1), future)
                    except BaseException as exc:
                        future.set_exception(exc)
                    return
            try:
                value, error = self._decode(result, name, ch.node), None
            except BaseException as exc:
                value, error = None, exc
            if finish is not None:  # before the future completes: a batch ends after its tasks
                finish(error is None)
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)

        ch.submit(Kind.TASK, flags, body, buffers, done)
        return future

    def _decode(self, result: Frame | BaseException, name: str, node: int) -> Any:
        return decode_result(result, name, node)

    def run(self, pending: PendingFunction[T], *, target: int | str | None = None) -> T:
        """Run on one node (round-robin, or ``target``: 'head' or a rank) and return the result."""
        return self._submit(self._pick(target), pending, retries=self._retries(target)).result()

    def run_async(self, pending: PendingFunction[T], *, target: int | str | None = None) -> Future[T]:
        """Like ``run`` but returns at once with a Future."""
        return self._submit(self._pick(target), pending, retries=self._retries(target))

    def broadcast(self, pending: PendingFunction[T]) -> list[T]:
        """Run on every node; results in node order."""
        self._check_open()
        futures = [self._submit(ch, pending) for ch in list(self._channels)]
        return _results(futures)

    def run_parallel(self, group: PendingFunctionGroup) -> tuple[Any, ...] | Iterator[Any]:
        """Run a group's functions at once over the nodes; a tuple, or a generator when streaming."""
        batch = self._batch("gather", group.items[0].name if group.items else "", len(group.items))
        retries = self._retries(None)
        futures = [self._submit(self._pick(None), p, batch, retries) for p in group.items]
        if batch is not None:
            self._finish_batch_when_done(batch, futures)
        if not group.stream:
            return tuple(_results(futures))
        if group.ordered:
            return (f.result() for f in futures)
        return (f.result() for f in as_completed(futures))

    def _finish_batch_when_done(self, batch: int, futures: list[Future[Any]]) -> None:
        left, start = [len(futures)], time.monotonic()
        lock = threading.Lock()

        def one_done(_f: Future[Any]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                done = sum(1 for f in futures if f.exception() is None)
                self._emit(ev.BatchFinished(
                    pool=self.id, batch=batch, ok=done == len(futures), done=done,
                    total=len(futures), seconds=time.monotonic() - start,
                ))

        for f in futures:
            f.add_done_callback(one_done)

    def map(
        self,
        fn: Callable[[Any], T] | RemoteFunction[Any, T],
        items: Iterable[Any],
        *,
        chunksize: int | None = None,
        timeout: float | None = None,
    ) -> list[T]:
        """``fn(item)`` for every item, spread over the nodes; results in input order.

        Items travel in chunks (``chunksize``, automatic by default) so that short calls are not
        dominated by round trips; ``timeout`` is per item (a chunk gets items x timeout).
        """
        self._check_open()
        if timeout is None and isinstance(fn, RemoteFunction):
            timeout = fn.timeout
        if timeout is None:
            timeout = self.options.default_compute_timeout
        fn = unwrap(fn)
        data = list(items)
        if not data:
            return []
        channels = [ch for ch in self._channels if ch.lost is None] or list(self._channels)
        slots = self.worker.slots
        if chunksize is None:
            # ~16 chunks per slot: small enough that uneven items or nodes even out at the
            # end, large enough (up to 1024 items) that short calls are not all round trips.
            chunksize = max(1, min(1024, math.ceil(len(data) / (len(channels) * slots * 16))))
        elif isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise ConfigError(f"chunksize={chunksize!r} is not valid: use an int >= 1, or leave it out.")
        chunks = [data[i : i + chunksize] for i in range(0, len(data), chunksize)]
        name = getattr(fn, "__qualname__", "map function")
        window = slots * 2
        batch = self._batch("map", name, len(data))
        started = time.monotonic()
        finishers: dict[int, Callable[[bool], None] | None] = {}
        done: queue.SimpleQueue[tuple[int, NodeChannel, Frame | BaseException]] = queue.SimpleQueue()
        outstanding = dict.fromkeys(channels, 0)
        results: list[list[Any] | None] = [None] * len(chunks)
        first_error: tuple[int, BaseException] | None = None
        todo = collections.deque(range(len(chunks)))
        retries = [self.options.retry_on_interruption] * len(chunks)

        while any(outstanding.values()) or (todo and first_error is None):
            for ch in self._channels:  # nodes that joined meanwhile (elastic pools) take work too
                outstanding.setdefault(ch, 0)
            while todo and first_error is None:
                live = [c for c in outstanding if c.lost is None]
                if not live:
                    raise NodeLostError("every node of the pool was lost during map(); no node is left to run it.")
                ch = min(live, key=outstanding.__getitem__)
                if outstanding[ch] >= window:
                    break
                sent = todo.popleft()
                chunk = chunks[sent]
                flags, body, buffers = self._encode(
                    (fn, chunk, timeout),
                    functools.partial(serialize.describe_unpicklable, fn, tuple(chunk), {}),
                )
                finishers[sent] = self._track(ch, name, len(chunk), batch)
                ch.submit(Kind.MAP, flags, body, buffers, functools.partial(_put, done, sent, ch))
                outstanding[ch] += 1
            index, ch, result = done.get()
            outstanding[ch] -= 1
            finish = finishers.pop(index, None)
            if isinstance(result, NodeLostError) and retries[index] > 0 and any(
                c.lost is None for c in self._channels
            ):
                retries[index] -= 1  # the node went away: its chunk runs again elsewhere
                log.warning("node %d was lost during map(); its chunk of %d item(s) runs again on another node",
                            ch.node, len(chunks[index]))
                todo.appendleft(index)
                if finish is not None:
                    finish(False)
                continue
            try:
                results[index] = self._decode(result, name, ch.node)
            except BaseException as exc:
                if first_error is None or index < first_error[0]:
                    first_error = (index, exc)
            if finish is not None:
                finish(results[index] is not None)
        if batch is not None:
            done_items = sum(len(chunks[i]) for i, r in enumerate(results) if r is not None)
            self._emit(ev.BatchFinished(
                pool=self.id, batch=batch, ok=first_error is None, done=done_items,
                total=len(data), seconds=time.monotonic() - started,
            ))
        if first_error is not None:
            raise first_error[1]
        return [value for chunk in results for value in chunk]  # type: ignore[union-attr]

    # -- output ------------------------------------------------------------------------------
    def _print_output(self, node: int, task: int, stream: int, data: bytes) -> None:
        text = secrets.redact(data.decode("utf-8", "replace"))
        if ev.bus.wants(self.id, ev.Log):
            self._emit(ev.Log(pool=self.id, level="stderr" if stream == 2 else "stdout", message=text, node=node))
        lines = text.splitlines()
        out = sys.stderr if stream == 2 else sys.stdout
        prefix = f"[node {node}] "
        with self._print_lock:
            try:
                out.write("".join(prefix + line + "\n" for line in lines))
                out.flush()
            except (OSError, ValueError):
                pass


def _put(q: queue.SimpleQueue[Any], index: int, ch: NodeChannel, result: Any) -> None:
    q.put((index, ch, result))


def decode_result(result: Frame | BaseException, name: str, node: int | None = None) -> Any:
    """A RESULT (or REPLY) frame -> the task's value, or raise its exception (the same type
    when it can be rebuilt here, with the remote traceback as ``__cause__``). ``name`` (and the
    ``node``, when known) appear in errors; messages are built only on those paths."""
    if isinstance(result, BaseException):
        raise result
    try:
        outcome = serialize.loads_frame(result)
    except Exception as exc:
        where = f" from node {node}" if node is not None else ""
        raise SerializationError(
            f"the result of {name}{where} could not be unpickled here ({type(exc).__name__}: {exc}). "
            f"The client and the nodes must have the same versions of the packages the result is made of."
        ) from None
    if outcome[0] == "ok":
        return outcome[1]
    if outcome[0] == "err":
        remote: BaseException = outcome[1]
        if outcome[2]:
            remote.__cause__ = RemoteTraceback(outcome[2])
        if node is not None:
            remote.add_note(f"(raised by {name} on node {node})")
        raise remote
    _, type_name, message, tb_text = outcome
    raise RemoteError(type_name, message, tb_text)


def _chain(source: Future[T], target: Future[T]) -> None:
    """Complete ``target`` with whatever ``source`` ends with."""

    def copy(f: Future[T]) -> None:
        exc = f.exception()
        if exc is None:
            target.set_result(f.result())
        else:
            target.set_exception(exc)

    source.add_done_callback(copy)


def _results(futures: list[Future[T]]) -> list[T]:
    """Wait for all; then raise the first error in order, or return the values."""
    for f in futures:
        f.exception()  # waits; do not leave tasks running unobserved when an early one fails
    return [f.result() for f in futures]
