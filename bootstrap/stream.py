"""Streaming in and out of a task, with backpressure.

Out: a generator task's values go back as YIELD frames, each a batch of whatever the generator
produced since the last frame (a sender thread batches them, so a fast generator sends few
frames and a slow one sends each value at once). The node runs at most ``WINDOW_ITEMS`` values
or ``WINDOW_BYTES`` bytes ahead of the consumer: the client returns CREDIT frames for what it
has taken, and the generator waits (its timeout paused) while the window is full. The consumer
closing its iterator sends STOP: the generator is closed at its current ``yield``
(GeneratorExit), its ``finally`` blocks run, and the task ends.

In: an iterator argument is replaced on the client by a ``StreamArg`` placeholder. On the node it
unpickles into a ``FeedIterator`` that pulls batches (PULL -> FEED) from the client, one batch
ahead of the task, so neither side holds more than two batches of it. The client reads the
user's iterator in a thread of its own, in batches that grow while they stay small.
"""

from __future__ import annotations

import collections
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

from . import serialize
from .frames import Frame, FrameWriter, Kind

WINDOW_ITEMS = 8192
WINDOW_BYTES = 16 * 1024 * 1024
CREDIT = struct.Struct("!QQ")  # items, bytes taken by the consumer
FEED_HEAD = struct.Struct("!IB")  # argument index, status
FEED_ITEMS, FEED_END, FEED_ERROR = 0, 1, 2
PULL = struct.Struct("!I")  # argument index
_FEED_BATCH_BYTES = 256 * 1024  # a feed batch grows while it pickles to less than this
_FEED_MAX_ITEMS = 4096


def _size(body: Any, buffers: serialize.Buffers) -> int:
    return len(body) + sum(memoryview(d).nbytes for _, d in buffers)


# -- node side: a generator task's values out -----------------------------------------------------
class OutStream:
    """Sends one generator task's values (the task thread puts, a sender thread sends)."""

    def __init__(self, writer: FrameWriter, tid: int, spill: Any = None,
                 pause: Callable[[bool], None] | None = None) -> None:
        self.writer, self.tid, self.spill, self.pause = writer, tid, spill, pause
        self.cond = threading.Condition()
        self.queued: list[Any] = []
        self.inflight_items = 0
        self.inflight_bytes = 0
        self.stopped = False
        self.closing = False
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self._send_loop, name="skyward-yield", daemon=True)
        self.thread.start()

    def put(self, item: Any) -> bool:
        """Queue one value; waits while the window is full. False once the consumer stopped."""
        with self.cond:
            if self._full():
                if self.pause is not None:
                    self.pause(True)
                try:
                    while self._full():
                        self.cond.wait()
                finally:
                    if self.pause is not None:
                        self.pause(False)
            if self.stopped:
                return False
            self.queued.append(item)
            if len(self.queued) == 1:
                self.cond.notify_all()
            return True

    def _full(self) -> bool:
        return not self.stopped and self.failed is None and (
            self.inflight_items + len(self.queued) >= WINDOW_ITEMS or self.inflight_bytes >= WINDOW_BYTES)

    def credit(self, items: int, nbytes: int) -> None:
        with self.cond:
            self.inflight_items -= items
            self.inflight_bytes -= nbytes
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.queued.clear()
            self.cond.notify_all()

    def finish(self) -> None:
        """Send what is queued, then let the sender go (before the task's RESULT is sent)."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.thread.join()
        if self.failed is not None:
            raise self.failed

    def _send_loop(self) -> None:
        while True:
            with self.cond:
                while not self.queued and not self.closing and not self.stopped:
                    self.cond.wait()
                batch, self.queued = self.queued, []
                if not batch and (self.closing or self.stopped):
                    return
            try:
                payload = serialize.dumps(batch, self.spill)
                error = None
            except Exception as exc:
                # One value spoils the whole batch it was queued in: the values ahead of it still
                # go out, in order, and the error follows them, where the generator yielded it.
                bad = _first_unpicklable(batch)
                error = self._unpicklable(batch[bad] if bad < len(batch) else None, exc)
                batch = batch[:bad]
                payload = None
                if batch:
                    try:
                        payload = serialize.dumps(batch, self.spill)
                    except Exception:
                        batch = []
            if payload is not None and not self._send(batch, payload):
                return
            if error is not None:
                with self.cond:
                    self.failed = error
                    self.stopped = True
                    self.cond.notify_all()
                return

    def _send(self, batch: list[Any], payload: tuple[int, Any, serialize.Buffers]) -> bool:
        flags, body, buffers = payload
        size = _size(body, buffers)
        with self.cond:
            self.inflight_items += len(batch)
            self.inflight_bytes += size
        try:
            self.writer.send_parts(Kind.YIELD, self.tid, flags, body, buffers)
        except OSError:
            self.stop()
            return False
        return True

    @staticmethod
    def _unpicklable(value: Any, exc: Exception) -> BaseException:
        from skyward.errors import SerializationError

        what = "a value" if value is None else f"a {type(value).__qualname__}"
        return SerializationError(
            f"{what} the generator yielded could not be pickled ({type(exc).__name__}: {exc}); "
            f"yield plain data (numbers, strings, lists, dicts, arrays).")


def _first_unpicklable(batch: list[Any]) -> int:
    """The index of the first value of ``batch`` that does not pickle (len(batch) if none does)."""
    for i, value in enumerate(batch):
        try:
            cloudpickle.dumps(value, protocol=5, buffer_callback=lambda _b: None)
        except Exception:
            return i
    return len(batch)


def run_generator(gen: Iterator[Any], out: OutStream) -> None:
    """Drive ``gen`` into ``out``; close it when the consumer stops."""
    try:
        while not out.stopped:  # stopped before the first value: the generator never starts
            try:
                item = next(gen)
            except StopIteration:
                break
            if not out.put(item):
                break
    finally:
        if out.stopped and hasattr(gen, "close"):
            gen.close()  # GeneratorExit at the yield: the generator's finally blocks run here
        out.finish()  # what was yielded before an error still arrives before the error


# -- node side: an iterator argument in ----------------------------------------------------------
class FeedIterator:
    """An iterator argument on the node: pulls batches from the client, one batch ahead."""

    def __init__(self, writer: FrameWriter, tid: int, index: int) -> None:
        self.writer, self.tid, self.index = writer, tid, index
        self.frames: queue.SimpleQueue[Frame | BaseException] = queue.SimpleQueue()
        self.items: collections.deque[Any] = collections.deque()
        self.asked = False
        self.ended = False
        self.error: BaseException | None = None

    def __iter__(self) -> FeedIterator:
        return self

    def _ask(self) -> None:
        self.asked = True
        try:
            self.writer.send_parts(Kind.PULL, self.tid, 0, PULL.pack(self.index))
        except OSError as exc:
            self.frames.put(exc)

    def on_feed(self, frame: Frame | BaseException) -> None:
        self.frames.put(frame)

    def __next__(self) -> Any:
        while not self.items:
            if self.error is not None:
                raise self.error
            if self.ended:
                raise StopIteration
            if not self.asked:
                self._ask()
            frame = self.frames.get()
            self.asked = False
            if isinstance(frame, BaseException):
                from skyward.errors import NodeLostError

                self.error = NodeLostError(f"the stream of argument {self.index} was cut: {frame}")
                continue
            _index, status = FEED_HEAD.unpack_from(frame.body, 0)
            payload = memoryview(frame.body)[FEED_HEAD.size:]
            value = serialize.loads(frame.flags, payload, frame.buffers)
            if status == FEED_ITEMS:
                self.items.extend(value)
                self._ask()  # the next batch travels while this one is consumed
            elif status == FEED_END:
                self.ended = True
            else:
                self.error = value
        return self.items.popleft()


# -- client side: the values of a generator task ----------------------------------------------------
class StreamReader:
    """The iterator a streaming task returns on the client: yields values as they arrive,
    returns credit for what it took, and stops the node's generator when closed."""

    def __init__(self, send: Callable[[int, bytes], None], name: str, node: int,
                 decode: Callable[[Any, str, int], Any], inbox: queue.SimpleQueue[Any]) -> None:
        self._send = send  # (kind, body) -> None, to this task on its node
        self.name, self.node = name, node
        self._decode = decode
        self._frames = inbox  # YIELD frames, then ("end", RESULT frame or error)
        self._items: collections.deque[Any] = collections.deque()
        self._ended = False
        self._closed = False
        self._owed_items = 0
        self._owed_bytes = 0

    def __iter__(self) -> StreamReader:
        return self

    def __next__(self) -> Any:
        while not self._items:
            if self._ended:
                raise StopIteration
            try:
                got = self._frames.get_nowait()
            except queue.Empty:
                self._credit()  # before waiting: the node may be waiting for this very credit
                got = self._frames.get()
            if isinstance(got, tuple):
                self._ended = True
                self._closed = True
                self._decode(got[1], self.name, self.node)  # raises the task's error, if any
                raise StopIteration
            batch = serialize.loads_frame(got)
            self._owed_bytes += _size(got.body, got.buffers)
            self._items.extend(batch)
        self._owed_items += 1
        if self._owed_items >= WINDOW_ITEMS // 4 or self._owed_bytes >= WINDOW_BYTES // 4:
            self._credit()
        return self._items.popleft()

    def _credit(self) -> None:
        if (self._owed_items or self._owed_bytes) and not self._closed:
            self._send(Kind.CREDIT, CREDIT.pack(self._owed_items, self._owed_bytes))
        self._owed_items = self._owed_bytes = 0

    def close(self) -> None:
        """Stop the generator on the node (at its current yield); values not taken are dropped."""
        if not self._closed:
            self._closed = True
            self._send(Kind.STOP, b"")

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"<skyward stream of {self.name} on node {self.node}>"


# -- client side: iterator arguments out --------------------------------------------------------------
class StreamArg:
    """Stands for an iterator argument in a pickled task; a FeedIterator on the node."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (_feed_on_node, (self.index,))


def _feed_on_node(index: int) -> FeedIterator:
    from skyward.runtime import context

    hub = context.hub
    if hub is None or not hasattr(hub, "open_feed"):
        raise RuntimeError("a streamed argument can only be read inside the task it was passed to")
    return hub.open_feed(context.current_task.get(), index)


class Feeder:
    """Reads the user's iterators for one task and answers the node's PULLs."""

    def __init__(self, iterators: list[Iterator[Any]],
                 send: Callable[[int, bytes, serialize.Buffers], None]) -> None:
        self.iterators = iterators
        self.send = send  # (flags, body, buffers) of a FEED frame to the task
        self.sizes = [1] * len(iterators)
        self.requests: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="skyward-feed", daemon=True)
        self.thread.start()

    def on_pull(self, frame: Frame) -> None:
        self.requests.put(PULL.unpack_from(frame.body, 0)[0])

    def stop(self) -> None:
        self.requests.put(None)

    def _loop(self) -> None:
        while True:
            index = self.requests.get()
            if index is None:
                return
            it, n = self.iterators[index], self.sizes[index]
            status, value = FEED_ITEMS, []
            started = time.monotonic()
            try:
                for item in it:
                    value.append(item)
                    if len(value) >= n:
                        break
                if not value:
                    status = FEED_END
            except BaseException as exc:
                status, value = FEED_ERROR, exc  # type: ignore[assignment]
            try:
                flags, body, buffers = serialize.dumps(value)
            except Exception as exc:
                from skyward.errors import SerializationError

                status = FEED_ERROR
                flags, body, buffers = serialize.dumps(SerializationError(
                    f"an item of streamed argument {index} could not be pickled ({type(exc).__name__}: {exc})"))
            size = _size(body, buffers)
            slow = time.monotonic() - started > 0.05  # a slow source: send what it has, often
            if size < _FEED_BATCH_BYTES and not slow:
                self.sizes[index] = min(_FEED_MAX_ITEMS, n * 2)
            elif size > 4 * _FEED_BATCH_BYTES or slow:
                self.sizes[index] = max(1, n // 2)
            self.send(flags, FEED_HEAD.pack(index, status) + bytes(body), buffers)
