"""Batches: ``map`` and parallel groups (``&``, gather), their chunking, ordering and
batch events.

One part of a ``Pool`` (skyward.core.pool), built on dispatch: a gather is one dispatched task
per item; ``map`` sends chunks itself (a window of them per node) with dispatch's ``encode``,
``track`` and ``decode``, and asks membership which nodes are ready."""

from __future__ import annotations

import collections
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar, overload

from skyward.bootstrap import serialize
from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import Frame, Kind

from ..errors import ConfigError, DispatchError, NodeLostError
from ..observe import events as ev
from ..spec import Options, Worker
from .dispatch import Dispatcher, results
from .function import PendingFunctionGroup, RemoteFunction, unwrap

log = logging.getLogger("skyward")
T = TypeVar("T")


class Batches:
    """Many tasks at once, results in order."""

    def __init__(self, dispatcher: Dispatcher, options: Options, worker: Worker,
                 settle: Callable[[], None]) -> None:
        """``settle``: called before a batch's call returns, once its last event is out (the
        console prints the batch's last line before the caller's own output)."""
        self.dispatcher, self.members = dispatcher, dispatcher.members
        self.options, self.worker, self._settle = options, worker, settle
        self.emit, self.pool_id = dispatcher.emit, dispatcher.pool_id

    def _batch(self, kind: Any, name: str, total: int) -> int | None:
        if not ev.bus.wants(self.pool_id, ev.BatchStarted):
            return None
        batch = next(ev.bus.batch_ids)
        self.emit(ev.BatchStarted(pool=self.pool_id, batch=batch, kind=kind, name=name, total=total))
        return batch

    def run_parallel(self, group: PendingFunctionGroup,
                     route: Callable[[], Dispatcher] | None = None) -> tuple[Any, ...] | Iterator[Any]:
        """Run a group's functions at once over the nodes; a tuple, or an iterator when streaming.
        ``route``: which dispatcher takes each function (a pool of several node groups), else
        this one."""
        self.dispatcher.check_open()  # before its batch is announced
        batch = self._batch("gather", group.items[0].name if group.items else "", len(group.items))
        futures = []
        for p in group.items:
            dispatch = self.dispatcher if route is None else route()
            futures.append(dispatch.submit(dispatch.pick(None), p, batch, dispatch.retries(None)))
        finished = self._finish_batch_when_done(batch, futures) if batch is not None else None
        if not group.stream:
            try:
                return tuple(results(futures))
            finally:
                if finished is not None:
                    finished.wait(5.0)  # emitted by the last future's callback, maybe not yet
                    self._settle()
        from .streaming import GatherStream  # a generator task's values come in place of its result

        return GatherStream(futures, group.ordered)

    def _finish_batch_when_done(self, batch: int, futures: list[Future[Any]]) -> threading.Event:
        left, start = [len(futures)], time.monotonic()
        lock = threading.Lock()
        finished = threading.Event()

        def one_done(_f: Future[Any]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                done = sum(1 for f in futures if f.exception() is None)
                self.emit(ev.BatchFinished(
                    pool=self.pool_id, batch=batch, ok=done == len(futures), done=done,
                    total=len(futures), seconds=time.monotonic() - start,
                ))
                finished.set()

        for f in futures:
            f.add_done_callback(one_done)
        return finished

    @overload
    def map(self, fn: RemoteFunction[..., T], items: Iterable[Any], *,
            chunksize: int | None = None, timeout: float | None = None) -> list[T]: ...
    @overload
    def map(self, fn: Callable[..., T], items: Iterable[Any], *,
            chunksize: int | None = None, timeout: float | None = None) -> list[T]: ...

    def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[Any],
        *,
        chunksize: int | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """``fn(item)`` for every item, spread over the nodes; results in input order.

        Items travel in chunks (``chunksize``, automatic by default) so that short calls are not
        dominated by round trips; ``timeout`` is per item (a chunk gets items x timeout).
        """
        dispatch, members = self.dispatcher, self.members
        dispatch.check_open()
        if timeout is None and isinstance(fn, RemoteFunction):
            timeout = fn.timeout
        if timeout is None:
            timeout = self.options.default_compute_timeout
        fn = unwrap(fn)
        # A list is sliced as it is (map never changes it); anything else is read once.
        data = items if type(items) is list else list(_iterable(items, fn))
        if not data:
            return []
        if chunksize is not None and (isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1):
            raise ConfigError(f"chunksize={chunksize!r} is not valid: use an int >= 1, or leave it out.")
        channels = members.ready() or members.wait_ready()
        slots = self.worker.slots
        chunker = _Chunker(len(data), len(channels) * slots, chunksize)
        name = getattr(fn, "__qualname__", "map function")
        batch = self._batch("map", name, len(data))
        started = time.monotonic()
        run = _MapRun(dispatch, self.options, fn, name, timeout, data, chunker, slots, batch)
        results, first_error = run.run(channels)
        out: list[Any] = []
        if first_error is None:
            out = run.join()  # the results not joined yet (most were, as they came)
        if batch is not None:  # once the result is made: the events' thread wakes for it
            self.emit(ev.BatchFinished(
                pool=self.pool_id, batch=batch, ok=first_error is None, total=len(data),
                done=len(data) if first_error is None else sum(b - a for (a, b), r in zip(run.bounds, results, strict=True) if r is not None),
                seconds=time.monotonic() - started,
            ))
            self._settle()
        if first_error is not None:
            raise first_error
        return out


class _MapRun:
    """One ``map`` call's chunks on their way (see Batches.map).

    The caller's thread sends chunks, as many as each node's window takes; a chunk's outcome
    is handled where it arrives, on the channel's reader thread: its result is unpickled
    there into its place in ``results`` and joined to the output as soon as every chunk
    before it has been (``join``), and the caller's thread is woken only when it has
    something to do: a chunk left to send (a window has room), a lost node's chunk to send
    again, or the end. (Before, every result crossed to the caller's thread, one wake-up more
    per chunk: ~0.1 ms each on a 2-core VM.) The reader threads never send: a reader blocked
    in a send to its own peer would stop reading what that peer sends back.

    Each send of a chunk is an attempt; only the outcome of its current attempt counts (a
    late or doubled answer of an earlier one is dropped), and ``out`` holds where each chunk
    now is (channel, task id; the id is None until the send returned) until that outcome
    arrives. A chunk is ``outstanding`` on its channel from before its send until its
    outcome is fully handled (stored, or queued again): the map ends only when nothing is
    outstanding and nothing is left to send (or an error stops the sends)."""

    def __init__(self, dispatch: Dispatcher, options: Options, fn: Callable[..., Any], name: str,
                 timeout: float | None, data: list[Any], chunker: _Chunker, slots: int,
                 batch: int | None) -> None:
        self.dispatch, self.members = dispatch, dispatch.members
        self.fn, self.name, self.timeout, self.batch = fn, name, timeout, batch
        self.data, self.chunker = data, chunker
        self.retry = options.retry_on_interruption
        # The tail's chunks (the smallest: guided chunks once at their floor; all of them with
        # a fixed chunksize) go 2 per slot at most, so that the last of them go to whichever
        # node frees up first; larger ones WINDOW per slot, so that no worker waits for one.
        self.limits = (slots * WINDOW, slots * 2)
        self.lock = threading.Lock()
        self.wake = threading.Event()
        # Per chunk, in input order, made as they are sent (chunker): bounds in ``data``, whether
        # it is one of the tail's, its result, retries left and attempts made.
        self.bounds: list[tuple[int, int]] = []
        self.tails: list[bool] = []
        self.results: list[list[Any] | None] = []
        self.retries: list[int] = []
        self.attempts: list[int] = []
        self.first_error: tuple[int, BaseException] | None = None
        # The output: the results of chunks 0 .. joined-1, in one list (see join).
        self.joined = 0
        self.values: list[Any] = []
        self.join_lock = threading.Lock()
        self.todo: collections.deque[int] = collections.deque()  # made, to be sent (again)
        self.out: dict[int, tuple[NodeChannel, int | None]] = {}
        self.outstanding: dict[NodeChannel, int] = {}
        self.finishers: dict[int, Callable[..., None] | None] = {}

    def run(self, channels: list[NodeChannel]) -> tuple[list[list[Any] | None], BaseException | None]:
        """Send every chunk and wait for their outcomes: the results, and the first error in
        input order (None when there is none)."""
        self.outstanding.update(dict.fromkeys(channels, 0))
        watch = _Watch()
        while True:
            self.wake.clear()  # before looking: a wake-up after the look is not missed
            with self.lock:
                sending = self._left()
                if not sending and not any(self.outstanding.values()):
                    break
            if sending:
                self._fill()
            if self.wake.wait(_AUDIT_EVERY):
                continue
            # A pool closed or stopped under this call (from another thread, or its exit hooks)
            # answers nothing more: end the wait with the reason rather than waiting for ever.
            self.dispatch.check_open()
            # Second line of defence: a chunk that is out on no channel any more, yet whose
            # outcome never arrived, would be waited for forever. Run it again (or fail).
            with self.lock:
                out = {index: (ch, tid) for index, (ch, tid) in self.out.items() if tid is not None}
                attempts = {index: self.attempts[index] for index in out}
            missing = watch.missing(out)
            if missing is None:
                continue
            ch = out[missing][0]
            log.error("map(): chunk %d of %d was handed to node %d, which no longer has it, and its "
                      "result never arrived; treating it as lost (please report this as a bug)",
                      missing, len(self.bounds), ch.node)
            self._outcome(missing, attempts[missing], ch,
                          NodeLostError(f"map(): the outcome of a chunk sent to node {ch.node} never arrived."))
        return self.results, None if self.first_error is None else self.first_error[1]

    def _fill(self) -> None:
        """Send chunks while a ready node's window has room (the caller's thread only)."""
        members = self.members
        while True:
            wait = False
            with self.lock:
                if not self._left():
                    return
                outstanding = self.outstanding
                live = members.ready()
                for ch in live:  # nodes that joined meanwhile (elastic pools) take work too
                    outstanding.setdefault(ch, 0)
                if not live:
                    if any(outstanding.values()):
                        return  # what is out comes back (or fails over) first
                    wait = True
                else:
                    ch = min(live, key=outstanding.__getitem__)
                    index = self.todo[0] if self.todo else self._make()
                    if outstanding[ch] >= self.limits[self.tails[index]]:
                        return
                    self.todo.popleft()
                    self.attempts[index] += 1
                    attempt = self.attempts[index]
                    outstanding[ch] += 1
                    self.out[index] = (ch, None)
            if wait:
                if not members.node_may_come():
                    raise NodeLostError("every node of the pool was lost during map(); no node is left to run it.")
                ready = members.wait_ready()  # a replacement is on its way
                with self.lock:
                    for c in ready:
                        self.outstanding.setdefault(c, 0)
                continue
            self._send(index, attempt, ch)

    def _left(self) -> bool:
        """Whether chunks are left to send (under the lock)."""
        return (bool(self.todo) or self.chunker.left > 0) and self.first_error is None

    def _make(self) -> int:
        """The next chunk of the items not sent yet, queued first (under the lock)."""
        start, end, tail = self.chunker.next()
        self.bounds.append((start, end))
        self.tails.append(tail)
        self.results.append(None)
        self.retries.append(self.retry)
        self.attempts.append(0)
        index = len(self.bounds) - 1
        self.todo.appendleft(index)
        return index

    def _send(self, index: int, attempt: int, ch: NodeChannel) -> None:
        dispatch = self.dispatch
        start, end = self.bounds[index]
        chunk = self.data[start:end]  # sliced as it goes: read while in the cache, no copy kept
        finish = None
        try:
            span = dispatch.span(ch, self.name, self.batch, self.retry - self.retries[index])
            flags, body, buffers = dispatch.encode(
                (self.fn, chunk, self.timeout, *(() if span is None else (span.traceparent,))),
                lambda: serialize.describe_unpicklable(self.fn, tuple(chunk), {}),  # (a copy only on failure)
            )
            finish = self.finishers[index] = dispatch.track(ch, self.name, len(chunk), self.batch,
                                                            (body, buffers), span)
            # queue: beyond the lane's capacity, chunks wait at the worker (not at its agent, a
            # relay of two more socket crossings each way); the window bounds how many.
            tid = ch.submit(Kind.MAP, flags, body, buffers, functools.partial(self._outcome, index, attempt, ch),
                            queue=True)
        except BaseException as exc:  # not sent: its outcome will never come
            with self.lock:
                if self.attempts[index] == attempt:
                    self.out.pop(index, None)
                    self.finishers.pop(index, None)
                    self.outstanding[ch] -= 1
                    self.todo.appendleft(index)
            if finish is not None:
                finish(False)
            if isinstance(exc, NodeLostError):
                return  # lost between the pick and the send: pick again
            raise
        with self.lock:
            if self.attempts[index] == attempt:  # its outcome has not come yet
                self.out[index] = (ch, tid)

    def _outcome(self, index: int, attempt: int, ch: NodeChannel, result: Frame | BaseException) -> None:
        """A chunk's outcome, on whichever thread it arrives (a channel's reader, mostly)."""
        lost = isinstance(result, NodeLostError)
        may_come = lost and self.members.node_may_come()
        with self.lock:
            if attempt != self.attempts[index] or self.out.get(index, (None,))[0] is not ch:
                log.debug("map(): dropped a stale outcome of chunk %d (attempt %d)", index, attempt)
                return
            del self.out[index]
            self.attempts[index] += 1  # anything more of this attempt is stale
            finish = self.finishers.pop(index, None)
            again = may_come and self.retries[index] > 0
            if again:  # the node went away: its chunk runs again elsewhere
                self.retries[index] -= 1
                self.todo.appendleft(index)
                self.outstanding[ch] -= 1
        if again:
            log.warning("node %d was lost during map(); its chunk of %d item(s) runs again on another node",
                        ch.node, self.bounds[index][1] - self.bounds[index][0])
            if finish is not None:
                finish(False, result)
            self.wake.set()
            return
        value: list[Any] | None = None
        error: BaseException | None = None
        seconds = None
        try:
            value, seconds = self.dispatch.decode_chunk(result, self.name, ch.node)
        except BaseException as exc:
            error = exc
        if finish is not None:  # before the chunk counts as done: a batch ends after its tasks
            finish(error is None, result)
        with self.lock:
            if error is None:
                self.results[index] = value
                if seconds is not None:
                    self.chunker.timed(self.bounds[index][1] - self.bounds[index][0], seconds)
            elif self.first_error is None or index < self.first_error[0]:
                self.first_error = (index, error)
            self.outstanding[ch] -= 1
            # The caller's thread is needed to send (a window has room now) and at the end.
            wake = self._left() or not any(self.outstanding.values())
        if error is None:
            self.join()
        if wake:
            self.wake.set()

    def join(self) -> list[Any]:
        """Join the results that have come, in input order, into the output list, and return
        it (call once more when every chunk has its outcome: it then holds every result).

        The thread that stores a chunk's result joins it, with any that came before it and
        waited for it, while later chunks are still on their way; mp.Pool puts each chunk in
        its place as it comes too. Joining all the chunks after the last one came put a copy
        of every result, and the freeing of every chunk's list, between the last result and
        the caller: ~17 % of the client's time in a 1,000,000-item map on 16 nodes."""
        with self.join_lock:
            results, at = self.results, self.joined
            if self.first_error is not None:
                return self.values
            while at < len(results):
                part = results[at]
                if part is None:
                    break
                if at == 0:
                    self.values = part  # a list of its own, made by its unpickling
                else:
                    self.values += part  # 3x faster than list(chain(...))
                results[at] = _JOINED  # done; the chunk's own list goes
                at += 1
            self.joined = at
            return self.values


class _Chunker:
    """Where each chunk of ``map``'s items ends, decided as it is sent: a fixed ``chunksize``,
    or the automatic chunks, guided (as OpenMP's schedule of that name) and timed.

    Guided: each chunk takes 1/(GUIDED x slots) of the items still left, down to a floor: a
    few large chunks first, so that short calls cost few chunks (each a pickle, a frame, a
    result and a wake-up or two on the client, ~0.1 ms on a 2-core VM where
    multiprocessing.Pool spends 25 us), then smaller ones that even out uneven items or nodes
    at the end. Until a chunk's time is known the floor is 1/16 of a slot's share of the whole
    (at most TAIL_MAX items): 100,000 items on 2 slots make 16 chunks, not 98
    (multiprocessing.Pool: 8 of 12,500).

    Timed: each result of a chunk says how long its calls took on the node. The floor then
    grows to what keeps the client from being the bottleneck: a chunk on each of the pool's
    slots must take at least as long as the client spends on all of them, ``slots x
    CHUNK_COST`` (16 slots: 1.6 ms; 2 slots: 0.2 ms), reckoned from the time per item of
    the chunks timed so far, and never above half a slot's share of the whole. Cheap calls
    on many slots thus travel in a few large chunks (1,000,000 no-op items on 16 slots: ~30
    chunks where the untimed floor made 128, which left the client, not the nodes, setting
    the pace on a 16-core machine), while slow ones keep small chunks at the end, where the
    imbalance they leave is at most one chunk's time."""

    def __init__(self, n: int, slots: int, chunksize: int | None = None) -> None:
        self.n, self.slots, self.fixed, self.start = n, slots, chunksize, 0
        self.least = max(1, min(TAIL_MAX, math.ceil(n / (slots * 16))))
        self.most = max(self.least, math.ceil(n / (slots * 2)))
        self.share = GUIDED * slots
        self.items, self.seconds = 0, 0.0  # the chunks timed so far

    def timed(self, items: int, seconds: float) -> None:
        """A chunk of ``items`` took ``seconds`` on its node."""
        if items > 0 and seconds >= 0:
            self.items += items
            self.seconds += seconds

    def floor(self) -> int:
        if not self.items:
            return self.least
        if self.seconds <= 0:
            return self.most
        per_item = self.seconds / self.items
        return max(self.least, min(self.most, math.ceil(self.slots * CHUNK_COST / per_item)))

    @property
    def left(self) -> int:
        """Items not in a chunk yet."""
        return self.n - self.start

    def next(self) -> tuple[int, int, bool]:
        """The next chunk's bounds, and whether it is one of the tail's (at the floor)."""
        start, left = self.start, self.left
        if self.fixed is not None:
            size, tail = self.fixed, True
        else:
            floor = self.floor()
            size = max(floor, left // self.share)
            tail = size <= floor
        self.start += min(size, left)
        return start, self.start, tail


# Chunks of map in flight per slot of a node while they are larger than the tail's (see map).
# Beyond the node's lane capacity they wait at its agent, so the worker finds its next chunk as
# it finishes one; 4 measured ~10 % faster than 2 on 100,000 no-op items.
WINDOW = 4
# _Chunker's constants, measured on 100,000 no-op items on 2 nodes (GUIDED 2, 3, 4; TAIL_MAX
# 1024, 2048, 4096): the fastest pair.
TAIL_MAX = 4096
GUIDED = 3
# What one chunk costs the client (a pickle, a frame out, a result read and unpickled, the
# wake-ups): 70-100 us measured with chunksize=1 on a 2-core VM.
CHUNK_COST = 100e-6


# A chunk's result once joined into the output (see _MapRun.join): done, and no longer kept.
_JOINED: list[Any] = []


def _iterable(items: Any, fn: Callable[..., Any]) -> Iterable[Any]:
    """``items`` as map() takes it; a clear error for a single value passed instead."""
    try:
        iter(items)
    except TypeError:
        name = getattr(fn, "__name__", "fn")
        raise DispatchError(
            f"pool.map({name}, {items!r}): items must be an iterable of the arguments to call "
            f"{name} with (a list, range, generator...), not {_a(type(items).__name__)}. Write "
            f"pool.map({name}, [{items!r}]), or {name}({items!r}) >> pool for a single call."
        ) from None
    return items


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


_AUDIT_EVERY = 1.0  # seconds without any outcome before map() checks that its chunks are still out


class _Watch:
    """Finds a chunk that no channel holds any more and whose outcome did not arrive. A
    channel drops a task and calls its callback in one go, so a chunk missing at two checks
    in a row (a second apart) has lost its outcome; one missing once may be on its way."""

    def __init__(self) -> None:
        self._seen: set[tuple[int, int]] = set()

    def missing(self, out: dict[int, tuple[NodeChannel, int]]) -> int | None:
        gone = {(index, tid) for index, (ch, tid) in out.items() if not ch.holds(tid)}
        again, self._seen = gone & self._seen, gone
        return min(again)[0] if again else None
