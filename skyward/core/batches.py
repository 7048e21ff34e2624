"""Batches: ``map`` and parallel groups (``&``, gather), their chunking, ordering and
batch events.

One part of a ``Pool`` (skyward.core.pool), built on dispatch: a gather is one dispatched task
per item; ``map`` sends chunks itself (a window of them per node) with dispatch's ``encode``,
``track`` and ``decode``, and asks membership which nodes are ready."""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, as_completed
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

    def run_parallel(self, group: PendingFunctionGroup) -> tuple[Any, ...] | Iterator[Any]:
        """Run a group's functions at once over the nodes; a tuple, or a generator when streaming."""
        self.dispatcher.check_open()  # before its batch is announced
        batch = self._batch("gather", group.items[0].name if group.items else "", len(group.items))
        dispatch = self.dispatcher
        retries = dispatch.retries(None)
        futures = [dispatch.submit(dispatch.pick(None), p, batch, retries) for p in group.items]
        finished = self._finish_batch_when_done(batch, futures) if batch is not None else None
        if not group.stream:
            try:
                return tuple(results(futures))
            finally:
                if finished is not None:
                    finished.wait(5.0)  # emitted by the last future's callback, maybe not yet
                    self._settle()
        from .streaming import flatten  # a generator task's values come in place of its result

        if group.ordered:
            return flatten(f.result() for f in futures)
        return flatten(f.result() for f in as_completed(futures))

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
        channels = members.ready() or members.wait_ready()
        slots = self.worker.slots
        if chunksize is None:
            chunks = _guided(data, len(channels) * slots)
        elif isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise ConfigError(f"chunksize={chunksize!r} is not valid: use an int >= 1, or leave it out.")
        else:
            chunks = [data[i : i + chunksize] for i in range(0, len(data), chunksize)]
        name = getattr(fn, "__qualname__", "map function")
        # The tail's chunks (the smallest, the last ones of guided chunks; all of them with a
        # fixed chunksize) go 2 per slot at most, so that the last of them go to whichever
        # node frees up first; larger ones WINDOW per slot, so that no worker waits for one.
        tail = min(len(c) for c in chunks[:-1]) if len(chunks) > 1 else len(chunks[0])
        batch = self._batch("map", name, len(data))
        started = time.monotonic()
        finishers: dict[int, Callable[..., None] | None] = {}
        done: queue.SimpleQueue[tuple[int, int, NodeChannel, Frame | BaseException]] = queue.SimpleQueue()
        outstanding = dict.fromkeys(channels, 0)
        results: list[list[Any] | None] = [None] * len(chunks)
        first_error: tuple[int, BaseException] | None = None
        todo = collections.deque(range(len(chunks)))
        retries = [self.options.retry_on_interruption] * len(chunks)
        # Each send of a chunk is an attempt; only the outcome of its current attempt counts
        # (a late or doubled answer of an earlier one is dropped), and ``out`` holds where each
        # chunk now is (channel, task id) until that outcome arrives.
        attempts = [0] * len(chunks)
        out: dict[int, tuple[NodeChannel, int]] = {}
        watch = _Watch()

        while any(outstanding.values()) or (todo and first_error is None):
            for ch in members.channels:  # nodes that joined meanwhile (elastic pools) take work too
                outstanding.setdefault(ch, 0)
            while todo and first_error is None:
                ready = members.ready()
                live = [c for c in outstanding if c in ready]
                if not live:
                    if any(outstanding.values()):
                        break  # what is out comes back (or fails over) first
                    if not members.node_may_come():
                        raise NodeLostError("every node of the pool was lost during map(); no node is left to run it.")
                    for c in members.wait_ready():  # a replacement is on its way
                        outstanding.setdefault(c, 0)
                    continue
                ch = min(live, key=outstanding.__getitem__)
                if outstanding[ch] >= slots * (WINDOW if len(chunks[todo[0]]) > tail else 2):
                    break
                sent = todo.popleft()
                chunk = chunks[sent]
                span = dispatch.span(ch, name, batch, self.options.retry_on_interruption - retries[sent])
                flags, body, buffers = dispatch.encode(
                    (fn, chunk, timeout, *(() if span is None else (span.traceparent,))),
                    functools.partial(serialize.describe_unpicklable, fn, tuple(chunk), {}),
                )
                finishers[sent] = dispatch.track(ch, name, len(chunk), batch, (body, buffers), span)
                attempts[sent] += 1
                try:
                    tid = ch.submit(Kind.MAP, flags, body, buffers,
                                    functools.partial(_put, done, sent, attempts[sent], ch))
                except NodeLostError:  # lost between the pick and the send: pick again
                    todo.appendleft(sent)
                    finish = finishers.pop(sent, None)
                    if finish is not None:
                        finish(False)
                    continue
                outstanding[ch] += 1
                out[sent] = (ch, tid)
            try:
                index, attempt, ch, result = done.get(timeout=_AUDIT_EVERY)
            except queue.Empty:
                # Second line of defence: a chunk that is out on no channel any more, yet whose
                # outcome never arrived, would be waited for forever. Run it again (or fail).
                missing = watch.missing(out)
                if missing is None:
                    continue
                index, attempt, (ch, _) = missing, attempts[missing], out[missing]
                log.error("map(): chunk %d of %d was handed to node %d, which no longer has it, and its "
                          "result never arrived; treating it as lost (please report this as a bug)",
                          index, len(chunks), ch.node)
                result = NodeLostError(f"map(): the outcome of a chunk sent to node {ch.node} never arrived.")
            if attempt != attempts[index] or out.get(index, (None,))[0] is not ch:
                log.debug("map(): dropped a stale outcome of chunk %d (attempt %d)", index, attempt)
                continue
            del out[index]
            attempts[index] += 1  # anything more of this attempt is stale
            outstanding[ch] -= 1
            finish = finishers.pop(index, None)
            if isinstance(result, NodeLostError) and retries[index] > 0 and members.node_may_come():
                retries[index] -= 1  # the node went away: its chunk runs again elsewhere
                log.warning("node %d was lost during map(); its chunk of %d item(s) runs again on another node",
                            ch.node, len(chunks[index]))
                todo.appendleft(index)
                if finish is not None:
                    finish(False, result)
                continue
            try:
                results[index] = dispatch.decode(result, name, ch.node)
            except BaseException as exc:
                if first_error is None or index < first_error[0]:
                    first_error = (index, exc)
            if finish is not None:
                finish(results[index] is not None, result)
        if batch is not None:
            done_items = sum(len(chunks[i]) for i, r in enumerate(results) if r is not None)
            self.emit(ev.BatchFinished(
                pool=self.pool_id, batch=batch, ok=first_error is None, done=done_items,
                total=len(data), seconds=time.monotonic() - started,
            ))
            self._settle()
        if first_error is not None:
            raise first_error[1]
        return list(itertools.chain.from_iterable(results))  # type: ignore[arg-type]


def _guided(data: list[Any], slots: int) -> list[list[Any]]:
    """The automatic chunks of ``map``: guided, as OpenMP's schedule of that name. Each chunk
    takes 1/(GUIDED x slots) of the items still left, down to the tail's size, ~16 chunks per
    slot of the whole (at most TAIL_MAX items; the fixed size used before, at most 1024): a
    few large chunks first, so that short calls cost few chunks (each one a pickle, a frame, a
    result and two wake-ups on the client, ~0.1 ms on a 2-core VM where multiprocessing.Pool
    spends 25 us), then smaller ones that even out uneven items or nodes at the end. 100,000
    items on 2 slots: 16 chunks, not 98 (multiprocessing.Pool: 8 of 12,500)."""
    n = len(data)
    least = max(1, min(TAIL_MAX, math.ceil(n / (slots * 16))))
    share = GUIDED * slots
    chunks, start = [], 0
    while start < n:
        size = max(least, (n - start) // share)
        chunks.append(data[start : start + size])
        start += size
    return chunks


# Chunks of map in flight per slot of a node while they are larger than the tail's (see map).
# Beyond the node's lane capacity they wait at its agent, so the worker finds its next chunk as
# it finishes one; 4 measured ~10 % faster than 2 on 100,000 no-op items.
WINDOW = 4
# _guided's constants, measured on 100,000 no-op items on 2 nodes (GUIDED 2, 3, 4; TAIL_MAX
# 1024, 2048, 4096): the fastest pair.
TAIL_MAX = 4096
GUIDED = 3


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


def _put(q: queue.SimpleQueue[Any], index: int, attempt: int, ch: NodeChannel, result: Any) -> None:
    q.put((index, attempt, ch, result))


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
