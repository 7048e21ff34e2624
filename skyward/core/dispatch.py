"""Dispatch: one task at a time. Picking a node, encoding and sending the task, retrying it
when its node is lost, and decoding what comes back; and routing the work tasks submit from
the nodes (the client is their hub).

One part of a ``Pool`` (skyward.core.pool), built on membership: it asks membership which
nodes are ready (``ready``, ``wait_ready``, ``wait_rank``, ``node_may_come``) and whether the
pool is still open, and changes nothing there. Batches (``map``, gather) and streaming tasks
use its ``encode``, ``track``, ``decode`` and ``submit``."""

from __future__ import annotations

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
from ..spec import Options
from .function import PendingFunction
from .membership import Membership, together
from .streaming import split_stream_args, streams_out, submit_streaming

if TYPE_CHECKING:
    from ..observe.tracing import PoolTracer, TaskSpan

log = logging.getLogger("skyward")
T = TypeVar("T")


class Dispatcher:
    """Sends tasks to the pool's nodes (``>>``, ``>``, ``@``) and routes nested work."""

    def __init__(self, members: Membership, options: Options, emit: Callable[[ev.Event], None]) -> None:
        self.members, self.options, self.emit = members, options, emit
        self.pool_id = members.pool_id
        self.rr = itertools.count()  # round-robin over the ready nodes
        self.tracer: PoolTracer | None = None  # set by the pool when OTEL_* ask for traces
        # Tasks out on a channel, for ``audit``: their callback -> (channel, task id).
        self._watched: dict[Once, tuple[NodeChannel, int]] = {}
        self._suspects: set[Once] = set()
        self._watch_lock = threading.Lock()

    def check_open(self) -> None:
        self.members.check_owner()  # a forked child's frames would mix with the parent's
        if self.members.stopped is not None:
            raise PoolStoppedError(self.members.stopped)
        if self.members.closed:
            raise PoolClosedError(
                "this pool is closed; dispatch inside its `with` block, or open a new one."
            )

    # -- picking a node ----------------------------------------------------------------------
    def pick(self, target: int | str | None) -> NodeChannel:
        self.check_open()
        members = self.members
        if target is None:
            live = members.ready() or members.wait_ready()
            return live[next(self.rr) % len(live)]
        if target == "head":
            return members.wait_rank(0)
        size = members.size()
        if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < size:
            raise ConfigError(
                f"target={target!r} is not valid: use 'head' or a node rank from 0 to {size - 1}."
            )
        return members.wait_rank(target)

    def least_busy(self) -> NodeChannel | None:
        """The ready node with the fewest tasks in flight (ties go round-robin)."""
        live = self.members.ready()
        if not live:
            return None
        start = next(self.rr) % len(live)
        return min(live[start:] + live[:start], key=lambda c: c.inflight)

    # -- the second line of defence -----------------------------------------------------------
    def send(self, ch: NodeChannel, kind: int, flags: int, body: Any, buffers: Any,
             done: Callable[[Frame | BaseException], None],
             on_frame: Callable[[Frame], None] | None = None) -> int:
        """``ch.submit`` with ``done`` run once at most, and watched until it has (``audit``)."""
        once = Once(done)
        tid = ch.submit(kind, flags, body, buffers, once, on_frame)
        with self._watch_lock:
            if not once.ran:
                self._watched[once] = (ch, tid)
        return tid

    def audit(self) -> None:
        """Called every heartbeat: a task that its channel no longer holds, yet whose outcome
        never came, would be waited for forever; end it as lost (it runs again elsewhere when
        it may). A channel drops a task and calls its callback in one go, so only a task seen
        missing at two audits in a row counts."""
        with self._watch_lock:
            for done in [d for d in self._watched if d.ran]:
                del self._watched[done]
            gone = {done for done, (ch, tid) in self._watched.items() if not ch.holds(tid)}
            again, self._suspects = gone & self._suspects, gone
            lost = [(done, self._watched.pop(done)[0]) for done in again]
        for done, ch in lost:
            log.error("a task handed to node %d is no longer there and its result never arrived; "
                      "treating it as lost (please report this as a bug)", ch.node)
            done(NodeLostError(f"the outcome of a task sent to node {ch.node} never arrived."))

    def retries(self, target: int | str | None) -> int:
        """Tasks pinned to a node stay there; the others move when their node is lost."""
        return self.options.retry_on_interruption if target is None else 0

    # -- one task ----------------------------------------------------------------------------
    def timeout_of(self, pending: PendingFunction[Any]) -> float | None:
        return pending.timeout if pending.timeout is not None else self.options.default_compute_timeout

    def encode(self, payload: tuple[Any, ...], describe: Callable[[], str]) -> tuple[int, Any, Any]:
        try:
            spill = self.members.cluster.spill_dir  # a Local pool's: the nodes are on this host
            return serialize.dumps(payload, spill, compress=spill is None)
        except Exception as exc:
            raise SerializationError(
                f"{describe()}. Everything a task receives is pickled to reach the node: pass "
                f"plain data, or create such objects inside the function."
            ) from exc

    def span(self, ch: NodeChannel, name: str, batch: int | None = None, attempt: int = 0) -> TaskSpan | None:
        """The task's span when the pool is traced (its traceparent goes last in the payload)."""
        return None if self.tracer is None else self.tracer.task(name, ch.node, batch, attempt)

    def track(self, ch: NodeChannel, name: str, items: int = 1, batch: int | None = None,
              payload: tuple[Any, serialize.Buffers] | None = None, span: TaskSpan | None = None,
              ) -> Callable[..., None] | None:
        """Emit TaskStarted; the function returned, ``finish(ok, result=None)``, emits
        TaskCompleted and ends ``span``. None when nobody listens and there is no span."""
        if span is None and not ev.bus.wants(self.pool_id, ev.TaskStarted):
            return None
        task, node, start = next(ev.bus.task_ids), ch.node, time.monotonic()
        sent = 0 if payload is None else _size(*payload)
        self.emit(ev.TaskStarted(pool=self.pool_id, task=task, name=name, node=node, items=items, batch=batch))

        def finish(ok: bool, result: Frame | BaseException | None = None) -> None:
            received = _size(result.body, result.buffers) if isinstance(result, Frame) else 0
            if span is not None:
                span.end(ok, sent, received, "lost" if isinstance(result, NodeLostError) else None)
            self.emit(ev.TaskCompleted(
                pool=self.pool_id, task=task, name=name, node=node, seconds=time.monotonic() - start,
                ok=ok, items=items, batch=batch, bytes_sent=sent, bytes_received=received,
            ))

        return finish

    def decode(self, result: Frame | BaseException, name: str, node: int) -> Any:
        """The task's value (see decode_result)."""
        return self.decode_outcome(result, name, node)[1]

    def decode_chunk(self, result: Frame | BaseException, name: str, node: int) -> tuple[list[Any], float | None]:
        """A map chunk's values, and how long its calls took on the node (None where the node
        did not say)."""
        outcome = self.decode_outcome(result, name, node)
        return outcome[1], (outcome[2] if len(outcome) > 2 else None)

    def decode_outcome(self, result: Frame | BaseException, name: str, node: int) -> tuple[Any, ...]:
        """decode_outcome, with the packages whose versions differ between here and the nodes
        noted on an error to unpickle (a likely cause, found when the nodes joined)."""
        try:
            return decode_outcome(result, name, node)
        except SerializationError as exc:
            drift = self.members.drift
            if drift:
                exc.add_note("packages whose versions differ between this machine and the nodes: " + ", ".join(
                    f"{n} {here} here, {there} on node {at}" for n, (here, there, at) in sorted(drift.items())))
            raise

    def submit(
        self, ch: NodeChannel, pending: PendingFunction[T], batch: int | None = None, retries: int = 0,
        attempt: int = 0, encoded: tuple[int, Any, Any] | None = None,
    ) -> Future[T]:
        """Send one task to ``ch``. ``retries``: how many times the task may move to another
        node if ``ch``'s node is lost while it runs (calls not tied to one node). ``encoded``:
        the task already pickled (``shared_payload``: the same for every node of a broadcast)."""
        if not isinstance(pending, PendingFunction):
            raise ConfigError(
                f"expected a pending function (a call of a @sky.function function), got {type(pending).__name__}."
            )
        out, split = streams_out(pending.fn), split_stream_args(pending.fn, pending.args, pending.kwargs)
        if out or split is not None:  # generator tasks, iterator arguments (skyward.core.streaming)
            return submit_streaming(self, ch, pending, out, split, batch)
        name = pending.name
        span = self.span(ch, name, batch, attempt)
        flags, body, buffers = encoded if encoded is not None and span is None else self._task(pending, span)
        future: Future[T] = Future()
        future.set_running_or_notify_cancel()
        finish = self.track(ch, name, 1, batch, (body, buffers), span)
        members = self.members

        def done(result: Frame | BaseException) -> None:
            if isinstance(result, NodeLostError) and retries > 0 and not members.closed and members.node_may_come():
                if finish is not None:
                    finish(False, result)
                self._resubmit(ch, pending, batch, retries - 1, future, attempt + 1)
                return
            try:
                value, error = self.decode(result, name, ch.node), None
            except BaseException as exc:
                value, error = None, exc
            if finish is not None:  # before the future completes: a batch ends after its tasks
                finish(error is None, result)
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)

        try:
            self.send(ch, Kind.TASK, flags, body, buffers, done)
        except NodeLostError as exc:  # lost between the pick and the send
            if finish is not None:
                finish(False, exc)
            if retries <= 0 or members.closed or not members.node_may_come():
                raise
            self._resubmit(ch, pending, batch, retries - 1, future, attempt + 1)
        return future

    def _resubmit(self, lost: NodeChannel, pending: PendingFunction[T], batch: int | None, retries: int,
                  future: Future[T], attempt: int = 1) -> None:
        """Run a task of a lost node again on another node, or on its replacement once one is
        ready (waiting in a thread of its own: this is called on a channel's reader thread)."""
        live = [c for c in self.members.ready() if c is not lost]
        other = min(live, key=lambda c: c.inflight) if live else None
        if other is not None:
            log.warning("node %d was lost while running %s; retrying it on node %d (%d retr%s left)",
                        lost.node, pending.name, other.node, retries, "y" if retries == 1 else "ies")
            try:
                chain(self.submit(other, pending, batch, retries, attempt), future)
            except BaseException as exc:
                future.set_exception(exc)
            return

        def later() -> None:
            try:
                target = min(self.members.wait_ready(), key=lambda c: c.inflight)
                log.warning("node %d was lost while running %s; retrying it on node %d", lost.node,
                            pending.name, target.node)
                chain(self.submit(target, pending, batch, retries, attempt), future)
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=later, name="skyward-retry", daemon=True).start()

    # -- the operators -----------------------------------------------------------------------
    def run(self, pending: PendingFunction[T], *, target: int | str | None = None) -> T:
        return self.submit(self.pick(target), pending, retries=self.retries(target)).result()

    def run_async(self, pending: PendingFunction[T], *, target: int | str | None = None) -> Future[T]:
        return self.submit(self.pick(target), pending, retries=self.retries(target))

    def broadcast(self, pending: PendingFunction[T]) -> list[T]:
        self.check_open()
        if not self.members.size():
            self.members.wait_ready()  # an asleep pool wakes: "every node" is then its node
        encoded = self.shared_payload(pending) if self.members.size() > 1 else None
        nodes = [self.members.wait_rank(rank) for rank in range(self.members.size())]
        with together():  # (links that share a connection: one write for all of them)
            futures = [self.submit(ch, pending, encoded=encoded) for ch in nodes]
        return results(futures)

    def shared_payload(self, pending: PendingFunction[Any]) -> tuple[int, Any, Any] | None:
        """A task pickled once for every node it goes to (``@``: the function and its arguments
        were pickled, and compressed, once per node: 32 times a 40 MB array's 15 ms on 32
        nodes). None where each node's differs or is its own: a traced pool's (a span each), a
        Local pool's (large buffers go through shared-memory segments, each read once), a
        streaming task's."""
        if self.tracer is not None or self.members.cluster.spill_dir is not None:
            return None
        if streams_out(pending.fn) or split_stream_args(pending.fn, pending.args, pending.kwargs) is not None:
            return None
        return self._task(pending, None)

    def _task(self, pending: PendingFunction[Any], span: TaskSpan | None) -> tuple[int, Any, Any]:
        """A call pickled for the wire: function, arguments, timeout (and the span's traceparent)."""
        return self.encode(
            (pending.fn, pending.args, pending.kwargs, self.timeout_of(pending),
             *(() if span is None else (span.traceparent,))),
            lambda: serialize.describe_unpicklable(pending.fn, pending.args, pending.kwargs),
        )

    # -- work the nodes submit ---------------------------------------------------------------
    def route_nested(self, origin: NodeChannel, frame: Frame) -> None:
        """A task on ``origin`` submitted work (the client is the hub): run it on the node
        with the fewest tasks in flight and send the result back, neither of them unpickled."""
        _, kind = NESTED.unpack_from(frame.body, 0)
        payload = memoryview(frame.body)[NESTED.size:]

        def done(result: Frame | BaseException) -> None:
            if isinstance(result, BaseException):
                origin.reply(frame.task_id, *serialize.dumps_error(result, tb_text=""))
            else:
                origin.reply(frame.task_id, result.flags, result.body, result.buffers)

        target = None if self.members.closed else self.least_busy()
        if target is None:
            done(PoolClosedError("the pool is closed or has no node left; nested work cannot run."))
            return
        try:
            target.submit(kind, frame.flags, payload, frame.buffers, done)
        except Exception as exc:  # the node was lost meanwhile; submit discarded the buffers
            done(exc)


def decode_result(result: Frame | BaseException, name: str, node: int | None = None) -> Any:
    """A RESULT (or REPLY) frame -> the task's value, or raise its exception (the same type
    when it can be rebuilt here, with the remote traceback as ``__cause__``). ``name`` (and the
    ``node``, when known) appear in errors; messages are built only on those paths."""
    return decode_outcome(result, name, node)[1]


def decode_outcome(result: Frame | BaseException, name: str, node: int | None = None) -> tuple[Any, ...]:
    """decode_result's work: the outcome as the node sent it when it is a value, ``("ok",
    value)``, or ``("ok", values, seconds)`` for a map chunk (how long its calls took)."""
    if isinstance(result, BaseException):
        raise result
    try:
        outcome = serialize.loads_frame(result)
    except Exception as exc:
        where = f" from node {node}" if node is not None else ""
        raise SerializationError(
            f"the result of {name}{where} could not be unpickled here ({type(exc).__name__}: {exc}). "
            + (
                "It holds data on a device this machine does not have (a GPU array of a library other "
                "than torch, whose tensors land on the CPU here by themselves): move it to the CPU on "
                "the node before returning it (cupy: .get(); others: their to-host call)."
                if "cuda" in str(exc).lower() or "device" in str(exc).lower()
                else "The client and the nodes must have the same versions of the packages the result is made of."
            )
        ) from None
    if outcome[0] == "ok":
        return outcome
    if outcome[0] == "err":
        remote: BaseException = outcome[1]
        if outcome[2]:
            remote.__cause__ = RemoteTraceback(outcome[2])
        if node is not None:
            remote.add_note(f"(raised by {name} on node {node})")
        raise remote
    _, type_name, message, tb_text = outcome
    raise RemoteError(type_name, message, tb_text)


class Once:
    """A task's callback that runs once: its first outcome counts, any later one is dropped
    (the channel gives each task exactly one; this holds even if it ever did not)."""

    # The callback waits in a one-item list: list.pop is atomic, so whichever outcome pops it
    # first runs it, without a lock of its own per task.
    __slots__ = ("_done",)

    def __init__(self, done: Callable[[Frame | BaseException], None]) -> None:
        self._done = [done]

    @property
    def ran(self) -> bool:
        return not self._done

    def __call__(self, result: Frame | BaseException) -> None:
        try:
            done = self._done.pop()  # let go of the callback: its future holds the result
        except IndexError:
            log.debug("dropped a second outcome of one task: %r", result)
            return
        done(result)


def _size(body: Any, buffers: serialize.Buffers) -> int:
    return memoryview(body).nbytes + sum(memoryview(data).nbytes for _, data in buffers)


def chain(source: Future[T], target: Future[T]) -> None:
    """Complete ``target`` with whatever ``source`` ends with."""

    def copy(f: Future[T]) -> None:
        exc = f.exception()
        if exc is None:
            target.set_result(f.result())
        else:
            target.set_exception(exc)

    source.add_done_callback(copy)


def results(futures: list[Future[T]]) -> list[T]:
    """Wait for all; then raise the first error in order, or return the values."""
    for f in futures:
        f.exception()  # waits; do not leave tasks running unobserved when an early one fails
    return [f.result() for f in futures]
