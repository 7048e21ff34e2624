"""Length-prefixed frames: the wire format between client, agent and workers.

A frame is a fixed header, the lengths of its out-of-band buffers, a body and the buffers::

    kind:u8 flags:u8 nbufs:u16 task_id:u64 body_len:u64 | nbufs x u64 | body | buf0 | buf1 ...

The top two bits of a buffer length are that buffer's flags (lz4-compressed, or in a
shared-memory segment that the data names; see ``serialize`` and ``shm``). Frames are
written with one ``sendmsg`` (scatter/gather, no concatenation of large buffers) and read
through a buffered reader that receives large parts straight into their final bytearray (or
into a shared-memory segment, for an agent serving a remote client).

A *sealed* link (plain TCP that SSH does not carry: ``sky.SSH(direct=True)``, Slurm's nodes,
the collections between nodes; see handshake.py) adds a MAC to every frame after the
handshake, an HMAC-SHA256 cut to ``TAG`` bytes under that direction's session key, and a
second one after the header of a frame whose body and buffers exceed ``SEAL_CHUNK`` bytes::

    header | buffer lengths | [MAC1] | body | buf0 | buf1 ... | MAC2

MAC2 covers the frame's sequence number (counted, never sent: a replayed, dropped or reordered
frame fails) and every byte of the frame; MAC1, the sequence number, the header and the
lengths, so that a forged header claiming more than ``SEAL_CHUNK`` bytes allocates nothing. A
frame that fails is never returned: the reader raises ``Tampered`` and the connection is
closed. The large parts are hashed a ``SEAL_CHUNK`` at a time as they are sent or arrive.
Unix sockets and SSH channels are not sealed: their transport already keeps strangers out of
the stream.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from enum import IntEnum

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs the agent's start-up)
    from typing import Any

HEADER = struct.Struct("!BBHQQ")
BUFLEN = struct.Struct("!Q")
FLAG_SHIFT = 62
LENGTH_MASK = (1 << FLAG_SHIFT) - 1
MAX_PARTS = 0xFFFF
# Frames below this size are joined and written with one sendall: one syscall, one packet.
_JOIN_LIMIT = 64 * 1024
# A reader's buffer starts at _FIRST_CHUNK and grows, up to _READ_CHUNK, each time a read fills it
# (the peer sends faster than frames are taken out): a link that carries little (a node of a
# large pool between tasks) holds 16 KiB, not 256, and a busy one soon reads 256 KiB at a time.
_FIRST_CHUNK = 16 * 1024
_READ_CHUNK = 256 * 1024
TAG = 16  # bytes of each MAC of a sealed frame (HMAC-SHA256, truncated as RFC 4868 does)
# A sealed frame whose body and buffers exceed this has a MAC after its header too; its large
# parts are hashed and sent (or read) this much at a time.
SEAL_CHUNK = 1 << 20
_SEQ = struct.Struct("!Q")


class Kind(IntEnum):
    # The handshake (handshake.py): the listener's CHALLENGE (its nonce) comes first, then the
    # client's HELLO (its nonce, its proof of the pool's key, lease ttl), then the WELCOME
    # (the listener's proof, node facts).
    HELLO = 1
    WELCOME = 2
    CHALLENGE = 41
    CONFIGURE = 3  # client -> agent -> worker: cluster topology and worker settings
    TASK = 4  # one function call
    MAP = 5  # one chunk of a map
    RESULT = 6  # value or error of a TASK / MAP
    OUTPUT = 7  # a piece of a task's stdout/stderr
    PING = 9  # lease renewal
    SHUTDOWN = 10  # stop serving and exit
    METRIC = 12  # agent -> client: one sample of a node metric (JSON)
    # Nested dispatch ("the client is the hub"): a task running on a node submits work to the
    # pool. SUBMIT goes worker -> agent -> client with a NESTED prefix on its body; the client
    # runs the payload on a node and answers with REPLY (a RESULT's flags, body and buffers).
    SUBMIT = 13
    REPLY = 14
    # client -> agent -> worker (or client -> worker by the lane): stop a task; a queued one is
    # dropped, a running one interrupted or its slot replaced; it answers TaskCancelledError.
    CANCEL = 15
    PONG = 16  # agent -> client: answer to a PING, so the client notices a node gone silent
    # agent -> client: the pool is being stopped from outside (`skyward down`); the body (JSON)
    # says by what, who and when. The agent's tasks end with PoolStoppedError, then it exits.
    STOPPING = 40
    # client -> agent: run the pool's health check (a pickled fn(InstanceInfo)) beside the
    # workers, never in a task slot; the answer is a RESULT with the same task id.
    HEALTH = 30
    # Distributed collections (see state.py): a request to the head node's collection server,
    # from the client over its channel or from a worker over the state listener. The answer
    # is a RESULT with the same id.
    STATE = 17
    # Streaming (see stream.py). A generator task sends its values as YIELD batches
    # (worker -> agent -> client); the consumer returns CREDIT for what it took and STOP when
    # it closes the iterator. An iterator argument is pulled: PULL (worker -> client) asks for
    # the next batch of one argument, FEED (client -> worker) carries it.
    YIELD = 18
    CREDIT = 19
    STOP = 20
    PULL = 21
    FEED = 22
    # The lane (lane.py): a client on the node's own host sends plain tasks straight to the
    # worker of a thread-executor node, skipping the agent's relay. LANE (agent -> client,
    # JSON) says where the worker listens and how many tasks it takes; LANE_LOST (agent ->
    # client, a RESULT's flags and body: the error) says the worker exited, for the tasks it
    # had from the lane.
    LANE = 23
    LANE_LOST = 24


# Flags of a TASK frame beside serialize's (bit 0): the client streams the task's generator
# (STREAM_OUT) or feeds it iterator arguments (STREAM_IN). Agents relay them unchanged.
FLAG_STREAM_OUT = 0x40
FLAG_STREAM_IN = 0x20


# Prefix of a SUBMIT body: the agent's id of the task that submits, and the payload's kind
# (TASK or MAP); the payload (a TASK / MAP body) follows unchanged.
NESTED = struct.Struct("!QB")


class Frame:
    """One frame. (A plain class: the agent imports this module, and dataclasses would cost
    it a fifth of its start-up.)"""

    __slots__ = ("body", "buffers", "flags", "kind", "task_id")

    def __init__(self, kind: int, task_id: int = 0, body: bytes | bytearray | memoryview = b"", flags: int = 0,
                 buffers: list[tuple[int, bytes | bytearray | memoryview]] | None = None) -> None:
        self.kind, self.task_id, self.body, self.flags = kind, task_id, body, flags
        # Each buffer: (flags, data); flags are serialize.BUF_LZ4 / serialize.BUF_SPILLED.
        self.buffers: list[tuple[int, bytes | bytearray | memoryview]] = buffers if buffers is not None else []

    def __repr__(self) -> str:
        return f"Frame(kind={self.kind}, task_id={self.task_id}, body={len(self.body)} bytes, flags={self.flags}, buffers={len(self.buffers)})"


class Tampered(ConnectionError):
    """A sealed frame whose MAC is wrong: written, replayed, reordered or cut by someone between
    the two ends. The connection cannot be trusted any more (close it)."""


class _Seal:
    """One direction of a sealed link: its session key and the number of the next frame."""

    __slots__ = ("_base", "compare", "seq")

    def __init__(self, key: bytes) -> None:
        import hmac  # (here: only sealed links pay for OpenSSL's import)

        self._base = hmac.new(key, digestmod="sha256")
        self.compare = hmac.compare_digest
        self.seq = 0

    def start(self, head: bytes) -> Any:
        """The MAC of the next frame, fed its sequence number and ``head``."""
        mac = self._base.copy()
        mac.update(_SEQ.pack(self.seq))
        mac.update(head)
        self.seq += 1
        return mac


class FrameWriter:
    """Writes frames to a socket; safe to share between threads."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._seal: _Seal | None = None

    def seal(self, key: bytes, first: Frame | None = None) -> None:
        """From now on, every frame carries its MACs under ``key`` (see the module's doc).
        ``first`` (the WELCOME, which the handshake covers) is sent plain just before, with
        no other thread's frame between."""
        seal = _Seal(key)
        with self._lock:
            if first is not None:
                self._sock.sendall(HEADER.pack(first.kind, first.flags, 0, first.task_id, len(first.body)) + first.body)
            self._seal = seal

    def send(self, frame: Frame) -> None:
        self.send_parts(frame.kind, frame.task_id, frame.flags, frame.body, frame.buffers)

    def send_parts(
        self,
        kind: int,
        task_id: int,
        flags: int,
        body: bytes | bytearray | memoryview,
        buffers: list[tuple[int, bytes | bytearray | memoryview]] = (),  # type: ignore[assignment]
    ) -> None:
        if self._seal is not None:
            self._send_sealed(kind, task_id, flags, body, buffers)
            return
        if not buffers and len(body) <= _JOIN_LIMIT:
            # The common case (a small task or result): one allocation, one syscall.
            packet = HEADER.pack(kind, flags, 0, task_id, len(body)) + body
            with self._lock:
                if self._seal is None:  # (sealed while this waited for the lock: see below)
                    self._sock.sendall(packet)
                    return
            self._send_sealed(kind, task_id, flags, body, buffers)
            return
        if len(buffers) > MAX_PARTS:
            raise ValueError(f"a frame carries at most {MAX_PARTS} buffers, got {len(buffers)}")
        head = [HEADER.pack(kind, flags, len(buffers), task_id, len(body))]
        for bflags, data in buffers:
            head.append(BUFLEN.pack(memoryview(data).nbytes | (bflags << FLAG_SHIFT)))
        parts: list[bytes | bytearray | memoryview] = [b"".join(head), body]
        parts.extend(data for _, data in buffers)
        total = sum(memoryview(p).nbytes for p in parts)
        with self._lock:
            # A frame that found the link plain but waited for the lock while ``seal`` held it
            # goes sealed: sent plain after the WELCOME, the peer would take its bytes for a
            # sealed frame and drop the link as tampered with.
            if self._seal is None:
                if total <= _JOIN_LIMIT:
                    self._sock.sendall(b"".join(parts))
                else:
                    _sendmsg_all(self._sock, parts)
                return
        self._send_sealed(kind, task_id, flags, body, buffers)

    def _send_sealed(self, kind: int, task_id: int, flags: int, body: bytes | bytearray | memoryview,
                     buffers: list[tuple[int, bytes | bytearray | memoryview]]) -> None:
        if len(buffers) > MAX_PARTS:
            raise ValueError(f"a frame carries at most {MAX_PARTS} buffers, got {len(buffers)}")
        head = [HEADER.pack(kind, flags, len(buffers), task_id, len(body))]
        for bflags, data in buffers:
            head.append(BUFLEN.pack(memoryview(data).nbytes | (bflags << FLAG_SHIFT)))
        joined = b"".join(head)
        views = [memoryview(p).cast("B") for p in (body, *(data for _, data in buffers))]
        total = sum(v.nbytes for v in views)
        with self._lock:  # the sequence numbers are the order on the wire
            assert self._seal is not None
            mac = self._seal.start(joined)
            if total <= SEAL_CHUNK:
                for v in views:
                    mac.update(v)
                parts = [joined, *views, mac.digest()[:TAG]]
                if total <= _JOIN_LIMIT:
                    self._sock.sendall(b"".join(parts))
                else:
                    _sendmsg_all(self._sock, parts)
                return
            # Large: each piece is hashed just before it is sent, while it is in the cache and
            # while the kernel sends the one before (the peer hashes each as it arrives).
            self._sock.sendall(joined + mac.copy().digest()[:TAG])
            for v in views:
                for at in range(0, v.nbytes, SEAL_CHUNK):
                    piece = v[at : at + SEAL_CHUNK]
                    mac.update(piece)
                    self._sock.sendall(piece)
            self._sock.sendall(mac.digest()[:TAG])


def _sendmsg_all(sock: socket.socket, parts: list[bytes | bytearray | memoryview]) -> None:
    views = [memoryview(p).cast("B") for p in parts if memoryview(p).nbytes]
    while views:
        sent = sock.sendmsg(views[:512])
        while sent:
            first = views[0]
            if sent >= first.nbytes:
                sent -= first.nbytes
                views.pop(0)
            else:
                views[0] = first[sent:]
                sent = 0


# A reader's place for a large buffer (see FrameReader): given the frame's kind and the
# buffer's size, a writable view to receive it into and the reference to hand on instead of
# the bytes, or None to keep it in memory. ``abort`` gives the place back when the frame is cut.
Reserve = Callable[[int, int], "tuple[memoryview, bytes] | None"]
SPILLED = 2  # serialize.BUF_SPILLED: the buffer's data is a shared-memory reference


class FrameReader:
    """Reads frames from a socket. Not thread-safe: one reader thread per socket.

    With ``reserve`` (an agent serving a remote client), a large plain buffer is received
    straight into the shared-memory segment it names, and the frame carries the segment's
    reference: the worker maps it instead of reading the bytes from another socket."""

    def __init__(self, sock: socket.socket, reserve: Reserve | None = None,
                 abort: Callable[[bytes], None] | None = None) -> None:
        self._sock = sock
        self._reserve, self._abort = reserve, abort
        self._buf = bytearray(_FIRST_CHUNK)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._seal: _Seal | None = None

    def seal(self, key: bytes) -> None:
        """From the next frame on, accept only frames whose MACs under ``key`` are right."""
        self._seal = _Seal(key)

    def read(self) -> Frame:
        """Return the next frame; raises EOFError when the peer closed the connection (and
        ``Tampered`` on a sealed link when the frame is not the peer's next one)."""
        if self._seal is not None:
            return self._read_sealed(self._seal)
        start = self._start
        if self._end - start >= HEADER.size:  # fast path: a whole small frame is buffered
            kind, flags, nbufs, task_id, body_len = HEADER.unpack_from(self._buf, start)
            end = start + HEADER.size + body_len
            if not nbufs and end <= self._end:
                self._start = end
                return Frame(kind, task_id, bytes(self._view[start + HEADER.size : end]), flags, [])
        head = self._take(HEADER.size, small=True)
        kind, flags, nbufs, task_id, body_len = HEADER.unpack(head)
        lengths = []
        if nbufs:
            raw = self._take(BUFLEN.size * nbufs, small=True)
            lengths = [BUFLEN.unpack_from(raw, i * BUFLEN.size)[0] for i in range(nbufs)]
        body = self._take(body_len)
        buffers: list[tuple[int, bytes | bytearray | memoryview]] = []
        for n in lengths:
            bflags, size = n >> FLAG_SHIFT, n & LENGTH_MASK
            place = self._reserve(kind, size) if self._reserve is not None and not bflags else None
            if place is not None:
                view, ref = place
                try:
                    self._take_into(view)
                except BaseException:
                    if self._abort is not None:
                        self._abort(ref)
                    raise
                finally:
                    view.release()
                buffers.append((SPILLED, ref))
                continue
            # Buffers always come back as bytearrays so that arrays rebuilt on them are writable.
            buffers.append((bflags, self._take(size, writable=True)))
        return Frame(kind, task_id, body, flags, buffers)

    def _read_sealed(self, seal: _Seal) -> Frame:
        head = self._take(HEADER.size, small=True)
        kind, flags, nbufs, task_id, body_len = HEADER.unpack(head)
        raw = self._take(BUFLEN.size * nbufs, small=True) if nbufs else b""
        mac = seal.start(bytes(head) + bytes(raw))
        lengths = [BUFLEN.unpack_from(raw, i * BUFLEN.size)[0] for i in range(nbufs)]
        if body_len + sum(n & LENGTH_MASK for n in lengths) > SEAL_CHUNK and not seal.compare(
                self._take(TAG, small=True), mac.copy().digest()[:TAG]):
            raise Tampered(f"a frame's header failed its MAC (frame {seal.seq - 1} of this link): "
                           f"someone between the two ends wrote, replayed or reordered it")
        # From here a large frame's lengths are the peer's own: what they allocate, it sent.
        body = self._take_hashed(body_len, mac)
        buffers: list[tuple[int, bytes | bytearray | memoryview]] = []
        spilled: list[bytes] = []
        try:
            for n in lengths:
                bflags, size = n >> FLAG_SHIFT, n & LENGTH_MASK
                place = self._reserve(kind, size) if self._reserve is not None and not bflags else None
                if place is not None:
                    view, ref = place
                    spilled.append(ref)
                    try:
                        self._fill_hashed(view, mac)
                    finally:
                        view.release()
                    buffers.append((SPILLED, ref))
                    continue
                buffers.append((bflags, self._take_hashed(size, mac, writable=True)))
            if not seal.compare(self._take(TAG, small=True), mac.digest()[:TAG]):
                raise Tampered(f"a frame failed its MAC (frame {seal.seq - 1} of this link): someone "
                               f"between the two ends changed it")
        except BaseException:
            if self._abort is not None:
                for ref in spilled:
                    self._abort(ref)
            raise
        return Frame(kind, task_id, body, flags, buffers)

    def _take_hashed(self, n: int, mac: Any, writable: bool = False) -> bytes | bytearray:
        """``_take`` on a sealed link: the bytes fed to ``mac`` as well, a piece at a time as
        they arrive when they are many."""
        if n <= SEAL_CHUNK:
            data = self._take(n, writable=writable)
            mac.update(data)
            return data
        out = bytearray(n)
        view = memoryview(out)
        try:
            self._fill_hashed(view, mac)
        finally:
            view.release()
        return out

    def _fill_hashed(self, out: memoryview, mac: Any) -> None:
        for at in range(0, out.nbytes, SEAL_CHUNK):
            piece = out[at : at + SEAL_CHUNK]
            self._take_into(piece)
            mac.update(piece)

    def buffered(self) -> bool:
        """Whether bytes of a next frame are already here (a select on the socket would miss them)."""
        return self._end > self._start

    def _take_into(self, out: memoryview) -> None:
        """Fill ``out`` from what is buffered, then straight from the socket."""
        n = out.nbytes
        avail = min(self._end - self._start, n)
        out[:avail] = self._view[self._start : self._start + avail]
        self._start += avail
        got = avail
        while got < n:
            r = self._sock.recv_into(out[got:], n - got)
            if not r:
                raise EOFError("connection closed in the middle of a frame")
            got += r

    def _take(self, n: int, small: bool = False, writable: bool = False) -> bytes | bytearray:
        avail = self._end - self._start
        if n <= avail:
            out = self._buf[self._start : self._start + n] if writable else bytes(
                self._view[self._start : self._start + n]
            )
            self._start += n
            return out
        if n > _READ_CHUNK // 2 and not small:
            # Large part: receive straight into its own bytearray, no intermediate copy.
            out = bytearray(n)
            mv = memoryview(out)
            mv[:avail] = self._view[self._start : self._end]
            self._start = self._end = 0
            got = avail
            while got < n:
                r = self._sock.recv_into(mv[got:], n - got)
                if not r:
                    raise EOFError("connection closed in the middle of a frame")
                got += r
            return out
        # Small part: compact, then fill the buffer until it holds n bytes.
        if self._start:
            self._view[: avail] = self._view[self._start : self._end]
            self._start, self._end = 0, avail
        if n > len(self._buf):
            self._grow(n)
        while self._end < n:
            r = self._sock.recv_into(self._view[self._end :])
            if not r:
                if self._end == 0:
                    raise EOFError("connection closed")
                raise EOFError("connection closed in the middle of a frame")
            self._end += r
        if self._end == len(self._buf) < _READ_CHUNK:  # the read filled it: more is coming
            self._grow(min(4 * len(self._buf), _READ_CHUNK))
        return self._take(n, small, writable)

    def _grow(self, size: int) -> None:
        self._view.release()
        self._buf.extend(bytes(size - len(self._buf)))
        self._view = memoryview(self._buf)


def tune(sock: socket.socket) -> None:
    """Small frames must not wait for Nagle; large ones want big kernel buffers."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 * 1024 * 1024)
        except OSError:
            pass
