"""The client's end of the multiplexer (bootstrap/mux.py, which says why and the wire): ``Mux``
over the exec channel that runs it on the first host, a ``MuxLink`` per node's link, and
``batch()``, which sends what a thread writes to many links in one write."""

from __future__ import annotations

import collections
import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from skyward.bootstrap.mux import (
    ACK,
    ACK_SIZE,
    CLOSE,
    DATA,
    EOF,
    HEADER,
    HELLO,
    OPEN,
    OPENED,
    REFUSED,
    SEND_CHUNK,
    WINDOW,
)

OUT_HIGH = 4 << 20  # bytes queued for the channel: past this, a sender waits its turn
_PACKET = 32768  # the largest SSH packet of the client's channels (remote.py)
_JOIN = 1 << 16  # frames under this size are joined into one write


class MuxUnavailable(OSError):
    """The first host could not run the multiplexer (an older skyward there, or no Python):
    links go through a channel each, as before."""


_local = threading.local()  # muxes that hold frames of this thread's batch()


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Frames this thread sends to links in the block leave together at its end: one write per
    multiplexer, a few full SSH packets, where a frame each would be a packet each (a CONFIGURE
    to every node, a task sent to all of them). Other links' streams are not affected."""
    if getattr(_local, "muxes", None) is not None:  # (nested: the outer block sends)
        yield
        return
    held: list[Mux] = []
    # Only links opened before the block wait: a link opened inside it has a handshake to make,
    # whose answer would never come while its first frame waited here.
    _local.since = time.monotonic()
    _local.muxes = held
    try:
        yield
    finally:
        _local.muxes = None
        for mux in held:
            try:
                mux._flush()
            except OSError:  # (the connection ended: its links see it)
                pass


class Mux:
    """The client's end: ``open(host, port)`` is a link (socket-like, as a channel's
    ChannelSocket is) to that address as the first host sees it. ``stream``: a socket-like
    stream to ``serve`` (an exec channel's standard input and output).

    A frame is written by the thread that sends it, with whatever other threads queued while
    it held the channel (they do not wait: the writer takes theirs too); within a ``batch()``
    a thread's frames wait for the block's end. A small frame is copied into the queue, so its
    sender may reuse its buffer at once; a large piece is written from the sender's buffer,
    straight after its header, before the sender goes on."""

    def __init__(self, stream: Any, label: str = "") -> None:
        self._stream, self.label = stream, label or "the first host"
        self._links: dict[int, MuxLink] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._queue: list[bytes] = []
        self._queued = 0
        self._queue_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._hello = threading.Event()
        self.ended: BaseException | None = None
        self._thread = threading.Thread(target=self._read, name="skyward-mux", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self.ended is None

    def open(self, host: str, port: int, timeout: float = 30.0) -> MuxLink:
        link = MuxLink(self, next(self._ids))
        with self._lock:
            if self.ended is not None:
                raise self._why_ended()
            self._links[link.id] = link
        address = f"{host} {port}".encode()
        try:
            self._send(HEADER.pack(link.id, OPEN, len(address)) + address)
        except OSError:
            pass  # (the reader sees the stream end and answers the open)
        if not link._opened.wait(timeout):
            link.close()
            raise TimeoutError(f"{host}:{port} did not answer {self.label} within {timeout:g} s")
        if link._refused is not None:
            with self._lock:
                self._links.pop(link.id, None)
            if self.ended is not None:
                raise self._why_ended()
            raise ConnectionRefusedError(f"{self.label} could not connect to {host}:{port}: "
                                         f"{link._refused}")
        return link

    def close(self) -> None:
        """Write what is queued (the links' last frames), then close the stream: the program on
        the first host reads the end of its input and exits."""
        try:
            self._flush()
        except OSError:
            pass
        self._stream.close()

    def _why_ended(self) -> OSError:
        if not self._hello.is_set():
            return MuxUnavailable(f"the multiplexer did not start on {self.label}")
        return ConnectionResetError(f"the connection through {self.label} ended")

    def _send(self, frame: bytes, large: memoryview | None = None, born: float | None = None) -> None:
        """Send ``frame`` (and straight after it ``large``, the sender's own buffer). ``born``:
        when the frame's link was opened (its frames may wait for the end of a ``batch()``)."""
        if self.ended is not None:
            raise BrokenPipeError(32, f"the connection through {self.label} ended")
        if large is not None:
            with self._write_lock:  # (the queue first, then this frame: nothing between its parts)
                self._write_queued()
                # The header with the start of the piece: SSH packets of 32 KiB each, not one
                # of 9 bytes before them.
                head = _PACKET - len(frame)
                self._stream.sendall(frame + large[:head])
                self._stream.sendall(large[head:])
            self._after_write()
            return
        with self._queue_lock:
            self._queue.append(frame)
            self._queued += len(frame)
            over = self._queued > OUT_HIGH
        held = getattr(_local, "muxes", None)
        if held is not None and not over and born is not None and born < _local.since:
            if self not in held:
                held.append(self)
            return
        if over:  # (the channel is slower than the links: this one waits its turn)
            self._write_lock.acquire()
        elif not self._write_lock.acquire(blocking=False):
            return  # the thread writing takes this frame too (it looks again once it lets go)
        try:
            self._write_queued()
        finally:
            self._write_lock.release()
        self._after_write()

    def _flush(self) -> None:
        with self._write_lock:
            self._write_queued()
        self._after_write()

    def _after_write(self) -> None:
        # A frame queued while this thread wrote, after it last looked, and whose sender found
        # the lock held: written here, unless another thread has the lock (and then it will).
        while self._queue and self._write_lock.acquire(blocking=False):
            try:
                self._write_queued()
            finally:
                self._write_lock.release()

    def _write_queued(self) -> None:
        """Write everything queued (call with the write lock held), joined into writes of up to
        SEND_CHUNK bytes."""
        while True:
            with self._queue_lock:
                frames, self._queue, self._queued = self._queue, [], 0
            if not frames:
                return
            try:
                if len(frames) == 1:
                    self._stream.sendall(frames[0])
                    continue
                chunk: list[bytes] = []
                size = 0
                for frame in frames:
                    chunk.append(frame)
                    size += len(frame)
                    if size >= SEND_CHUNK:
                        self._stream.sendall(b"".join(chunk))
                        chunk, size = [], 0
                if chunk:
                    self._stream.sendall(b"".join(chunk))
            except OSError:  # the channel failed: the reader sees it end, and every link with it
                try:
                    self._stream.close()
                except OSError:
                    pass
                raise

    def _forget(self, link: MuxLink) -> None:
        with self._lock:
            known = self._links.pop(link.id, None) is not None
        if known and self.ended is None:
            try:
                self._send(HEADER.pack(link.id, CLOSE, 0))
            except OSError:
                pass

    def _frames(self, view: memoryview, copy: bool) -> int:
        """Hand the whole frames in ``view`` to their links; how many bytes they took."""
        links = self._links
        at, size = 0, view.nbytes
        while size - at >= HEADER.size:
            link_id, op, n = HEADER.unpack_from(view, at)
            if size - at - HEADER.size < n:
                break
            start = at + HEADER.size
            link = links.get(link_id)
            if link is not None:
                if op == DATA:
                    link._feed(bytes(view[start : start + n]) if copy else view[start : start + n])
                elif op == EOF:
                    link._feed(b"")
                elif op == ACK:
                    link._taken(ACK_SIZE.unpack_from(view, start)[0])
                elif op == OPENED:
                    link._opened.set()
                elif op == REFUSED:
                    link._refused = bytes(view[start : start + n]).decode(errors="replace")
                    link._opened.set()
            at = start + n
        return at

    def _read(self) -> None:
        stream = self._stream
        buf = bytearray()
        why: BaseException = EOFError("the multiplexer's stream ended")
        try:
            while len(buf) < len(HELLO):
                data = stream.recv(len(HELLO) - len(buf))
                if not data:
                    return
                buf += data
            if bytes(buf) != HELLO:
                why = MuxUnavailable(f"the multiplexer did not start: {bytes(buf)!r}")
                return
            self._hello.set()
            del buf[:]
            while data := stream.recv(1 << 18):
                if buf:  # (the rest of a frame that began in an earlier read)
                    buf += data
                    with memoryview(buf) as view:
                        at = self._frames(view, copy=True)
                    del buf[:at]
                else:  # whole frames straight from what was read (bytes: their views stay valid)
                    at = self._frames(memoryview(data), copy=False)
                    buf += memoryview(data)[at:]
        except BaseException as exc:  # (the channel failed: every link ends)
            why = exc
        finally:
            with self._lock:
                self.ended = why
                links_left = list(self._links.values())
                self._links.clear()
            for link in links_left:
                if link._refused is None and not link._opened.is_set():
                    link._refused = str(why)
                link._opened.set()
                link._feed(b"")


class MuxLink:
    """One link of a Mux: the bits of the socket API the frame reader and writer use."""

    family = None  # not TCP: frames.tune() leaves it alone

    def __init__(self, mux: Mux, link_id: int) -> None:
        self._mux, self.id = mux, link_id
        self._cond = threading.Condition(threading.Lock())
        self._chunks: collections.deque[bytes | memoryview] = collections.deque()
        self._at = 0  # bytes of the first chunk already read
        self._eof = False
        self._timeout: float | None = None
        self._closed = self._sent_eof = False
        self._opened = threading.Event()
        self._refused: str | None = None
        self._window = WINDOW  # bytes this link may still send before its agent takes some
        self._born = time.monotonic()

    def _taken(self, n: int) -> None:
        with self._cond:
            self._window += n
            self._cond.notify_all()

    def _feed(self, data: bytes | memoryview) -> None:
        with self._cond:
            if data:
                self._chunks.append(data)
            else:
                self._eof = True
            self._cond.notify_all()

    def _wait(self) -> None:
        if not (self._chunks or self._eof or self._cond.wait_for(lambda: self._chunks or self._eof, self._timeout)):
            raise TimeoutError("timed out")

    def recv_into(self, buf: Any, nbytes: int = 0) -> int:
        view = memoryview(buf).cast("B")
        want = nbytes or view.nbytes
        got = 0
        with self._cond:
            self._wait()
            while got < want and self._chunks:
                chunk = self._chunks[0]
                take = min(want - got, len(chunk) - self._at)
                view[got : got + take] = chunk[self._at : self._at + take]
                got += take
                self._at += take
                if self._at == len(chunk):
                    self._chunks.popleft()
                    self._at = 0
        return got

    def recv(self, n: int, flags: int = 0) -> bytes:
        if flags & socket.MSG_PEEK:
            with self._cond:
                self._wait()
                return bytes(self._chunks[0][self._at : self._at + n]) if self._chunks else b""
        buf = bytearray(n)
        got = self.recv_into(buf, n)
        return bytes(buf[:got])

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed or self._sent_eof or self._mux.ended is not None:
            raise BrokenPipeError(32, "the link through the first host was closed")
        view = memoryview(data).cast("B")
        for at in range(0, view.nbytes, SEND_CHUNK):
            piece = view[at : at + SEND_CHUNK]
            with self._cond:  # the link's window: its agent has taken all but WINDOW bytes
                while self._window < piece.nbytes and not (self._closed or self._eof):
                    if not self._cond.wait(self._timeout):
                        raise TimeoutError("timed out")
                if self._closed or self._mux.ended is not None:
                    raise BrokenPipeError(32, "the link through the first host was closed")
                self._window -= piece.nbytes
            header = HEADER.pack(self.id, DATA, piece.nbytes)
            if piece.nbytes < _JOIN:
                self._mux._send(header + piece, born=self._born)  # (a copy: the buffer may be reused at once)
            else:
                self._mux._send(header, piece)

    def sendmsg(self, parts: list[Any]) -> int:
        views = [memoryview(p).cast("B") for p in parts]
        total = sum(v.nbytes for v in views)
        if total < _JOIN:
            self.sendall(b"".join(views))
        else:
            for v in views:
                self.sendall(v)
        return total

    def settimeout(self, value: float | None) -> None:
        self._timeout = value

    def setsockopt(self, *args: Any) -> None:
        pass

    def shutdown(self, how: int) -> None:
        if how in (socket.SHUT_WR, socket.SHUT_RDWR) and not self._sent_eof and not self._closed:
            self._sent_eof = True
            try:
                self._mux._send(HEADER.pack(self.id, EOF, 0))
            except OSError:
                pass
        if how in (socket.SHUT_RD, socket.SHUT_RDWR):
            self._feed(b"")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._mux._forget(self)
        self._feed(b"")
