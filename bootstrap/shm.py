"""Shared-memory segments: large buffers between processes of one host (Local pools).

A segment is a file in the pool's spill folder (``/dev/shm/skyward-<pool>-*``), made and
written by one process, its owner, and lent to one receiver at a time::

    page 0: sent generation (u64, the owner's) | released generation (u64, the receiver's)
    page 1...: the buffer

The owner keeps each segment mapped and reuses it: sending a buffer is one memcpy into
memory that is already mapped and allocated (a fresh tmpfs page costs a fault and zeroing, five
times the copy). It bumps the sent generation and sends a reference (generation, length,
path) in the frame instead of the bytes. The receiver maps the segment once, shared and
writable, and keeps the mapping; each buffer it is sent is a view on that mapping, so an array
rebuilt on it is neither copied nor read-only (the bytes are the receiver's until it lets go).
When the last view goes (the array and everything made from it is garbage), the receiver
writes the generation into the released slot, and the owner may reuse the segment. A payload
that is never read is released by ``release`` (``serialize.discard``).

Nothing outlives the pool: the spill folder is removed when the pool closes, and by the
agents' orphan clean-up when the client was killed. A segment whose owner died is unlinked by
whoever releases it last. Owners unlink their free segments after ``IDLE`` seconds unused and
beyond ``keep_bytes``. A full folder (``posix_fallocate`` fails, or less than ``RESERVE`` of
the filesystem would stay free) makes ``put`` return None: the caller sends the bytes through
the stream instead.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
import sys
import threading
import time
import weakref
from pathlib import Path

from . import ntcopy
from .procs import alive

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

HEADER = mmap.ALLOCATIONGRANULARITY  # the buffer starts on a page boundary (aligned arrays)
_GENS = struct.Struct("=QQ")  # sent, released
_RELEASED = 8  # offset of the released generation
REF = struct.Struct("!QQQI")  # generation, offset, length, parts in the segment; the path follows
IDLE = 30.0  # seconds a free segment is kept for reuse
KEEP = 2 << 30  # at most this many bytes of free segments kept per process and folder...
KEEP_FRACTION = 8  # ...and at most 1/8 of the filesystem
RESERVE = 16  # a new segment must leave 1/16 of the filesystem free
_GRAIN = 1 << 20  # segment sizes are rounded up to this


class _Segment:
    __slots__ = ("capacity", "gen", "mm", "path", "used")

    def __init__(self, path: Path, mm: mmap.mmap, capacity: int) -> None:
        self.path, self.mm, self.capacity = path, mm, capacity
        self.gen = 0
        self.used = time.monotonic()

    def free(self) -> bool:
        sent, released = _GENS.unpack_from(self.mm, 0)
        return bool(sent == released)


class Owner:
    """The segments this process writes into one folder."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.segments: list[_Segment] = []
        self.lock = threading.Lock()
        st = os.statvfs(directory)
        self.keep_bytes = min(KEEP, st.f_blocks * st.f_frsize // KEEP_FRACTION)

    def put(self, buffers: list[memoryview]) -> list[bytes | None]:
        """Copy the buffers (one value's) into one free segment, each at a page boundary, all
        the copies at once; their references, None for each that found no room. One segment a
        value: a state_dict of hundreds of tensors is one reservation and one mapping, lent
        until the receiver lets go of its last view."""
        offsets, end = [], 0
        for data in buffers:
            offsets.append(end)
            end += -(-data.nbytes // HEADER) * HEADER
        got = self.reserve(end) if buffers else None
        if got is None:  # no room for them all: each on its own, as room allows
            return [self.put([data])[0] for data in buffers] if len(buffers) > 1 else [None] * len(buffers)
        seg = got[0]
        path = os.fsencode(seg.path)
        parts = len(buffers)
        _copy([(seg.mm, HEADER + offset, data) for offset, data in zip(offsets, buffers, strict=True)])
        return [REF.pack(seg.gen, offset, data.nbytes, parts) + path for offset, data in zip(offsets, buffers, strict=True)]

    def reserve(self, n: int) -> tuple[_Segment, bytes] | None:
        """A free segment of ``n`` bytes or more, marked lent, and its reference (the caller
        fills it); None: no room."""
        with self.lock:
            seg = self._take(n)
            if seg is None:
                seg = self._create(n)
                if seg is None:
                    return None
                self.segments.append(seg)
            seg.gen += 1
            _GENS.pack_into(seg.mm, 0, seg.gen, seg.gen - 1)  # busy from here on
            seg.used = time.monotonic()
        _janitor.watch(self)
        return seg, REF.pack(seg.gen, 0, n, 1) + os.fsencode(seg.path)

    def _take(self, n: int) -> _Segment | None:
        best = None
        for seg in self.segments:
            if seg.capacity >= n and (best is None or seg.capacity < best.capacity) and seg.free():
                best = seg
        return best

    def _create(self, n: int) -> _Segment | None:
        capacity = -(-n // _GRAIN) * _GRAIN
        size = HEADER + capacity
        self.trim(IDLE, need=size)
        if not _room(self.directory, size):
            return None
        try:
            path = self.directory / f"{os.getpid()}-{os.urandom(16).hex()}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return None
        try:
            # Allocates every page now: a full tmpfs fails here (ENOSPC), never with SIGBUS
            # in the middle of a memcpy into the mapping. (Systems without it: a sparse file.)
            allocate = getattr(os, "posix_fallocate", None)
            if allocate is not None:
                allocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except (OSError, ValueError):
            os.close(fd)
            path.unlink(missing_ok=True)
            return None
        os.close(fd)
        return _Segment(path, mm, capacity)

    def trim(self, idle: float, need: int = 0) -> bool:
        """Unlink free segments unused for ``idle`` seconds, and those beyond ``keep_bytes``
        (less ``need``); returns whether any segment is left (call with the lock held or from
        the janitor)."""
        now = time.monotonic()
        kept = 0
        left = []
        for seg in sorted(self.segments, key=lambda s: -s.used):  # most recently used first
            if seg.free() and (now - seg.used >= idle or kept + seg.capacity + need > self.keep_bytes):
                _drop(seg)
            else:
                kept += seg.capacity if seg.free() else 0
                left.append(seg)
        self.segments = left
        return bool(left)

    def close(self) -> None:
        with self.lock:
            for seg in self.segments:
                _drop(seg)
            self.segments = []


def _room(directory: Path, size: int) -> bool:
    """Whether ``size`` more bytes leave 1/RESERVE of the folder's filesystem free."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return (st.f_bavail * st.f_frsize - size) * RESERVE >= st.f_blocks * st.f_frsize


# Called with a mapping just before this process unmaps it: serialize unpins what CUDA pinned.
unmapping: list[Callable[[mmap.mmap], None]] = []


def _before_unmap(mm: mmap.mmap) -> None:
    for hook in unmapping:
        try:
            hook(mm)
        except Exception:  # a hook must not keep a mapping from going
            pass


def _drop(seg: _Segment) -> None:
    seg.path.unlink(missing_ok=True)  # a receiver's mapping keeps its pages until it unmaps
    _before_unmap(seg.mm)
    try:
        seg.mm.close()
    except BufferError:
        pass  # cannot happen for an owner's mapping; the pages go with the last reference


def _copy(copies: list[tuple[mmap.mmap, int, memoryview]]) -> None:
    """Copy each buffer into a mapping at its offset, with the GIL released
    when NumPy is loaded (it is, when arrays are sent). When a value's buffers of 1 MB or more
    come to ``ntcopy.MIN`` bytes in all, they are copied with streaming stores, all at once and
    shared among threads (the reader is another process: this one's cache gains nothing from
    them, and a state_dict of many 2 MB tensors is as large as one big array); memcpy below
    that, or where streaming stores cannot be."""
    np: Any = sys.modules.get("numpy")
    large: list[tuple[Any, Any]] = []
    for mm, offset, data in copies:
        n = data.nbytes
        if np is None or n < 1 << 20:
            mm[offset : offset + n] = data
        else:
            large.append((np.frombuffer(mm, np.uint8, n, offset), np.frombuffer(data, np.uint8)))
    total = sum(dst.nbytes for dst, _ in large)
    if total < ntcopy.MIN or not ntcopy.copy_many([(_address(d), _address(s), d.nbytes) for d, s in large]):
        for dst, src in large:
            np.copyto(dst, src)
    del large  # the arrays on the mappings, which must not outlive them


def _address(array: Any) -> int:
    return int(array.__array_interface__["data"][0])


class _Janitor:
    """One daemon thread per process, alive while it owns segments or maps others': unlinks
    its free segments left unused for IDLE seconds, and unmaps the segments their owners
    removed (a mapping would keep their memory)."""

    def __init__(self) -> None:
        self.owners: weakref.WeakSet[Owner] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.running = False

    def watch(self, owner: Owner | None = None) -> None:
        with self.lock:
            if owner is not None:
                self.owners.add(owner)
            if self.running:
                return
            self.running = True
        threading.Thread(target=self._run, name="skyward-shm-janitor", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(IDLE / 3)
            with self.lock:
                owners = list(self.owners)
            busy = False
            for owner in owners:
                with owner.lock:
                    busy |= owner.trim(IDLE)
            busy |= _unmap_stale()
            with self.lock:
                if not busy:
                    self.running = False
                    return


_janitor = _Janitor()
_owners: dict[Path, Owner] = {}
_owners_lock = threading.Lock()


def _owner(directory: Path, n: int) -> Owner | None:
    owner = _owners.get(directory)
    if owner is None:
        with _owners_lock:
            owner = _owners.get(directory)
            if owner is None:
                try:
                    owner = _owners[directory] = Owner(directory)
                except OSError as exc:
                    _full(directory, n, exc)
                    return None
    return owner


def put_many(directory: Path, buffers: list[memoryview]) -> list[bytes | None]:
    """Place each buffer in a segment of ``directory``, copied all at once (one value's
    arrays); their references, None for each that found no room (send it through the stream)."""
    owner = _owner(directory, sum(b.nbytes for b in buffers))
    if owner is None:
        return [None for _ in buffers]
    refs = owner.put(buffers)
    for data, ref in zip(buffers, refs, strict=True):
        if ref is None:
            _full(directory, data.nbytes, None)
    return refs


def reserve(directory: Path, n: int) -> tuple[memoryview, bytes] | None:
    """A lent segment to receive ``n`` bytes into: a writable view of its data (fill it,
    then let it go) and its reference; None when there is no room."""
    owner = _owner(directory, n)
    got = owner.reserve(n) if owner is not None else None
    if got is None:
        if owner is not None:
            _full(directory, n, None)
        return None
    seg, ref = got
    return memoryview(seg.mm)[HEADER : HEADER + n], ref


_warned: set[Path] = set()


def _full(directory: Path, n: int, exc: OSError | None) -> None:
    """Say once per folder that shared memory is full and the bytes take the slower path."""
    if directory in _warned:
        return
    _warned.add(directory)
    why = f" ({exc})" if exc is not None else ""
    import logging

    logging.getLogger("skyward.shm").warning(
        "no room for a %.0f MB buffer in the shared-memory folder %s%s; large buffers go through "
        "the pool's sockets instead (slower) until there is. Free space in /dev/shm (df -h /dev/shm), "
        "or make it larger.", n / 1e6, directory, why,
    )


# -- receiving -----------------------------------------------------------------------------

_MAPS_MAX = 64
_maps: dict[bytes, mmap.mmap] = {}  # path -> mapping of another process's segment (insertion = LRU)
_maps_lock = threading.Lock()


def _mapping(path: bytes) -> mmap.mmap:
    with _maps_lock:
        mm = _maps.pop(path, None)
        if mm is not None:
            _maps[path] = mm  # most recent last
            return mm
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"the shared-memory segment {os.fsdecode(path)} is gone: its pool was closed, or its "
            f"folder was removed while a payload was on its way"
        ) from None
    try:
        mm = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    with _maps_lock:
        _maps[path] = mm
        dropped = []
        while len(_maps) > _MAPS_MAX:  # the oldest; views made from them keep them mapped
            dropped.append(_maps.pop(next(iter(_maps))))
    for old in dropped:
        _unmap(old)
    _unmap_stale(keep=path)
    _janitor.watch()
    return mm


def _unmap_stale(keep: bytes = b"") -> bool:
    """Forget the mappings of segments their owner removed (their memory lives while mapped);
    returns whether any mapping is left."""
    with _maps_lock:
        stale = [p for p in _maps if p != keep and not os.path.exists(p)]
        dropped = [_maps.pop(p) for p in stale]
        left = bool(_maps)
    for old in dropped:
        _unmap(old)
    return left


def _unmap(mm: mmap.mmap) -> None:
    _before_unmap(mm)
    try:
        mm.close()
    except BufferError:
        pass  # views on it are alive: it is unmapped with the last of them


# Segments lent with several parts (one value's buffers): (path, generation) -> the parts'
# views still alive here. The segment is released when the last of them goes.
_lent: dict[tuple[bytes, int], int] = {}
_lent_lock = threading.RLock()  # a view's finalizer may run while this thread holds it


def _forked() -> None:
    """In a forked child: fresh locks (another thread may have held one at the fork, and the
    child's copy would stay held for good) and no janitor thread (none came along)."""
    global _lent_lock, _maps_lock, _owners_lock
    _lent_lock, _maps_lock, _owners_lock = threading.RLock(), threading.Lock(), threading.Lock()
    for owner in _owners.values():
        owner.lock = threading.Lock()
    _janitor.lock = threading.Lock()
    _janitor.running = False


os.register_at_fork(after_in_child=_forked)


def get(ref: bytes | bytearray | memoryview) -> Any:
    """The buffer a reference names: a writable view on the segment, which stays lent to this
    process until the view and everything made from it are gone (and, for a segment that
    holds several buffers, those of every other buffer in it)."""
    ref = bytes(ref)
    gen, offset, n, parts = REF.unpack_from(ref, 0)
    path = ref[REF.size :]
    mm = _mapping(path)
    view = memoryview(mm)[HEADER + offset : HEADER + offset + n]
    if parts > 1:
        with _lent_lock:
            _lent.setdefault((path, gen), parts)
    # NumPy keeps the object whose buffer it uses: a PickleBuffer hands out ``view`` itself,
    # so ``view`` lives exactly as long as arrays rebuilt on it.
    done = weakref.finalize(view, _let_go, mm, gen, path, parts, os.getpid())
    done.atexit = False
    return pickle.PickleBuffer(view)


def _let_go(mm: mmap.mmap, gen: int, path: bytes, parts: int, pid: int) -> None:
    """A view of a lent segment is gone: the last of them (of every part) gives it back. Only
    in the process it was lent to: a forked child's copy of a view going away is not the
    receiver letting go (it would free the segment under the parent's arrays)."""
    if os.getpid() != pid:
        return
    if parts > 1:
        with _lent_lock:
            left = _lent.pop((path, gen), 1) - 1
            if left:
                _lent[(path, gen)] = left
                return
    _release_mapped(mm, gen, path)


def _release_mapped(mm: mmap.mmap, gen: int, path: bytes) -> None:
    try:
        struct.pack_into("=Q", mm, _RELEASED, gen)
    except (ValueError, TypeError):  # closed meanwhile
        return
    _unlink_if_orphaned(path)


def lending(ref: bytes | bytearray | memoryview) -> bytes:
    """The part of a reference that names the segment's lending (its generation and path):
    the same for every buffer of one value."""
    ref = bytes(ref)
    gen, _, _, parts = REF.unpack_from(ref, 0)
    return REF.pack(gen, 0, 0, parts) + ref[REF.size :]


def release(ref: bytes | bytearray | memoryview) -> None:
    """Give back a segment whose payload will never be read (any process may)."""
    ref = bytes(ref)
    gen = REF.unpack_from(ref, 0)[0]  # once per segment is enough; again is harmless
    path = ref[REF.size :]
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return
    try:
        os.pwrite(fd, struct.pack("=Q", gen), _RELEASED)
    except OSError:
        pass
    finally:
        os.close(fd)
    _unlink_if_orphaned(path)


def _unlink_if_orphaned(path: bytes) -> None:
    """A segment released after its owner died is nobody's: remove it."""
    try:
        pid = int(os.path.basename(path).split(b"-", 1)[0])
    except ValueError:
        return
    if pid == os.getpid() or alive(pid):
        return
    try:
        os.unlink(path)
    except OSError:
        pass


def forget(directory: Path) -> None:
    """The pool that used ``directory`` is closed (or detached): unlink this process's
    segments there and drop its mappings of the others'."""
    with _owners_lock:
        owner = _owners.pop(directory, None)
    if owner is not None:
        owner.close()
    prefix = os.fsencode(directory) + b"/"
    with _maps_lock:
        gone = [p for p in _maps if p.startswith(prefix)]
        dropped = [_maps.pop(p) for p in gone]
    for mm in dropped:
        _unmap(mm)


def sweep(directory: Path, pid: int) -> None:
    """Remove the free segments of a process that exited (the agent calls it for its workers);
    those lent to a receiver go when it releases them (``_unlink_if_orphaned``)."""
    prefix = f"{pid}-"
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            sent, released = _GENS.unpack(os.pread(fd, _GENS.size, 0))
        except (OSError, struct.error):
            continue
        finally:
            os.close(fd)
        if sent == released:
            try:
                os.unlink(path)
            except OSError:
                pass


def held(directory: Path) -> int:
    """How many segments this process owns in ``directory`` (tests, diagnostics)."""
    owner = _owners.get(directory)
    return len(owner.segments) if owner is not None else 0
