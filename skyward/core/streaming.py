"""Client side of streaming tasks (the wire protocol is skyward.bootstrap.stream).

* A ``@sky.function`` generator (or one annotated to return an ``Iterator``/``Generator``)
  dispatched with ``>>``/``run`` gives back an iterator of its values as the node yields them;
  ``>``/``run_async`` a Future of that iterator (done at once); ``@`` one per node.
* An argument that is an iterator or a generator, or any iterable passed for a parameter
  annotated ``Iterator[...]``, travels lazily: the node pulls it in batches.

Streaming tasks are not retried on another node when theirs is lost: values already consumed
cannot be taken back. The error comes out of the iterator at that point.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import queue
import re
import threading
import typing
from collections.abc import Generator, Iterator
from concurrent.futures import Future
from typing import Any

from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import FLAG_STREAM_IN, FLAG_STREAM_OUT, Frame, Kind
from skyward.bootstrap.stream import Feeder, StreamArg, StreamReader

_ITER_NAME = re.compile(r"^(typing\.|collections\.abc\.|abc\.|t\.)?(Iterator|Generator)\b")


def _plain(fn: Any) -> Any:
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            return fn


def _is_iterator_annotation(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return bool(_ITER_NAME.match(annotation.strip()))
    origin = typing.get_origin(annotation) or annotation
    return origin in (collections.abc.Iterator, collections.abc.Generator)


def streams_out(fn: Any) -> bool:
    """Whether calls of ``fn`` stream their values back (a generator function, or one whose
    return annotation is an Iterator or a Generator)."""
    plain = _plain(fn)
    if inspect.isgeneratorfunction(plain):
        return True
    annotations = getattr(plain, "__annotations__", None) or {}
    return "return" in annotations and _is_iterator_annotation(annotations["return"])


def _iterator_params(fn: Any) -> set[str]:
    plain = _plain(fn)
    annotations = getattr(plain, "__annotations__", None) or {}
    return {k for k, v in annotations.items() if k != "return" and _is_iterator_annotation(v)}


def _streamable(value: Any) -> bool:
    return isinstance(value, Iterator) and not isinstance(value, str | bytes | bytearray)


def split_stream_args(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                      ) -> tuple[tuple[Any, ...], dict[str, Any], list[Iterator[Any]]] | None:
    """Replace the arguments that stream in by placeholders; None when there are none."""
    params = _iterator_params(fn)
    names: list[str] = []
    if params:
        try:
            names = list(inspect.signature(_plain(fn)).parameters)
        except (TypeError, ValueError):
            names = []
    iterators: list[Iterator[Any]] = []

    def swap(value: Any, param: str | None) -> Any:
        if _streamable(value) or (param in params and isinstance(value, collections.abc.Iterable)
                                  and not isinstance(value, str | bytes | bytearray | dict)):
            iterators.append(iter(value))
            return StreamArg(len(iterators) - 1)
        return value

    new_args = tuple(swap(a, names[i] if i < len(names) else None) for i, a in enumerate(args))
    new_kwargs = {k: swap(v, k) for k, v in kwargs.items()}
    if not iterators:
        return None
    return new_args, new_kwargs, iterators


def submit_streaming(dispatch: Any, ch: NodeChannel, pending: Any, out: bool,
                     split: tuple[tuple[Any, ...], dict[str, Any], list[Iterator[Any]]] | None,
                     batch: int | None = None) -> Future[Any]:
    """Send a task that streams out (``out``) and/or in (``split``)."""
    from skyward.bootstrap import serialize

    args, kwargs = (split[0], split[1]) if split is not None else (pending.args, pending.kwargs)
    flags, body, buffers = dispatch.encode(
        (pending.fn, args, kwargs, dispatch.timeout_of(pending)),
        lambda: serialize.describe_unpicklable(pending.fn, args, kwargs),
    )
    flags |= (FLAG_STREAM_OUT if out else 0) | (FLAG_STREAM_IN if split is not None else 0)
    name = pending.name
    future: Future[Any] = Future()
    future.set_running_or_notify_cancel()
    finish = dispatch.track(ch, name, 1, batch)
    tid_box: list[int] = [0]
    sent = threading.Event()  # a PULL may arrive before submit() has returned the task's id

    def send(kind: int, data: bytes, fflags: int = 0, bufs: list[Any] | None = None) -> None:
        sent.wait()
        ch.send_tid(kind, tid_box[0], data, fflags, bufs or [])

    feeder = Feeder(split[2], lambda f, b, bufs: send(Kind.FEED, b, f, bufs)) if split is not None else None
    # The channel holds on_frame and done until the task ends: they reach the reader's inbox,
    # never the reader, so a consumer that drops its iterator (a `break`) closes it at once.
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def on_frame(frame: Frame) -> None:
        if frame.kind == Kind.YIELD:
            inbox.put(frame)
        elif frame.kind == Kind.PULL and feeder is not None:
            feeder.on_pull(frame)

    if out:
        def done(result: Frame | BaseException) -> None:
            if feeder is not None:
                feeder.stop()
            if finish is not None:
                finish(not isinstance(result, BaseException))
            inbox.put(("end", result))
    else:
        def done(result: Frame | BaseException) -> None:
            if feeder is not None:
                feeder.stop()
            try:
                value, error = dispatch.decode(result, name, ch.node), None
            except BaseException as exc:
                value, error = None, exc
            if finish is not None:
                finish(error is None)
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)

    try:
        tid_box[0] = dispatch.send(ch, Kind.TASK, flags, body, buffers, done, on_frame)
    except BaseException:
        if feeder is not None:  # never sent: ``done`` will not run, so its feeder stops here
            feeder.stop()
        raise
    finally:
        sent.set()
    if out:
        future.set_result(StreamReader(send, name, ch.node, dispatch.decode, inbox))
    return future


class GatherStream:
    """``sky.gather(..., stream=True)``: the group's values as they come, a streaming task's
    values in place of its result.

    However the gather ends (its last value, an error from one of its tasks, a ``break``,
    ``close()``, Ctrl-C, the iterator dropped), every stream of it still open is stopped
    then, not when the collector frees its reader: an error's traceback keeps the frames
    that read the streams alive for as long as the caller holds the error."""

    def __init__(self, futures: list[Future[Any]], ordered: bool) -> None:
        self._futures = list(futures)  # its own list (the batch counts the caller's), emptied at the end
        self._values = _flatten(self._futures, ordered)  # holds the list, never self: no cycle

    def __iter__(self) -> GatherStream:
        return self

    def __next__(self) -> Any:
        return next(self._values)

    def close(self) -> None:
        """Stop every stream of the gather; values not taken are dropped."""
        self._values.close()  # a `yield from` in progress closes its reader first
        _stop_streams(self._futures)  # not started yet: its ``finally`` never ran

    def __enter__(self) -> GatherStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _flatten(futures: list[Future[Any]], ordered: bool) -> Generator[Any, None, None]:
    from concurrent.futures import as_completed

    try:
        for future in list(futures) if ordered else as_completed(futures):
            value = future.result()
            if isinstance(value, StreamReader):
                yield from value
            else:
                yield value
    finally:
        _stop_streams(futures)


def _stop_streams(futures: list[Future[Any]]) -> None:
    """Close the readers of ``futures`` (at once when done, else when done) and let them go."""
    pending = list(futures)
    futures.clear()
    for future in pending:
        future.add_done_callback(_close_stream)


def _close_stream(future: Future[Any]) -> None:
    if not future.cancelled() and future.exception() is None:
        value = future.result()
        if isinstance(value, StreamReader):
            value.close()


def is_stream(value: Any) -> bool:
    return isinstance(value, StreamReader)

