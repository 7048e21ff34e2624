"""Payload encoding: cloudpickle protocol 5 with out-of-band buffers, lz4 where it pays.

Large contiguous buffers (numpy arrays, torch tensors via numpy, anything pickled with
protocol 5 out-of-band buffers, and bytes and bytearrays of SPILL_MIN or more) travel beside the pickle instead of inside it, so a 200 MB array is never
copied into the pickle stream. On a Local pool (``spill``: the pool's shared-memory folder)
each such buffer is copied once into a shared-memory segment (``shm``) and the receiver
rebuilds the array on it without a copy. Otherwise a part is compressed only if it is large
and a sample of it compresses well; random floats are sent as they are, because compressing
them costs more time than the bytes it saves.
"""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path

from . import shm
from .frames import Frame

# Imported on first use: an agent relays payloads without pickling them, and these two (with
# what cloudpickle imports: typing, dataclasses, inspect...) would be most of its start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

COMPRESS_MIN = 64 * 1024
SPILL_MIN = 1024 * 1024
_SAMPLE = 64 * 1024
_RATIO = 0.6
FLAG_BODY_LZ4 = 1
# Large bytes and bytearrays travel as buffers too; the body starts with how many (EXTRAS) and
# those buffers come first. Pickle calls no hook for exact bytes, so a persistent id carries them.
FLAG_BODY_OOB = 2
EXTRAS = struct.Struct("!I")
BUF_LZ4 = 1  # the buffer is lz4-compressed
BUF_SPILLED = 2  # the buffer's data is a reference to a shared-memory segment (shm.REF + path)

Buffers = list[tuple[int, bytes | bytearray | memoryview]]


def maybe_compress(data: bytes | memoryview) -> tuple[int, bytes | memoryview]:
    n = memoryview(data).nbytes
    if n < COMPRESS_MIN:
        return 0, data
    import lz4.block

    sample = memoryview(data)[:_SAMPLE]
    if len(lz4.block.compress(sample, store_size=False)) > _RATIO * sample.nbytes:
        return 0, data
    packed = lz4.block.compress(data, store_size=True)
    if len(packed) > _RATIO * n:
        return 0, data
    return BUF_LZ4, packed


_PICKLER: Any = None


def _pickler() -> Any:
    """cloudpickle's Pickler with large bytes and bytearrays out of band (see FLAG_BODY_OOB),
    made on first use."""
    global _PICKLER
    if _PICKLER is None:
        import cloudpickle

        class _Pickler(cloudpickle.Pickler):
            def __init__(self, file: Any, extras: list[pickle.PickleBuffer], buffer_callback: Any) -> None:
                super().__init__(file, protocol=5, buffer_callback=buffer_callback)
                self.extras = extras
                self.seen: dict[int, int] = {}  # id -> index: the same object twice travels once

            def persistent_id(self, obj: Any) -> Any:
                kind = type(obj)
                if (kind is bytes or kind is bytearray) and len(obj) >= SPILL_MIN:
                    index = self.seen.get(id(obj))
                    if index is None:
                        index = self.seen[id(obj)] = len(self.extras)
                        self.extras.append(pickle.PickleBuffer(obj))  # keeps obj (and its id) alive
                    return (kind is bytearray, index)
                return None

        _PICKLER = _Pickler
    return _PICKLER


def _holds_bytes(obj: Any, depth: int) -> bool:
    """Whether ``obj`` is, or holds within ``depth`` levels of short tuples, lists and dicts, a
    bytes or bytearray of SPILL_MIN or more (a cheap look before pickling)."""
    kind = type(obj)
    if kind is bytes or kind is bytearray:
        return len(obj) >= SPILL_MIN
    if depth <= 0:
        return False
    if kind is tuple or kind is list:
        return len(obj) <= 32 and any(_holds_bytes(x, depth - 1) for x in obj)
    if kind is dict:
        return len(obj) <= 32 and any(_holds_bytes(x, depth - 1) for x in obj.values())
    return False


class _Unpickler(pickle.Unpickler):
    def __init__(self, body: bytes | bytearray | memoryview, extras: list[Any], buffers: list[Any]) -> None:
        super().__init__(io.BytesIO(body), buffers=buffers)
        self.extras = extras

    def persistent_load(self, pid: Any) -> Any:
        mutable, index = pid
        data = self.extras[index]
        return bytearray(data) if mutable else bytes(data)  # a copy that owns its bytes


def dumps(obj: Any, spill: Path | None = None) -> tuple[int, bytes | memoryview, Buffers]:
    """Pickle obj; returns (flags, body, buffers) ready for a frame.

    With ``spill`` (a folder in shared memory that both ends can map, Local pools only),
    buffers of SPILL_MIN bytes or more go through shared-memory segments instead of through
    the sockets: one copy in, none out. When the folder is full they go through the stream.
    """
    raw: list[pickle.PickleBuffer] = []
    body: bytes | memoryview = b""
    flags = 0
    # Large bytes where a task's arguments or a result usually hold them: pickled once, with
    # the hook. Elsewhere (deeper, in long lists) a large pickle is pickled again with it.
    if not _holds_bytes(obj, 3):
        import cloudpickle

        body = cloudpickle.dumps(obj, protocol=5, buffer_callback=raw.append)
    if not body or len(body) >= SPILL_MIN:
        extras: list[pickle.PickleBuffer] = []
        again: list[pickle.PickleBuffer] = []
        with io.BytesIO() as file:
            _pickler()(file, extras, again.append).dump(obj)
            if extras:
                body, raw = EXTRAS.pack(len(extras)) + file.getbuffer(), extras + again
                flags |= FLAG_BODY_OOB
            elif not body:
                body, raw = file.getvalue(), again
    compressed, body = maybe_compress(body)
    if compressed:
        flags |= FLAG_BODY_LZ4
    buffers: Buffers = []
    for pb in raw:
        try:
            view = pb.raw()
        except BufferError:  # not contiguous: ship a contiguous copy
            view = memoryview(bytes(pb))
        if spill is not None and view.nbytes >= SPILL_MIN:
            ref = shm.put(spill, view)
            if ref is not None:
                buffers.append((BUF_SPILLED, ref))
                continue
        buffers.append(maybe_compress(view))
    return flags, body, buffers


def loads(flags: int, body: bytes | bytearray | memoryview, buffers: Buffers) -> Any:
    if flags & FLAG_BODY_LZ4:
        import lz4.block

        body = lz4.block.decompress(body)
    bufs: list[Any] = []
    for bflags, data in buffers:
        buf: Any = shm.get(data) if bflags & BUF_SPILLED else data
        if bflags & BUF_LZ4:
            import lz4.block

            buf = bytearray(lz4.block.decompress(buf))
        bufs.append(buf)
    if flags & FLAG_BODY_OOB:
        (count,) = EXTRAS.unpack_from(body, 0)
        return _Unpickler(memoryview(body)[EXTRAS.size :], bufs[:count], bufs[count:]).load()
    return pickle.loads(body, buffers=bufs)


def loads_frame(frame: Frame) -> Any:
    return loads(frame.flags, frame.body, frame.buffers)


def discard(buffers: Buffers) -> None:
    """Give back the shared-memory segments of a payload that will never be read."""
    for bflags, data in buffers:
        if bflags & BUF_SPILLED:
            shm.release(data)


# -- results and errors ---------------------------------------------------------------------
# A RESULT body unpickles to ("ok", value) or ("err", exception, traceback_text) or, when the
# exception itself cannot be pickled, ("err-text", type_name, message, traceback_text).


def dumps_ok(value: Any, what: str, spill: Path | None = None) -> tuple[int, bytes | memoryview, Buffers]:
    try:
        return dumps(("ok", value), spill)
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
        import traceback

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
    import cloudpickle

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
