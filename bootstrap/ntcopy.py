"""Large copies into shared memory with non-temporal stores (x86-64 Linux).

glibc's memcpy writes through the cache (``rep movsb``) below a size it derives from the
L3 cache it sees, and with non-temporal (streaming) stores above it. A virtual machine
that reports its host's whole L3 gets a cut-off of 100 MB or more, so every buffer under it
is copied at about half the speed of one above it (a 2-core VM of 482 MiB "L3": 6.4 GB/s
under 181 MiB, 11.5 above; an H200 machine: a dict of ten 20 MB arrays echoed at 0.59x one
200 MB array). A copy into a segment is read by another process, not by this one, so it
gains nothing from the cache: this module copies such buffers with streaming stores whatever
their size.

The copy loop is a few SSE2 instructions (part of every x86-64 CPU), placed in a page of
their own that is made executable, and called through ctypes, which lets go of the GIL for
the call. Where that cannot be (another machine or OS, a 32-bit Python, a system that
refuses executable memory) or ``SKYWARD_NT_COPY=0`` is set, ``copy`` returns False and the
caller copies as before.
"""

from __future__ import annotations

import os
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MIN = 4 << 20  # a value's large buffers under this in all may still be in a cache the reader shares: memcpy
_PAGE = 4096
_BLOCK = 4 * _PAGE  # the loop copies whole blocks of four pages
_TURN = 128  # bytes of each page a turn of the inner loop copies


def _code() -> bytes:
    """``void copy(char *dst, const char *src, size_t n)`` in x86-64 machine code (System V
    calls: dst in rdi, 16-byte aligned; src in rsi; n in rdx, a multiple of _BLOCK, not 0).

    As glibc's own streaming copy does, it works on four pages at once: each turn loads
    128 bytes of each of four source pages (unaligned loads, SSE2), stores them with
    streaming stores, and asks for the same bytes of the next block ahead; a store fence
    ends it. Measured into a shared-memory segment on the 2-core VM: 11.4-11.7 GB/s, glibc's
    11.3; a plain 64-byte loop 10.2; memcpy under glibc's cut-off 6.6.
    """
    import struct

    def disp(offset: int) -> bytes:  # mod=10: [base + disp32]
        return struct.pack("<i", offset)

    def load(xmm: int, offset: int) -> bytes:  # movdqu xmm, [rsi + offset]
        return b"\xf3\x0f\x6f" + bytes([0x80 | xmm << 3 | 6]) + disp(offset)

    def store(xmm: int, offset: int) -> bytes:  # movntdq [rdi + offset], xmm
        return b"\x66\x0f\xe7" + bytes([0x80 | xmm << 3 | 7]) + disp(offset)

    def prefetch(offset: int) -> bytes:  # prefetcht0 [rsi + offset]
        return b"\x0f\x18" + bytes([0x80 | 1 << 3 | 6]) + disp(offset)

    def add(reg: int, value: int) -> bytes:  # add r64, imm32 (rsi 6, rdi 7; rdx 2 with sub)
        return b"\x48\x81" + bytes([0xC0 | reg]) + struct.pack("<i", value)

    def jnz(back: int) -> bytes:  # jnz rel32, to ``back`` bytes before this instruction
        return b"\x0f\x85" + struct.pack("<i", -back - 6)

    turn = b""
    for page in range(4):
        base = page * _PAGE
        turn += prefetch(base + _BLOCK) + prefetch(base + _BLOCK + 64)
        turn += b"".join(load(x, base + 16 * x) for x in range(8))
        turn += b"".join(store(x, base + 16 * x) for x in range(8))
    turn += add(6, _TURN) + add(7, _TURN) + b"\xff\xc9"  # dec ecx
    turn += jnz(len(turn))
    block = b"\xb9" + struct.pack("<i", _PAGE // _TURN) + turn  # mov ecx, turns a page
    step = _BLOCK - _PAGE  # the turns moved one page on; the block is four
    block += add(6, step) + add(7, step) + b"\x48\x81\xea" + struct.pack("<i", _BLOCK)  # sub rdx
    block += jnz(len(block))
    return block + b"\x0f\xae\xf8\xc3"  # sfence; ret


_loop: Callable[[int, int, int], None] | None = None
_tried = False


def available() -> bool:
    """Whether copies here use streaming stores."""
    return _get() is not None


def copy_many(copies: list[tuple[int, int, int]]) -> bool:
    """Copy ``n`` bytes from address ``src`` to address ``dst`` (not overlapping) for each
    (dst, src, n), with streaming stores, the bytes of all of them shared among the threads at
    once (see ``ways``); False, copying nothing, where this process cannot."""
    loop = _get()
    if loop is None:
        return False
    import ctypes

    bodies = []
    for dst, src, n in copies:
        head = min(-dst % 64, n)  # memmove up to a cache line, so that the stores are aligned
        body = (n - head) // _BLOCK * _BLOCK
        tail = n - head - body
        if head:
            ctypes.memmove(dst, src, head)
        if tail:
            ctypes.memmove(dst + head + body, src + head + body, tail)
        if body:
            bodies.append((dst + head, src + head, body))
    _run_shared(loop, bodies)
    return True


# -- several threads on one copy ---------------------------------------------------------------
# One core streams at 10-12 GB/s; a machine's memory takes several times that. From
# PARALLEL_MIN bytes on, the bodies of a value's copies are shared out in whole blocks among up
# to ``ways()`` threads: the calling thread copies the first share, helper threads (kept for
# the process, started on first use, started again in a forked child) the others. Cut by
# bytes, not by buffer, so ten 20 MB arrays split as one 200 MB array does, with one hand-off
# per value. Measured on the 2-core VM (1-node Local pool, 200 MB echoed): one thread 8.0-9.3
# GB/s, two 12.5-14.0. Ray's object store copies large objects on several threads too.
PARALLEL_MIN = 16 << 20
_MAX_WAYS = 4


def ways() -> int:
    """Among how many threads a large copy is shared here: the CPUs this process may run on,
    at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(_MAX_WAYS, cpus))


def _shares(bodies: list[tuple[int, int, int]], k: int) -> list[list[tuple[int, int, int]]]:
    """``bodies`` cut into ``k`` lists of about equal bytes, cut only at whole blocks."""
    total = sum(n for _, _, n in bodies)
    size = -(-total // k // _BLOCK) * _BLOCK
    shares: list[list[tuple[int, int, int]]] = [[]]
    room = size
    for dst, src, n in bodies:
        while n:
            if room == 0:
                shares.append([])
                room = size
            take = min(n, room)
            shares[-1].append((dst, src, take))
            dst, src, n, room = dst + take, src + take, n - take, room - take
    return shares


def _run_shared(loop: Callable[[int, int, int], None], bodies: list[tuple[int, int, int]]) -> None:
    total = sum(n for _, _, n in bodies)
    k = ways() if total >= PARALLEL_MIN else 1
    shares = _shares(bodies, k) if k > 1 else [bodies]
    if len(shares) == 1:
        for dst, src, n in bodies:
            loop(dst, src, n)
        return
    helpers = _helpers(len(shares) - 1)
    done: Any = helpers.done()
    for share in shares[1:]:
        helpers.jobs.put((loop, share, done))
    failed: BaseException | None = None
    try:
        for dst, src, n in shares[0]:
            loop(dst, src, n)
    finally:
        # Every share is waited for, even when this thread is interrupted: no helper may
        # write into a segment after the copy said it is over.
        for _ in shares[1:]:
            while True:
                try:
                    error = done.get()
                    break
                except BaseException as exc:  # KeyboardInterrupt while waiting: wait on, then raise
                    failed = failed or exc
            failed = failed or error
    if failed is not None:
        raise failed


class _Helpers:
    """The helper threads of this process (a forked child starts its own: ``_forked``)."""

    def __init__(self) -> None:
        from _queue import SimpleQueue  # queue.SimpleQueue, without loading the queue module

        self.jobs: Any = SimpleQueue()
        self.done = SimpleQueue  # a fresh one for each copy's answers
        self.count = 0
        self.lock = threading.Lock()

    def grow(self, count: int) -> None:
        with self.lock:
            while self.count < count:
                self.count += 1
                threading.Thread(target=self._run, name=f"skyward-copy-{self.count}", daemon=True).start()

    def _run(self) -> None:
        while True:
            loop, share, done = self.jobs.get()
            try:
                for dst, src, n in share:
                    loop(dst, src, n)
            except BaseException as exc:  # handed to the copying thread
                done.put(exc)
            else:
                done.put(None)


_helpers_now: _Helpers | None = None
_helpers_lock = threading.Lock()


def _forked() -> None:
    """In a forked child: no helper threads came along, and the lock may have been held."""
    global _helpers_now, _helpers_lock
    _helpers_now, _helpers_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forked)


def _helpers(count: int) -> _Helpers:
    global _helpers_now
    with _helpers_lock:
        helpers = _helpers_now
        if helpers is None:
            helpers = _helpers_now = _Helpers()
    helpers.grow(count)
    return helpers


def _get() -> Callable[[int, int, int], None] | None:
    global _loop, _tried
    if not _tried:
        _tried = True
        _loop = _build()
    return _loop


def _build() -> Callable[[int, int, int], None] | None:
    if os.environ.get("SKYWARD_NT_COPY", "1") == "0" or sys.platform != "linux":
        return None
    import struct

    if os.uname().machine not in ("x86_64", "amd64") or struct.calcsize("P") != 8:
        return None
    import ctypes
    import mmap

    code = _code()
    size = -(-len(code) // mmap.PAGESIZE) * mmap.PAGESIZE
    try:
        page = mmap.mmap(-1, size, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        page.write(code)
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        # Never writable and executable at once: systems that refuse that (SELinux execmem,
        # PaX) may still allow this; those that refuse any executable page say no here.
        if libc.mprotect(address, size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
            return None
    except (OSError, ValueError, AttributeError):
        return None
    _keep.append(page)  # the page lives as long as the process
    loop: Callable[[int, int, int], None] = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(address)
    return loop


_keep: list[object] = []
