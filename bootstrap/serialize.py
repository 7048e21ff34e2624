"""Payload encoding: cloudpickle protocol 5 with out-of-band buffers, lz4 where it pays.

Large contiguous buffers (numpy arrays, bytes, torch tensors via numpy) travel beside the
pickle instead of inside it, so a 200 MB array is never copied into the pickle stream. A part
is compressed only if it is large and a sample of it compresses well; random floats are sent
as they are, because compressing them costs more time than the bytes it saves.
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any

import cloudpickle
import lz4.block

from .frames import Frame

COMPRESS_MIN = 64 * 1024
_SAMPLE = 64 * 1024
_RATIO = 0.6
FLAG_BODY_LZ4 = 1

Buffers = list[tuple[bool, bytes | bytearray | memoryview]]


def _maybe_compress(data: bytes | memoryview) -> tuple[bool, bytes | memoryview]:
    n = memoryview(data).nbytes
    if n < COMPRESS_MIN:
        return False, data
    sample = memoryview(data)[:_SAMPLE]
    if len(lz4.block.compress(sample, store_size=False)) > _RATIO * sample.nbytes:
        return False, data
    packed = lz4.block.compress(data, store_size=True)
    if len(packed) > _RATIO * n:
        return False, data
    return True, packed


def dumps(obj: Any) -> tuple[int, bytes | memoryview, Buffers]:
    """Pickle obj; returns (flags, body, buffers) ready for a frame."""
    raw: list[pickle.PickleBuffer] = []
    body: bytes | memoryview = cloudpickle.dumps(obj, protocol=5, buffer_callback=raw.append)
    flags = 0
    compressed, body = _maybe_compress(body)
    if compressed:
        flags |= FLAG_BODY_LZ4
    buffers: Buffers = []
    for pb in raw:
        try:
            view = pb.raw()
        except BufferError:  # not contiguous: ship a contiguous copy
            view = memoryview(bytes(pb))
        buffers.append(_maybe_compress(view))
    return flags, body, buffers


def loads(flags: int, body: bytes | bytearray | memoryview, buffers: Buffers) -> Any:
    if flags & FLAG_BODY_LZ4:
        body = lz4.block.decompress(body)
    bufs = [bytearray(lz4.block.decompress(data)) if c else data for c, data in buffers]
    return pickle.loads(body, buffers=bufs)


def loads_frame(frame: Frame) -> Any:
    return loads(frame.flags, frame.body, frame.buffers)


# -- results and errors ---------------------------------------------------------------------
# A RESULT body unpickles to ("ok", value) or ("err", exception, traceback_text) or, when the
# exception itself cannot be pickled, ("err-text", type_name, message, traceback_text).


def dumps_ok(value: Any, what: str) -> tuple[int, bytes | memoryview, Buffers]:
    try:
        return dumps(("ok", value))
    except Exception as exc:
        from skyward.errors import SerializationError

        err = SerializationError(
            f"{what} returned a {type(value).__qualname__} that could not be pickled "
            f"({type(exc).__name__}: {exc}). Return plain data (numbers, lists, dicts, arrays) "
            f"or convert the object before returning it."
        )
        return dumps_error(err)


def dumps_error(exc: BaseException, tb_text: str | None = None) -> tuple[int, bytes | memoryview, Buffers]:
    if tb_text is None:
        tb_text = "".join(traceback.format_exception(exc))
    # Keep the exception's own chain out of the pickle: it is already in tb_text.
    exc.__traceback__ = None
    try:
        payload = dumps(("err", exc, tb_text))
        loads(*payload)  # the client must be able to rebuild it (custom __init__ may not)
        return payload
    except Exception:
        return dumps(("err-text", type(exc).__qualname__, str(exc), tb_text))


def describe_unpicklable(fn: Any, args: tuple, kwargs: dict) -> str:
    """Name the first part of a call that cannot be pickled, for an error message."""

    def check(obj: Any) -> str | None:
        try:
            cloudpickle.dumps(obj, protocol=5, buffer_callback=lambda _b: None)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    name = getattr(fn, "__qualname__", repr(fn))
    if (why := check(fn)) is not None:
        return f"the function {name} itself (or something it references) could not be pickled ({why})"
    for i, arg in enumerate(args):
        if (why := check(arg)) is not None:
            return f"positional argument {i} of {name} (a {type(arg).__qualname__}) could not be pickled ({why})"
    for key, arg in kwargs.items():
        if (why := check(arg)) is not None:
            return f"keyword argument {key!r} of {name} (a {type(arg).__qualname__}) could not be pickled ({why})"
    return f"the call to {name} could not be pickled"
