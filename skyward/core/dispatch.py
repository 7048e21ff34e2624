"""Task dispatch: picking a node, sending a task, retrying it when its node is lost, and
decoding what comes back. A mixin of ``Pool`` (skyward.core.pool), which holds the state."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from skyward.bootstrap import serialize
from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import NESTED, Frame, Kind

from ..errors import (
    ConfigError,
    NodeLostError,
    PoolClosedError,
    PoolStoppedError,
    RemoteError,
    RemoteTraceback,
    SerializationError,
)
from ..observe import events as ev
from ..observe import secrets
from ..spec import Options, Spec, Worker
from .function import PendingFunction
from .streaming import split_stream_args, streams_out, submit_streaming

if TYPE_CHECKING:
    from ..providers.base import Cluster

log = logging.getLogger("skyward")
T = TypeVar("T")


class Dispatch:
    """Sends tasks to the pool's nodes (``>>``, ``>``, ``@``) and routes nested work."""

    id: str
    spec: Spec
    options: Options
    worker: Worker
    _cluster: Cluster
    _channels: list[NodeChannel]
    _rr: itertools.count[int]
    _lock: threading.RLock
    _closed: bool
    _drift: dict[str, tuple[str, str, int]]  # package -> (version here, on a node, that node)
    _stopped: str | None = None  # why it was stopped from outside (`skyward down`), if it was

    def _emit(self, event: ev.Event) -> None:
        if isinstance(event, ev.Error):  # an error message may quote a secret (Log events are
            event = dataclasses.replace(event, message=secrets.redact(event.message))  # built redacted)
        ev.bus.emit(event)

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

        live = self._ready()
        if self._closed or not live:
            done(PoolClosedError("the pool is closed or has no node left; nested work cannot run."))
            return
        start = next(self._rr) % len(live)  # ties go round-robin
        target = min(live[start:] + live[:start], key=lambda c: c.inflight)
        try:
            target.submit(kind, frame.flags, payload, frame.buffers, done)
        except Exception as exc:  # the node was lost meanwhile; submit discarded the buffers
            done(exc)

    # -- which nodes take work (skyward.core.healing refines these: replacements, health checks) --
    def _ready(self) -> list[NodeChannel]:
        """The nodes that take tasks now, in rank order."""
        return [ch for ch in self._channels if ch.lost is None]

    def _node_may_come(self) -> bool:
        """Whether a node can take tasks now or later (a lost one may be replaced)."""
        return bool(self._ready())

    def _wait_ready(self) -> list[NodeChannel]:
        """The ready nodes, waiting while none is (raises when none will come back)."""
        live = self._ready()
        if not live:
            raise NodeLostError("every node of the pool was lost; no node is left to run tasks.")
        return live

    def _wait_rank(self, rank: int) -> NodeChannel:
        """The node at ``rank``, waiting while it is being replaced."""
        return self._channels[rank]

    # -- distributed collections (skyward.runtime.collections) --------------------------------
    def _state_address(self, pairs: list[tuple[Any, NodeChannel]]) -> dict[str, Any] | None:
        """Where the nodes reach the collection server: the head node's agent serves it on the
        head's private address (asked once per head; a named pool's head answers every program
        that attaches with the same address, so its collections outlive each of them)."""
        from ..runtime.collections import serve_address

        if not pairs:
            return None
        endpoint, head = pairs[0]
        cached = getattr(self, "_state_served", None)
        if cached is not None and cached[0] is head:
            return cached[1]
        where = serve_address(self, endpoint.private_ip)
        self._state_served = (head, where)
        if where is not None and "error" in where:
            log.warning("pool %s: distributed collections are unavailable: %s", self.id, where["error"])
        return where

    def _collections_node_lost(self, rank: int) -> None:
        from ..runtime.collections import node_lost

        node_lost(self, rank)

    def _flush_collections(self) -> None:
        from ..runtime.collections import flush_client

        flush_client(self)

    # -- dispatch ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._stopped is not None:
            raise PoolStoppedError(self._stopped)
        if self._closed:
            raise PoolClosedError(
                "this pool is closed; dispatch inside its `with` block, or open a new one."
            )

    def _pick(self, target: int | str | None) -> NodeChannel:
        self._check_open()
        channels = self._channels
        if target is None:
            live = self._ready() or self._wait_ready()
            return live[next(self._rr) % len(live)]
        if target == "head":
            return self._wait_rank(0)
        if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < len(channels):
            raise ConfigError(
                f"target={target!r} is not valid: use 'head' or a node rank from 0 to {len(channels) - 1}."
            )
        return self._wait_rank(target)

    def _retries(self, target: int | str | None) -> int:
        """Tasks pinned to a node stay there; the others move when their node is lost."""
        return self.options.retry_on_interruption if target is None else 0

    def _live_other_than(self, ch: NodeChannel) -> NodeChannel | None:
        live = [c for c in self._ready() if c is not ch]
        return min(live, key=lambda c: c.inflight) if live else None

    def _resubmit(self, lost: NodeChannel, pending: PendingFunction[T], batch: int | None, retries: int,
                  future: Future[T]) -> None:
        """Run a task of a lost node again on another node, or on its replacement once one is
        ready (waiting in a thread of its own: this is called on a channel's reader thread)."""
        other = self._live_other_than(lost)
        if other is not None:
            log.warning("node %d was lost while running %s; retrying it on node %d (%d retr%s left)",
                        lost.node, pending.name, other.node, retries, "y" if retries == 1 else "ies")
            try:
                _chain(self._submit(other, pending, batch, retries), future)
            except BaseException as exc:
                future.set_exception(exc)
            return

        def later() -> None:
            try:
                target = min(self._wait_ready(), key=lambda c: c.inflight)
                log.warning("node %d was lost while running %s; retrying it on node %d", lost.node,
                            pending.name, target.node)
                _chain(self._submit(target, pending, batch, retries), future)
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=later, name="skyward-retry", daemon=True).start()

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

    def _submit(
        self, ch: NodeChannel, pending: PendingFunction[T], batch: int | None = None, retries: int = 0,
    ) -> Future[T]:
        """Send one task to ``ch``. ``retries``: how many times the task may move to another
        node if ``ch``'s node is lost while it runs (calls not tied to one node)."""
        if not isinstance(pending, PendingFunction):
            raise ConfigError(
                f"expected a pending function (a call of a @sky.function function), got {type(pending).__name__}."
            )
        out, split = streams_out(pending.fn), split_stream_args(pending.fn, pending.args, pending.kwargs)
        if out or split is not None:  # generator tasks, iterator arguments (skyward.core.streaming)
            return submit_streaming(self, ch, pending, out, split, batch)
        flags, body, buffers = self._encode(
            (pending.fn, pending.args, pending.kwargs, self._timeout(pending)),
            lambda: serialize.describe_unpicklable(pending.fn, pending.args, pending.kwargs),
        )
        future: Future[T] = Future()
        future.set_running_or_notify_cancel()
        name = pending.name
        finish = self._track(ch, name, 1, batch)

        def done(result: Frame | BaseException) -> None:
            if isinstance(result, NodeLostError) and retries > 0 and not self._closed and self._node_may_come():
                if finish is not None:
                    finish(False)
                self._resubmit(ch, pending, batch, retries - 1, future)
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

        try:
            ch.submit(Kind.TASK, flags, body, buffers, done)
        except NodeLostError:  # lost between the pick and the send
            if finish is not None:
                finish(False)
            if retries <= 0 or self._closed or not self._node_may_come():
                raise
            self._resubmit(ch, pending, batch, retries - 1, future)
        return future

    def _decode(self, result: Frame | BaseException, name: str, node: int) -> Any:
        try:
            return decode_result(result, name, node)
        except SerializationError as exc:
            if self._drift:  # a likely cause, found when the nodes joined
                exc.add_note("packages whose versions differ between this machine and the nodes: " + ", ".join(
                    f"{n} {here} here, {there} on node {at}" for n, (here, there, at) in sorted(self._drift.items())))
            raise

    def run(self, pending: PendingFunction[T], *, target: int | str | None = None) -> T:
        """Run on one node (round-robin, or ``target``: 'head' or a rank) and return the result."""
        return self._submit(self._pick(target), pending, retries=self._retries(target)).result()

    def run_async(self, pending: PendingFunction[T], *, target: int | str | None = None) -> Future[T]:
        """Like ``run`` but returns at once with a Future."""
        return self._submit(self._pick(target), pending, retries=self._retries(target))

    def broadcast(self, pending: PendingFunction[T]) -> list[T]:
        """Run on every node; results in node order."""
        self._check_open()
        futures = [self._submit(self._wait_rank(rank), pending) for rank in range(len(self._channels))]
        return _results(futures)


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
