"""Payload encoding: cloudpickle protocol 5 with out-of-band buffers, lz4 where it pays.

Large contiguous buffers (numpy arrays, torch tensors' storages, anything pickled with
protocol 5 out-of-band buffers, and bytes and bytearrays of SPILL_MIN or more) travel beside the pickle instead of inside it, so a 200 MB array is never
copied into the pickle stream. On a Local pool (``spill``: the pool's shared-memory folder)
each such buffer is copied once into a shared-memory segment (``shm``) and the receiver
rebuilds the array on it without a copy. Otherwise a part is compressed only if it is large
and a sample of it compresses well; random floats are sent as they are, because compressing
them costs more time than the bytes it saves.
"""

from __future__ import annotations

import io
import mmap
import pickle
import struct
import sys
import threading
import weakref
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

# Whether dumps compresses large parts when its caller does not say. A Local node's worker sets
# it False at its configuration: everything it sends (results, streamed values, collection
# values, errors) goes to a client on its own host. A client decides per pool (dispatch.encode):
# one process may hold pools of several kinds.
COMPRESS = True


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


_PICKLERS: dict[Any, Any] = {}


def _pickler(base: Any) -> Any:
    """``base`` (see _base) with large bytes and bytearrays out of band (see FLAG_BODY_OOB),
    made on first use."""
    pickler = _PICKLERS.get(base)
    if pickler is None:

        class _Pickler(base):
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

        pickler = _PICKLERS[base] = _Pickler
    return pickler


# -- torch tensors --------------------------------------------------------------------------
# A dense tensor travels as (its storage, dtype, shape, strides, offset): the storage's bytes
# as one PickleBuffer (out of band: through shared memory on Local pools, beside the frame
# elsewhere; a CUDA storage is copied to the host once, into that buffer), never torch's own
# pickle of the storage (a torch.save of it: several copies, 45x slower than a numpy array).
# Tensors that share a storage name one _Storage, which pickle memoizes: the receiver rebuilds
# them on one storage too. Only a process that has imported torch pickles with this; other
# layouts (sparse, quantized, nested, meta, tensor subclasses) go through torch's own pickle.
_INBAND = 16 * 1024  # smaller storages travel inside the pickle (a buffer each costs more)
_TORCH_PICKLER: Any = None


def _base() -> Any:
    """The Pickler to use: cloudpickle's, with the tensor reducer when torch is loaded."""
    import cloudpickle

    if "torch" not in sys.modules:
        return cloudpickle.Pickler
    global _TORCH_PICKLER
    if _TORCH_PICKLER is None:
        import torch

        kinds = (torch.Tensor, torch.nn.Parameter)

        class _TorchPickler(cloudpickle.Pickler):
            # Set by dumps on a Local pool: a CUDA storage is copied from the device straight
            # into a shared-memory segment (``spill``), whose reference ``spilled`` keeps.
            spill: Path | None = None
            spilled: dict[int, tuple[bytes, pickle.PickleBuffer]] | None = None

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.storages: dict[Any, tuple[_Storage, Any]] = {}  # this pickle's, see _reduce_tensor

            def reducer_override(self, obj: Any) -> Any:
                kind = type(obj)
                if kind is _Storage:
                    return _reduce_storage(obj.storage, self.spill, self.spilled)
                if kind in kinds:
                    reduced = _reduce_tensor(obj, self.storages)
                    if reduced is not NotImplemented:
                        return reduced
                return super().reducer_override(obj)

        _TORCH_PICKLER = _TorchPickler
    return _TORCH_PICKLER


class _Storage:
    """A tensor storage on its way: pickled once per pickle, however many tensors use it."""

    __slots__ = ("storage",)

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def __reduce__(self) -> Any:
        return _reduce_storage(self.storage, None, None)


def _reduce_storage(storage: Any, spill: Path | None, spilled: dict[int, tuple[bytes, Any]] | None) -> Any:
    n = storage.nbytes()
    device = _device_of(storage)
    if n == 0:
        return _load_storage, (b"", device, 0)
    import torch

    data = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    if _to_host(data):
        if spill is not None and spilled is not None and n >= SPILL_MIN:
            got = shm.reserve(spill, n)
            if got is not None:  # the one device-to-host copy, into the segment that travels
                view, ref = got
                if data.is_cuda:
                    _pin(view)
                torch.frombuffer(view, dtype=torch.uint8, count=n).copy_(data)
                buffer = pickle.PickleBuffer(view)
                spilled[id(buffer)] = (ref, buffer)
                return _load_storage, (buffer, device, n)
        data = data.cpu()  # the one device-to-host copy, into the buffer that travels
    array: Any = data.numpy()  # a view: keeps the tensor (and so the storage) alive
    if n < _INBAND:
        return _load_storage, (bytearray(array), device, n)
    return _load_storage, (pickle.PickleBuffer(array), device, n)


def _to_host(data: Any) -> bool:
    """Whether a storage's bytes must be copied to the host to travel (not a CPU storage)."""
    return bool(data.device.type != "cpu")


def _device_of(storage: Any) -> str:
    return str(storage.device)


def _reduce_tensor(t: Any, storages: dict[Any, tuple[_Storage, Any]]) -> Any:
    """The reduction of a dense CPU or CUDA tensor; NotImplemented: torch's own pickle."""
    try:
        if (
            t.layout is not _torch().strided
            or t.device.type not in ("cpu", "cuda")
            or t.is_quantized
            or t.is_nested
            or t.is_conj()
            or t.is_neg()
            or t.__dict__  # attributes set on it: torch's pickle keeps them
            or t._backward_hooks
            or ("numpy" not in sys.modules and not _numpy())
        ):
            return NotImplemented
        storage = t.untyped_storage()
        n = storage.nbytes()
        key = (str(storage.device), storage.data_ptr(), n) if n else id(storage)
        held = storages.get(key)
        if held is None:  # the storage object is kept: its id and address stay its own
            held = storages[key] = (_Storage(storage), storage)
        parameter = type(t) is not _torch().Tensor
        return _rebuild_tensor, (held[0], t.dtype, tuple(t.shape), t.stride(), t.storage_offset(),
                                 bool(t.requires_grad), parameter)
    except Exception:  # functorch wrappers, fake tensors... whatever torch's own pickle does
        return NotImplemented


def _torch() -> Any:
    import torch

    return torch


def _numpy() -> bool:
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


def _rebuild_tensor(storage: Any, dtype: Any, shape: tuple, stride: tuple, offset: int,
                    requires_grad: bool, parameter: bool) -> Any:
    import torch

    t = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, shape, stride)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _load_storage(data: Any, device: str, n: int) -> Any:
    """The storage a _Storage sent: on the buffer it came in (shared memory, or the frame's
    bytearray: no copy), moved to ``device`` when that is CUDA and CUDA is here (see landing)."""
    import torch

    if n == 0:
        storage = torch.UntypedStorage(0)
    else:
        with memoryview(data) as view:
            readonly = view.readonly
        if readonly:  # torch must not write into immutable bytes
            data = bytearray(data)
        storage = torch.frombuffer(data, dtype=torch.uint8, count=n).untyped_storage()
    target = landing(device)
    if target == "cpu":
        return storage
    if n >= SPILL_MIN:
        _pin(data)
    return storage.to(device=target)


# -- CUDA copies through shared memory --------------------------------------------------------
# A CUDA storage crosses between processes of one host as two copies: device to host into a
# shared-memory segment, host to device out of it. From pageable memory CUDA copies through a
# staging buffer of its own: 14 GB/s device to host and 7-8 GB/s host to device on an H100,
# where page-locked memory copies at 50-54 GB/s. Pinning a 200 MB mapping costs ~9 ms, less
# than the copy it speeds up, and the segments are kept mapped and reused (shm.py): a mapping
# a CUDA copy touches is pinned (cudaHostRegister) once, and unpinned just before it is
# unmapped (shm.unmapping). Where CUDA refuses, copies stay pageable.
_pinned: dict[int, tuple[Any, int]] = {}  # id(mapping) -> (mapping, address)
# Mappings whose unpin hook ran: never pinned again. A mapping dropped while a view of it is in
# use stays mapped until that view goes; a CUDA copy through the view that pins it after the
# hook ran would leave it registered with CUDA once unmapped (the copy runs pageable instead).
_retired: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()
_pin_lock = threading.Lock()
_pin_refused = False


def _pin(buffer: Any) -> None:
    """Page-lock for CUDA the shared-memory mapping ``buffer`` is a view of (once per mapping)."""
    global _pin_refused
    mm = buffer
    for _ in range(4):  # PickleBuffer -> memoryview -> ... -> the mmap
        if isinstance(mm, mmap.mmap) or _pin_refused:
            break
        mm = memoryview(mm).obj
    if not isinstance(mm, mmap.mmap) or _pin_refused:
        return
    with _pin_lock:
        if id(mm) in _pinned or mm.closed or mm in _retired:
            return
        import ctypes

        import torch

        anchor = ctypes.c_char.from_buffer(mm)
        address = ctypes.addressof(anchor)
        del anchor  # (an export would keep the mapping from closing)
        try:
            refused = int(torch.cuda.cudart().cudaHostRegister(address, len(mm), 1)) != 0  # 1: portable
        except Exception:  # no CUDA runtime to ask
            refused = True
        if refused:
            _pin_refused = True  # this machine's CUDA will not: stop asking
            return
        _pinned[id(mm)] = (mm, address)
        if _unpin not in shm.unmapping:
            shm.unmapping.append(_unpin)


def _unpin(mm: Any) -> None:
    with _pin_lock:
        held = _pinned.pop(id(mm), None)
        _retired.add(mm)
    if held is not None:
        import torch

        torch.cuda.cudart().cudaHostUnregister(held[1])


def _torch_load_from_bytes(b: bytes) -> Any:
    """torch.storage._load_from_bytes, with CUDA storages put where ``landing`` says."""
    import torch

    def place(storage: Any, location: str) -> Any:
        target = landing(location)
        if target == location:
            return None  # torch.load's own placement
        return storage if target == "cpu" else storage.to(device=target)

    return torch.load(io.BytesIO(b), map_location=place, weights_only=False)


# Where CUDA tensors land. A process with CUDA puts them on its GPU (the same index when it has
# it), one without on the CPU, said once per pool (a warning in the log, a Log event) and once
# per process where no pool is open (a node). A pool opened with Options(tensor_device="cpu")
# puts them on the CPU while it is open, without a word.
_landing_lock = threading.Lock()
_pools: dict[str, tuple[bool, Any]] = {}  # pool id -> (CPU always, its emit)
_told: set[str] = set()  # pools (and "" for the process) that heard of CUDA tensors landing on the CPU


def pool_opened(pool: str, cpu: bool, emit: Any) -> None:
    """A pool of this process opened: ``cpu``, its Options(tensor_device="cpu"); ``emit`` takes events."""
    with _landing_lock:
        _pools[pool] = (cpu, emit)


def pool_closed(pool: str) -> None:
    with _landing_lock:
        _pools.pop(pool, None)
        _told.discard(pool)


def landing(device: str) -> str:
    """The device a storage that was on ``device`` where it was pickled lands on here."""
    if not device.startswith("cuda"):
        return "cpu" if device == "cpu" else device
    if any(cpu for cpu, _ in list(_pools.values())):
        return "cpu"
    import torch

    if torch.cuda.is_available():
        _, _, index = device.partition(":")
        if index.isdigit() and int(index) < torch.cuda.device_count():
            return device
        return f"cuda:{torch.cuda.current_device()}"
    _landed_on_cpu(device)
    return "cpu"


def _landed_on_cpu(device: str) -> None:
    with _landing_lock:
        pools = {p: emit for p, (_, emit) in _pools.items() if p not in _told}
        first = "" not in _told
        _told.update(pools)
        _told.add("")
    if not pools and not first:
        return
    message = (
        f"tensors that were on {device} where they were pickled arrived where CUDA is not available: "
        f"they are CPU tensors here (this is said once). Options(tensor_device='cpu') puts CUDA "
        f"tensors on the CPU always, without this warning."
    )
    import logging

    logging.getLogger("skyward.tensors").warning("%s", message)
    if pools:
        from skyward.observe import events as ev

        for pool, emit in pools.items():
            emit(ev.Log(pool=pool, level="WARNING", message=message))


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


# The binary opcodes, for a walk over what a protocol 4+ pickle writes outside its frames (see
# _large_bytes_in): opcode -> the size of its argument, or of its length for those followed by
# data (_DATA: opcode -> (size of the length, whether the data is a bytes or bytearray)).
_FIXED = {op: 0 for op in b"(.0123N}abde]ltu)sRQo\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94\x97\x98"}
_FIXED.update({op: 1 for op in b"Kqh\x80\x82"})
_FIXED.update({op: 2 for op in b"M\x83"})
_FIXED.update({op: 4 for op in b"Jrj\x84"})
_FIXED[ord("G")] = 8
_DATA = {ord("B"): (4, True), 0x8E: (8, True), 0x96: (8, True), ord("C"): (1, True), ord("X"): (4, False),
         0x8D: (8, False), 0x8C: (1, False), ord("T"): (4, False), ord("U"): (1, False), 0x8A: (1, False),
         0x8B: (4, False)}
_FRAME = 0x95


def _large_bytes_in(body: bytes | memoryview) -> bool:
    """Whether a protocol 5 pickle may hold a bytes or bytearray of SPILL_MIN or more, read
    from its frames alone. The pickler ends its frame before a payload of 64 KiB or more and
    writes that payload's opcode, length and data outside any frame (and a run of opcodes
    under 4 bytes, too short to frame); the walk steps over each frame whole and reads only
    what lies between, never the items inside (a long list of small ones, a long string:
    none, where pickling again with the hook that takes large bytes out costs a Python call
    per object, 4x the pickle). An opcode it does not know answers True (pickle again)."""
    view = memoryview(body)
    n = len(view)
    at = 0
    while at < n:
        op = view[at]
        if op == _FRAME:
            at += 9 + int.from_bytes(view[at + 1 : at + 9], "little")
            continue
        width = _FIXED.get(op)
        if width is not None:
            at += 1 + width
            continue
        data = _DATA.get(op)
        if data is None:
            return True
        width, is_bytes = data
        size = int.from_bytes(view[at + 1 : at + 1 + width], "little")
        if is_bytes and size >= SPILL_MIN:
            return True
        at += 1 + width + size
    return False


class _Unpickler(pickle.Unpickler):
    def __init__(self, body: bytes | bytearray | memoryview, extras: list[Any], buffers: list[Any]) -> None:
        super().__init__(io.BytesIO(body), buffers=buffers)
        self.extras = extras

    def persistent_load(self, pid: Any) -> Any:
        mutable, index = pid
        data = self.extras[index]
        return bytearray(data) if mutable else bytes(data)  # a copy that owns its bytes

    def find_class(self, module: str, name: str) -> Any:
        # torch's own pickle of a storage (sparse, quantized... tensors) is a torch.save that
        # torch.load puts back on the device it names: on CUDA, or an error where there is none.
        if name == "_load_from_bytes" and module == "torch.storage":
            return _torch_load_from_bytes
        return super().find_class(module, name)


def dumps(obj: Any, spill: Path | None = None, compress: bool | None = None) -> tuple[int, bytes | memoryview, Buffers]:
    """Pickle obj; returns (flags, body, buffers) ready for a frame.

    With ``spill`` (a folder in shared memory that both ends can map, Local pools only),
    buffers of SPILL_MIN bytes or more go through shared-memory segments instead of through
    the sockets: one copy in, none out. When the folder is full they go through the stream.
    ``compress=False`` where both ends are on one host: lz4 (~1 GB/s) is slower than a copy
    through a local socket, and even trying it (a sample of each large part) costs. None:
    this process's default (``COMPRESS``).
    """
    if compress is None:
        compress = COMPRESS
    raw: list[pickle.PickleBuffer] = []
    body: bytes | memoryview = b""
    flags = 0
    base = _base()
    # CUDA storages copied straight into shared-memory segments: id(PickleBuffer) -> (ref, it).
    spilled: dict[int, tuple[bytes, pickle.PickleBuffer]] = {}

    def pickler(cls: Any, *args: Any, **kwargs: Any) -> Any:
        made = cls(*args, **kwargs)
        if spill is not None and hasattr(made, "spilled"):  # the tensor-aware pickler
            made.spill, made.spilled = spill, spilled
        return made

    try:
        # Large bytes where a task's arguments or a result usually hold them: pickled once, with
        # the hook. Elsewhere (deeper, in long lists) a large pickle is pickled again with it.
        if not _holds_bytes(obj, 3):
            with io.BytesIO() as file:
                pickler(base, file, protocol=5, buffer_callback=raw.append).dump(obj)
                body = file.getvalue()
        if not body or (len(body) >= SPILL_MIN and _large_bytes_in(body)):
            extras: list[pickle.PickleBuffer] = []
            again: list[pickle.PickleBuffer] = []
            with io.BytesIO() as file:
                pickler(_pickler(base), file, extras, again.append).dump(obj)
                if extras:
                    body, raw = EXTRAS.pack(len(extras)) + file.getbuffer(), extras + again
                    flags |= FLAG_BODY_OOB
                elif not body:
                    body, raw = file.getvalue(), again
    except BaseException:
        for unused, _ in spilled.values():
            shm.release(unused)
        raise
    compressed, body = maybe_compress(body) if compress else (0, body)
    if compressed:
        flags |= FLAG_BODY_LZ4
    views: list[Any] = []  # each buffer: a ref already in its segment, or a view of its bytes
    for pb in raw:
        done = spilled.pop(id(pb), None) if spilled else None
        if done is not None:  # already in its segment
            views.append(done[0])
            continue
        try:
            views.append(pb.raw())
        except BufferError:  # not contiguous: ship a contiguous copy
            views.append(memoryview(bytes(pb)))
    for unused, _ in spilled.values():  # made by a first pass that was pickled again
        shm.release(unused)
    # The large ones into segments, all of a value's copies at once (shared among threads).
    large = [i for i, v in enumerate(views) if type(v) is memoryview and v.nbytes >= SPILL_MIN]
    refs = dict(zip(large, shm.put_many(spill, [views[i] for i in large]), strict=True)) if spill and large else {}
    buffers: Buffers = []
    for i, view in enumerate(views):
        ref = refs.get(i) if type(view) is memoryview else view
        if ref is not None:
            buffers.append((BUF_SPILLED, ref))
        else:
            buffers.append(maybe_compress(view) if compress else (0, view))
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
    if type(body) is not memoryview and _TORCH_STORAGE not in body:
        return pickle.loads(body, buffers=bufs)  # the common case, 3x faster than a subclass
    return _Unpickler(body, [], bufs).load()


_TORCH_STORAGE = b"_load_from_bytes"  # in a pickle that _Unpickler.find_class must see


def loads_frame(frame: Frame) -> Any:
    return loads(frame.flags, frame.body, frame.buffers)


def discard(buffers: Buffers) -> None:
    """Give back the shared-memory segments of a payload that will never be read (once
    each: the buffers of one value share a segment)."""
    for ref in dict.fromkeys(shm.lending(data) for bflags, data in buffers if bflags & BUF_SPILLED):
        shm.release(ref)


# -- results and errors ---------------------------------------------------------------------
# A RESULT body unpickles to ("ok", value) (a map chunk's: ("ok", values, seconds its calls
# took)) or ("err", exception, traceback_text) or, when the exception itself cannot be
# pickled, ("err-text", type_name, message, traceback_text).


def dumps_ok(value: Any, what: str, spill: Path | None = None, seconds: float | None = None,
             compress: bool | None = None) -> tuple[int, bytes | memoryview, Buffers]:
    """("ok", value), or ("ok", value, seconds) for a map chunk (how long its calls took)."""
    try:
        return dumps(("ok", value) if seconds is None else ("ok", value, seconds), spill, compress)
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
