"""Payload encoding: cloudpickle protocol 5 with out-of-band buffers, lz4 where it pays.

Large contiguous buffers (numpy arrays, bytes, torch tensors via numpy) travel beside the
pickle instead of inside it, so a 200 MB array is never copied into the pickle stream. A part
is compressed only if it is large and a sample of it compresses well; random floats are sent
as they are, because compressing them costs more time than the bytes it saves.
"""

from __future__ import annotations

import mmap
import os
import pickle
import traceback
import uuid
from pathlib import Path
from typing import Any

import cloudpickle
import lz4.block

from .frames import Frame

COMPRESS_MIN = 64 * 1024
SPILL_MIN = 1024 * 1024
_SAMPLE = 64 * 1024
_RATIO = 0.6
FLAG_BODY_LZ4 = 1
BUF_LZ4 = 1  # the buffer is lz4-compressed
BUF_SPILLED = 2  # the buffer's data is the path of a shared-memory file holding it

Buffers = list[tuple[int, bytes | bytearray | memoryview]]


def _maybe_compress(data: bytes | memoryview) -> tuple[int, bytes | memoryview]:
    n = memoryview(data).nbytes
    if n < COMPRESS_MIN:
        return 0, data
    sample = memoryview(data)[:_SAMPLE]
    if len(lz4.block.compress(sample, store_size=False)) > _RATIO * sample.nbytes:
        return 0, data
    packed = lz4.block.compress(data, store_size=True)
    if len(packed) > _RATIO * n:
        return 0, data
    return BUF_LZ4, packed


def _spill(data: bytes | memoryview, directory: Path) -> bytes | None:
    """Write a large buffer to a file in ``directory`` (tmpfs); None when there is no room."""
    n = memoryview(data).nbytes
    st = os.statvfs(directory)
    if st.f_bavail * st.f_frsize < 2 * n:
        return None
    path = directory / uuid.uuid4().hex
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os.close(fd)
        path.unlink(missing_ok=True)
        return None
    os.close(fd)
    return os.fsencode(path)


def _unspill(path: bytes | bytearray | memoryview) -> mmap.mmap:
    """Map a spilled buffer (copy-on-write, so arrays on it are writable) and unlink its file."""
    name = os.fsdecode(bytes(path))
    fd = os.open(name, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else mmap.mmap(-1, 1)
    finally:
        os.close(fd)
        os.unlink(name)


def dumps(obj: Any, spill: Path | None = None) -> tuple[int, bytes | memoryview, Buffers]:
    """Pickle obj; returns (flags, body, buffers) ready for a frame.

    With ``spill`` (a directory on a filesystem both ends can see, Local pools only), buffers
    of SPILL_MIN bytes or more go through files there instead of through the sockets: one
    copy in, none out, instead of a copy on every hop.
    """
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
        bflags, data = _maybe_compress(view)
        if spill is not None and memoryview(data).nbytes >= SPILL_MIN:
            path = _spill(data, spill)
            if path is not None:
                bflags, data = bflags | BUF_SPILLED, path
        buffers.append((bflags, data))
    return flags, body, buffers


def loads(flags: int, body: bytes | bytearray | memoryview, buffers: Buffers) -> Any:
    if flags & FLAG_BODY_LZ4:
        body = lz4.block.decompress(body)
    bufs: list[Any] = []
    for bflags, data in buffers:
        buf: Any = _unspill(data) if bflags & BUF_SPILLED else data
        if bflags & BUF_LZ4:
            buf = bytearray(lz4.block.decompress(buf))
        bufs.append(buf)
    return pickle.loads(body, buffers=bufs)


def loads_frame(frame: Frame) -> Any:
    return loads(frame.flags, frame.body, frame.buffers)


def discard(buffers: Buffers) -> None:
    """Remove the spill files of a payload that will never be read."""
    for bflags, data in buffers:
        if bflags & BUF_SPILLED:
            Path(os.fsdecode(bytes(data))).unlink(missing_ok=True)


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
