"""The lane: a client on the node's own host sends plain tasks straight to the worker.

Through the agent a task crosses two sockets each way (client -> agent -> worker); on a
2-core machine that relay is a fifth of a no-op call. A thread-executor node whose worker can
take it (one worker process, reused, not started by a plugin launcher) gets a Unix-socket
listener from its agent; the agent tells its clients where (a LANE frame), and a client on the
same host connects there, proves the pool's lane key (handshake.py; the worker proves it back)
and writes TASK and MAP frames to the worker
itself, as many as the node takes at once (``capacity``). Everything else keeps going through
the agent: streaming tasks, tasks beyond that capacity (the agent queues them and can cancel
them), nested work, collections, configuration and the lease.

The worker reads the lane and its agent's socket with the same leader/followers slots, so the
node still runs at most its thread count of tasks. When the worker exits, the agent sends the
error its tasks end with (LANE_LOST) and then the replacement's lane (LANE); the client fails
the lane's tasks with that error once it has read everything the worker sent before it went.

Task ids: a lane's frames carry the client's own ids; inside the worker a lane task's id has
``LANE_BIT`` and the lane's number added, so they never meet the agent's ids.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import select
import socket
import struct
import threading
from collections.abc import Callable

from .frames import Frame, FrameReader, FrameWriter, Kind, tune
from .handshake import HELLO_MAX, LANE, Gate, Refused, admit, derive, prove, read_welcome

LANE_BIT = 1 << 63
_NO_SHIFT = 40
TID_MASK = (1 << _NO_SHIFT) - 1
_NO_MASK = (1 << (63 - _NO_SHIFT)) - 1


class LaneCount:
    """How many lane tasks a worker is running, in 8 bytes of memory that it shares with its
    agent: the agent never sees those tasks, yet `skyward status` counts them."""

    _VALUE = struct.Struct("q")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._mm = mmap.mmap(fd, self._VALUE.size)

    @classmethod
    def create(cls) -> LaneCount | None:
        """A new counter (its fd goes to the worker), or None where memfd is missing."""
        if not hasattr(os, "memfd_create"):
            return None
        fd = os.memfd_create("skyward-lane-count", os.MFD_CLOEXEC)
        os.ftruncate(fd, cls._VALUE.size)
        return cls(fd)

    def get(self) -> int:
        return int(self._VALUE.unpack_from(self._mm, 0)[0])

    def set(self, value: int) -> None:
        self._VALUE.pack_into(self._mm, 0, value)

    def close(self) -> None:
        self._mm.close()
        os.close(self.fd)


class _Lane:
    __slots__ = ("no", "reader", "sock", "writer")

    def __init__(self, no: int, sock: socket.socket, reader: FrameReader, writer: FrameWriter) -> None:
        self.no, self.sock, self.reader, self.writer = no, sock, reader, writer


class WorkerLanes:
    """The worker's end: admits lane connections and reads them beside the agent's socket."""

    def __init__(self, listener: socket.socket, key: bytes, count: LaneCount | None = None) -> None:
        self._listener, self._key = listener, key
        self._gate = Gate(limit=4)  # connections in their handshake at once
        self._count, self._running = count, 0
        self._lanes: dict[int, _Lane] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        # A reader waiting in poll() learns of a new lane through this pipe.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        threading.Thread(target=self._accept, name="skyward-lane-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            if not self._gate.enter():
                sock.close()
                continue
            threading.Thread(target=self._admit, args=(sock,), name="skyward-lane-admit", daemon=True).start()

    def _admit(self, sock: socket.socket) -> None:
        try:  # no reader (256 KiB) and no lane number before the peer proved the key
            _, proof = admit(sock, self._key)
            lane = _Lane(next(self._ids), sock, FrameReader(sock), FrameWriter(sock))
            lane.writer.send_parts(Kind.WELCOME, 0, 0, json.dumps(
                {"lane": lane.no, "pid": os.getpid(), "proof": proof}).encode())
            tune(sock)
        except (Refused, OSError):
            sock.close()
            return
        finally:
            self._gate.leave()
        with self._lock:
            self._lanes[lane.no] = lane
        os.write(self._wake_w, b"x")

    def next_frame(self, reader: FrameReader, sock: socket.socket) -> Frame:
        """The next frame from the agent (``reader`` on ``sock``) or from any lane; a lane's
        task comes with its worker-side id. Call holding the worker's read lock. Raises
        EOFError when the agent's socket closes; a lane that closes is forgotten."""
        while True:
            if reader.buffered():
                return reader.read()
            with self._lock:
                lanes = list(self._lanes.values())
            for lane in lanes:
                if lane.reader.buffered():
                    frame = self._read(lane)
                    if frame is not None:
                        return frame
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            by_fd = {}
            for lane in lanes:
                by_fd[lane.sock.fileno()] = lane
                poller.register(lane.sock, select.POLLIN)
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            if sock.fileno() in ready:
                return reader.read()
            for fd, lane in by_fd.items():
                if fd in ready:
                    frame = self._read(lane)
                    if frame is not None:
                        return frame

    def _read(self, lane: _Lane) -> Frame | None:
        """One frame from a lane: a task or a CANCEL (its id made the worker's), or None
        (anything else, or the client closed the lane)."""
        try:
            frame = lane.reader.read()
        except (EOFError, OSError):
            with self._lock:
                self._lanes.pop(lane.no, None)
            lane.sock.close()
            return None
        if frame.kind not in (Kind.TASK, Kind.MAP, Kind.CANCEL):
            return None  # nothing else travels on a lane (CANCEL: a task sent by it)
        frame.task_id = LANE_BIT | (lane.no << _NO_SHIFT) | (frame.task_id & TID_MASK)
        return frame

    def waiting(self) -> bool:
        """Whether a lane has a frame to read (nothing is read)."""
        with self._lock:
            lanes = list(self._lanes.values())
        if any(lane.reader.buffered() for lane in lanes):
            return True
        return bool(lanes) and bool(select.select([lane.sock for lane in lanes], [], [], 0)[0])

    def running(self, delta: int) -> None:
        """A lane task started (+1) or ended (-1); call with the worker's lock held."""
        self._running += delta
        if self._count is not None:
            self._count.set(self._running)

    def writer_for(self, tid: int) -> tuple[FrameWriter, int] | None:
        """Where a lane task's frames go, with the client's id; None when its lane closed."""
        lane = self._lanes.get((tid >> _NO_SHIFT) & _NO_MASK)
        return None if lane is None else (lane.writer, tid & TID_MASK)


class ClientLane:
    """The client's end: a connection to a node's worker for plain tasks (see NodeChannel)."""

    def __init__(self, path: str, token: str, capacity: int, timeout: float = 5.0) -> None:
        """Connect to the lane at ``path``; ``token`` is the pool's secret (its lane key is
        derived here). Raises OSError when the worker is gone or does not prove the key."""
        self.path, self.capacity = path, capacity
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            try:  # the WELCOME by hand and capped: nothing unproven is read beyond a few KiB
                check = prove(sock, derive(token, LANE), {}, timeout)
                facts, _ = read_welcome(sock, "the worker", timeout, HELLO_MAX)
            except Refused as exc:
                raise OSError(str(exc)) from None
            if not check(facts):
                raise OSError(f"the lane at {path} did not prove the pool's key")
            self.reader, self.writer = FrameReader(sock), FrameWriter(sock)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        tune(sock)
        self.sock = sock
        self.tids: set[int] = set()  # the client's ids of the tasks out on this lane
        # Set by LANE_LOST: the error (a RESULT frame) that tasks still out on this lane end with.
        self.lost: Frame | None = None
        self.told = threading.Event()

    def start(self, loop: Callable[[ClientLane], None], name: str) -> None:
        self.thread = threading.Thread(target=loop, args=(self,), name=name, daemon=True)
        self.thread.start()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
