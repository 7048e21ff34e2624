"""The client's end of one node: a single multiplexed connection to the node's agent.

Any thread may submit; one reader thread per channel completes tasks by id. The socket may be
a plain loopback TCP socket (Local) or anything socket-like that a transport hands over.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward.errors import (
    NodeLostError,
    PoolStoppedError,
    ProtocolError,
    SkywardError,
    WorkerDiedError,
)

from . import serialize
from .frames import (
    FLAG_STREAM_IN,
    FLAG_STREAM_OUT,
    Frame,
    FrameReader,
    FrameWriter,
    Kind,
    Tampered,
    tune,
)
from .handshake import AGENT, Check, Refused, TurnedAway, derive, prove, read_welcome
from .lane import ClientLane

log = logging.getLogger("skyward")
Done = Callable[[Frame | BaseException], None]
OnOutput = Callable[[int, int, int, bytes], None]  # node, task id, stream, text


class NodeChannel:
    def __init__(
        self,
        sock: socket.socket | Callable[[], socket.socket],
        *,
        node: int,
        token: str,
        ttl: float,
        on_output: OnOutput,
        on_lost: Callable[[int, BaseException], None] | None = None,
        on_metric: Callable[[int, list[dict[str, Any]]], None] | None = None,
        on_submit: Callable[[NodeChannel, Frame], None] | None = None,
        on_stopping: Callable[[int, str], None] | None = None,
        label: str = "",
        agent_id: str = "",
    ) -> None:
        self.node = node
        self.label = label or f"node {node}"
        # ``sock`` may be how to connect (endpoint.connect): a handshake turned away is retried.
        connect = sock if callable(sock) else None
        sock = connect() if connect is not None else sock
        assert not callable(sock)
        self._sock = sock
        sock.settimeout(None)  # connect timeouts must not turn into idle timeouts
        tune(sock)
        # Every byte received counts as a sign of life (a large result can take a while).
        self.heard = time.monotonic()
        self._reader = FrameReader(_Listening(sock, self))  # type: ignore[arg-type]
        self._ping_at: float | None = None  # when the oldest unanswered PING was sent
        self._writer = FrameWriter(sock)
        self._on_output = on_output
        self._on_lost = on_lost
        self._on_metric = on_metric
        self._on_submit = on_submit
        self._on_stopping = on_stopping
        self.stopped: str | None = None  # why the pool was stopped from outside (STOPPING)
        self._pending: dict[int, Done] = {}
        self._streams: dict[int, Callable[[Frame], None]] = {}  # task id -> YIELD/PULL handler
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.lost: BaseException | None = None
        self._closing = False
        # The lane (lane.py): where the node's worker takes plain tasks directly, once the
        # agent has said so (LANE); opened at the first task that may use it.
        self._token = token
        self._lane_offer: dict[str, Any] | None = None
        self._lane: ClientLane | None = None
        self._lanes: list[ClientLane] = []  # every lane not yet drained (LANE_LOST reaches them)
        self._lane_lock = threading.Lock()
        # From a CONFIGURE until the agent's answering LANE: the worker must read the new
        # configuration (it comes through the agent) before any task sent by the lane.
        self._lane_held = False
        # Both ends prove the pool's key (handshake.py); the secret itself never crosses.
        # The WELCOME is read by hand and capped (handshake.read_welcome): an impostor's claim of
        # a huge body is refused before a byte of it is read, let alone its proof checked.
        try:
            sock, check, self.facts, welcome = _handshake(self, sock, connect, derive(token, AGENT), ttl)
        except Refused as exc:
            raise ProtocolError(
                f"what answers for {self.label} did not start skyward's handshake ({exc}): it is "
                f"not this pool's agent, or an agent of another skyward version. Check the agent "
                f"log on that node; a named pool made by an older version is stopped with "
                f"`skyward down NAME` and made again with `skyward up`."
            ) from exc
        except (EOFError, OSError) as exc:
            raise ProtocolError(
                f"the agent on {self.label} closed the connection during the handshake ({exc}): "
                f"it refused this pool's token, or it turned the connection away before the "
                f"handshake was done (busy or flooded). Check the agent log on that node."
            ) from exc
        if not check(self.facts):
            raise ProtocolError(
                f"what answers for {self.label} did not prove that it holds this pool's key: it is "
                f"not the pool's agent (another process may have taken its address). Nothing was "
                f"sent to it; the pool treats the node as lost."
            )
        if agent_id and self.facts.get("id") != agent_id:
            with contextlib.suppress(OSError):
                self._sock.close()
            # Another agent of this pool (it proved the key): a relay between the two sent this
            # connection to another node. On a sealed link a relay that rewrote the fact instead
            # would fail the first frame (the WELCOME's body is under the session keys).
            raise ProtocolError(
                f"what answers for {self.label} is another agent of this pool (agent "
                f"{str(self.facts.get('id'))[:24]!r}, not {agent_id!r}, which this node's start-up "
                f"line named): something between this machine and the node sends the connection "
                f"elsewhere. Nothing was sent to it; the pool treats the node as lost."
            )
        # A link that no SSH carries is sealed (frames.py): the agent's proof says so for its
        # direct listener (under the key: a relay cannot make it say otherwise), and a client
        # on plain TCP to another host insists on it.
        if check.sealed:
            send, receive = check.keys(welcome)
            self._writer.seal(send)
            self._reader.seal(receive)
        elif _off_host_tcp(sock):
            raise ProtocolError(
                f"the agent on {self.label} answers over plain TCP without authenticating its "
                f"frames (an agent of another skyward version, or someone between the two changed "
                f"its WELCOME); nothing was sent to it."
            )
        self._answers_pings = bool(self.facts.get("pong"))  # agents of older versions do not
        # On a sealed link the WELCOME's facts are proven only by the first frame from the agent
        # that passes its MAC (the body is under the session keys): until then whoever is in
        # between may have changed them. Callers that act on a fact wait (``when_proven``); a
        # PING makes the agent send that frame at once.
        self._unproven: list[Callable[[], None]] | None = [] if check.sealed else None
        self._thread = threading.Thread(target=self._read_loop, name=f"skyward-{self.label}", daemon=True)
        self._thread.start()
        if check.sealed:
            self.send(Kind.PING)

    def when_proven(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the WELCOME's facts (``facts``) are proven: now on a link nobody
        can be between (an SSH channel, a Unix socket, loopback), else on the reader's thread
        when the first frame from the agent passes its MAC; never if none does (the node is lost)."""
        with self._lock:
            if self._unproven is not None:
                self._unproven.append(fn)
                return
        fn()

    def _proven(self) -> None:
        with self._lock:
            waiting, self._unproven = self._unproven or [], None
        for fn in waiting:
            try:
                fn()
            except Exception:  # a caller's bug must not lose the node
                log.exception("%s: a check of the agent's facts failed", self.label)

    @property
    def inflight(self) -> int:
        return len(self._pending)

    def holds(self, tid: int) -> bool:
        """Whether task ``tid`` still waits for its outcome here (a RESULT, or the node's loss)."""
        return tid in self._pending

    @property
    def lane(self) -> str | None:
        """Where this node's worker takes plain tasks straight from here (lane.py), once a
        task has opened it; None while they go through the agent."""
        lane = self._lane
        return lane.path if lane is not None else None

    def submit(self, kind: int, flags: int, body: Any, buffers: list[Any], done: Done,
               on_frame: Callable[[Frame], None] | None = None, queue: bool = False) -> int:
        """Send a request; ``done`` gets its RESULT. ``on_frame`` gets the task's YIELD and
        PULL frames (streaming) until then. ``queue``: the task may wait at the worker, on its
        lane, beyond the node's capacity (map's chunks, whose window bounds how many; nothing
        cancels them); otherwise tasks beyond it wait at the agent."""
        tid = next(self._ids)
        lane = self._lane_for(kind, flags, queue) if on_frame is None else None
        with self._lock:
            if self.lost is not None:
                serialize.discard(buffers)
                raise self._lost_error()
            self._pending[tid] = done
            if on_frame is not None:
                self._streams[tid] = on_frame
            if lane is not None:
                lane.tids.add(tid)
        # Exactly one outcome per task: once ``done`` is in ``_pending``, whoever pops it (a
        # RESULT, the lane's end, the node's loss) owns the outcome. A send that fails after
        # another thread already popped it (the node was lost meanwhile and ``done`` has its
        # error) returns normally; raising too would give the caller a second outcome (map
        # counted the chunk twice and then waited forever for a result nobody would send).
        if lane is not None:
            try:
                lane.writer.send_parts(kind, tid, flags, body, buffers)
                return tid
            except (OSError, EOFError):  # the worker went: the agent has it (and starts a new one)
                with self._lock:
                    lane.tids.discard(tid)
                    if tid not in self._pending:
                        return tid  # the lane's end (or the node's loss) gave it its outcome
        try:
            self._writer.send_parts(kind, tid, flags, body, buffers)
        except BaseException as exc:
            with self._lock:
                mine = self._pending.pop(tid, None) is not None
                self._streams.pop(tid, None)
            serialize.discard(buffers)
            if not mine:  # failed by the node's loss meanwhile: ``done`` has that error
                return tid
            if not isinstance(exc, (OSError, EOFError)):
                raise  # not sent (a frame the writer refused): the caller's error, not the node's
            self._mark_lost(exc)
            raise self._lost_error() from exc
        return tid

    def _lane_for(self, kind: int, flags: int, queue: bool = False) -> ClientLane | None:
        """The lane a task goes by, or None (the agent's way): plain tasks and map chunks, while
        fewer than the node's capacity are out on it (any number with ``queue``)."""
        if kind not in (Kind.TASK, Kind.MAP) or flags & (FLAG_STREAM_OUT | FLAG_STREAM_IN) or self._lane_held:
            return None
        lane = self._lane
        if lane is None:
            if self._lane_offer is None:
                return None
            lane = self._open_lane()
            if lane is None:
                return None
        return lane if queue or len(lane.tids) < lane.capacity else None

    def _open_lane(self) -> ClientLane | None:
        with self._lane_lock:
            offer = self._lane_offer
            if self._lane is not None or offer is None:
                return self._lane
            try:
                lane = ClientLane(str(offer["path"]), self._token, int(offer["capacity"]))
            except (OSError, EOFError, ValueError, KeyError):
                self._lane_offer = None  # not reachable from here: the agent's way it is
                return None
            with self._lock:
                if self.lost is not None or self._closing:
                    lane.close()
                    return None
                self._lanes.append(lane)
            lane.start(self._lane_loop, f"skyward-{self.label}-lane")
            self._lane = lane
            return lane

    def _lane_loop(self, lane: ClientLane) -> None:
        """Read a lane until it closes; then end the tasks still out on it, with the error the
        agent sent (LANE_LOST) once it has, or a lost node's."""
        try:
            while True:
                frame = lane.reader.read()
                if frame.kind == Kind.RESULT:
                    with self._lock:
                        lane.tids.discard(frame.task_id)
                    self._complete(frame)
                elif frame.kind == Kind.OUTPUT:
                    self._on_output(self.node, frame.task_id, frame.flags, bytes(frame.body))
        except (EOFError, OSError):
            pass
        with self._lane_lock:
            if self._lane is lane:
                self._lane = None
        lane.close()
        if lane.tids and self.lost is None and not self._closing and self.stopped is None:
            lane.told.wait(5.0)  # the agent saw the worker exit: its LANE_LOST says how
        with self._lock:
            if lane in self._lanes:
                self._lanes.remove(lane)
            left = [done for done in (self._pending.pop(t, None) for t in lane.tids) if done is not None]
            lane.tids.clear()
        for done in left:
            if lane.lost is not None:
                done(lane.lost)
            elif self.lost is not None or self._closing or self.stopped is not None:
                done(self._lost_error())
            else:
                done(WorkerDiedError(
                    f"the worker process on {self.label} closed its direct connection before "
                    f"returning a result, and its agent did not say why. Retry the task; the "
                    f"agent log on that node tells what happened."
                ))

    def send(self, kind: int, body: bytes = b"") -> None:
        try:
            self._writer.send_parts(kind, 0, 0, body)
        except OSError as exc:
            self._mark_lost(exc)

    def configure(self, config: dict[str, Any] | bytes) -> None:
        """Send the node its configuration: a dict, or its JSON already encoded."""
        self._lane_held = True
        self.send(Kind.CONFIGURE, config if isinstance(config, bytes) else json.dumps(config).encode())

    def reply(self, agent_tid: int, flags: int, body: Any, buffers: list[Any]) -> None:
        """Answer a nested SUBMIT from this node (see frames.Kind.SUBMIT)."""
        try:
            self._writer.send_parts(Kind.REPLY, agent_tid, flags, body, buffers)
        except OSError as exc:
            serialize.discard(buffers)
            self._mark_lost(exc)

    def cancel(self, tid: int) -> None:
        """Stop task ``tid``: the agent drops it if it waits for a slot, the worker interrupts
        it if it runs (or replaces its slot); either way it ends with TaskCancelledError, once
        its slot is free. A task sent by the lane is cancelled there, where the worker reads."""
        with self._lock:
            if tid not in self._pending:
                return  # it has answered already
            lane = next((lane for lane in self._lanes if tid in lane.tids), None)
        if lane is not None:
            try:
                lane.writer.send_parts(Kind.CANCEL, tid, 0, b"")
            except OSError:
                pass  # the lane closed: the task ends with its worker's error
            return
        self.send_tid(Kind.CANCEL, tid)

    def send_tid(self, kind: int, tid: int, body: bytes = b"", flags: int = 0, buffers: list[Any] = ()) -> None:  # type: ignore[assignment]
        try:
            self._writer.send_parts(kind, tid, flags, body, buffers)
        except OSError as exc:
            self._mark_lost(exc)

    def ping(self) -> None:
        if self._ping_at is None:
            self._ping_at = time.monotonic()
        self.send(Kind.PING)

    def check_silence(self, limit: float) -> bool:
        """Mark the node lost when a PING has gone unanswered and nothing at all has arrived
        for ``limit`` seconds: a host that vanished without closing its connections (a network
        cut, a spot instance powered off) sends no FIN, and TCP alone would wait many minutes.
        Returns True when it did."""
        sent = self._ping_at
        if not self._answers_pings or sent is None or self.lost is not None or self._closing:
            return False
        silent = time.monotonic() - max(sent, self.heard)
        if silent <= limit:
            return False
        self._mark_lost(TimeoutError(f"no answer from its agent for {silent:.0f} s"))
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # unblock the reader thread
        except OSError:
            pass
        self._sock.close()
        return True

    def close(self, shutdown_agent: bool = False) -> None:
        self._closing = True
        if shutdown_agent and self.lost is None:
            self.send(Kind.SHUTDOWN)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lane_lock:
            self._lane, self._lane_offer = None, None
        lanes = self._wake_lanes(close=True)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        for lane in lanes:
            if threading.current_thread() is not lane.thread:
                lane.thread.join(timeout=5)

    def _read_loop(self) -> None:
        try:
            while True:
                frame = self._reader.read()
                if self._unproven is not None:
                    self._proven()
                if frame.kind == Kind.RESULT:
                    self._complete(frame)
                elif frame.kind in (Kind.YIELD, Kind.PULL):
                    handler = self._streams.get(frame.task_id)
                    if handler is not None:
                        handler(frame)
                elif frame.kind == Kind.OUTPUT:
                    self._on_output(self.node, frame.task_id, frame.flags, bytes(frame.body))
                elif frame.kind == Kind.METRIC and self._on_metric is not None:
                    # A list: the samples of one tick (an agent of an older skyward: one sample)
                    samples = json.loads(bytes(frame.body))
                    self._on_metric(self.node, samples if isinstance(samples, list) else [samples])
                elif frame.kind == Kind.SUBMIT and self._on_submit is not None:
                    self._on_submit(self, frame)
                elif frame.kind == Kind.PONG:
                    self._ping_at = None
                elif frame.kind == Kind.LANE:
                    offer = json.loads(bytes(frame.body))
                    with self._lane_lock:
                        if self._lane is not None and self._lane.path != offer.get("path"):
                            self._lane = None  # the old worker's: it drains and closes
                        self._lane_offer = offer if offer.get("path") and not self._closing else None
                        self._lane_held = False  # the worker has read the configuration before it
                elif frame.kind == Kind.LANE_LOST:
                    self._wake_lanes(lost=Frame(Kind.RESULT, 0, frame.body, frame.flags, frame.buffers))
                elif frame.kind == Kind.STOPPING:
                    self.stopped = str(json.loads(bytes(frame.body)).get("message") or "the pool was stopped")
                    self._wake_lanes()  # their tasks end with PoolStoppedError, told or not
                    if self._on_stopping is not None:
                        self._on_stopping(self.node, self.stopped)
        except (EOFError, OSError) as exc:
            self._mark_lost(exc)

    def _wake_lanes(self, lost: Frame | None = None, close: bool = False) -> list[ClientLane]:
        """Tell the lanes not drained yet that the agent will say nothing more of their tasks
        (``lost``: the error those end with; ``close``: close the lanes too); returns them."""
        with self._lock:
            lanes = list(self._lanes)
        for lane in lanes:
            if lost is not None:
                lane.lost = lost
            lane.told.set()
            if close:
                lane.close()
        return lanes

    def _complete(self, frame: Frame) -> None:
        with self._lock:
            done = self._pending.pop(frame.task_id, None)
            if self._streams:
                self._streams.pop(frame.task_id, None)
        if done is not None:
            # Not kept by this frame's reader until the next result: the callback's future
            # holds the value, and a large one (a shared-memory segment) must go when the
            # caller drops it.
            done(frame)

    def _lost_error(self) -> SkywardError:
        if self.stopped is not None:  # not lost: stopped on purpose, and we were told
            return PoolStoppedError(self.stopped)
        if isinstance(self.lost, Tampered):  # the agent is fine: the link was not
            return NodeLostError(
                f"the connection to the agent on {self.label} was closed: {self.lost}. Someone on the "
                f"network between this machine and the node is changing the traffic; nothing they "
                f"wrote was used. Tasks that were running there did not return a result."
            )
        return NodeLostError(
            f"the connection to the agent on {self.label} was lost ({self.lost}); the node or its "
            f"agent stopped. Tasks that were running there did not return a result."
        )

    def _mark_lost(self, exc: BaseException) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.lost = exc if not self._closing else ConnectionAbortedError("pool closed")
            pending = list(self._pending.values())
            self._pending.clear()
            self._streams.clear()
        self._lane_offer = self._lane = None
        self._wake_lanes(close=True)  # their tasks end here, with the node's error
        err = self._lost_error()
        for done in pending:
            done(err)
        if not self._closing and self.stopped is None and self._on_lost is not None:
            self._on_lost(self.node, exc)


# A handshake turned away (the agent's gate full, or this pending one closed for a newer one)
# is tried again after these pauses (each with up to half again at random): about 9 s in all.
_RETRY_PAUSES = (0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0)


def _handshake(ch: NodeChannel, sock: Any, connect: Callable[[], Any] | None, key: bytes,
               ttl: float) -> tuple[Any, Check, dict[str, Any], bytes]:
    """Prove the key and read the WELCOME (not yet checked): the socket it happened on, the
    check, the WELCOME's facts and its body as received. With ``connect``, a connection closed before the WELCOME (the agent
    was busy, or strangers flood its listener) is made again, with backoff; a last refusal
    before the challenge says so (ProtocolError)."""
    import random

    pauses = iter(_RETRY_PAUSES if connect is not None else ())
    while True:
        try:
            check = prove(sock, key, {"ttl": ttl})
            facts, welcome = read_welcome(sock, ch.label, 60.0)
            return sock, check, facts, welcome
        except (TurnedAway, EOFError, OSError) as exc:
            pause = next(pauses, None)
            if pause is None or connect is None:
                if isinstance(exc, TurnedAway):
                    raise ProtocolError(
                        f"the agent on {ch.label} refused the connection before the handshake (busy "
                        f"or flooded: every one of its handshake slots was taken"
                        f"{', at each try' if connect is not None else ''}). Another process on that "
                        f"node or its network may be holding connections open; retry, and check "
                        f"the agent log on that node."
                    ) from exc
                raise
        try:
            sock.close()
        except OSError:
            pass
        time.sleep(pause * (1 + random.random() / 2))
        sock = connect()
        sock.settimeout(None)
        tune(sock)
        ch._sock = sock
        ch._reader = FrameReader(_Listening(sock, ch))  # type: ignore[arg-type]
        ch._writer = FrameWriter(sock)


def _off_host_tcp(sock: Any) -> bool:
    """Whether ``sock`` is TCP to another host (not an SSH channel, a Unix socket or loopback)."""
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    import ipaddress

    try:
        ip = ipaddress.ip_address(sock.getpeername()[0].split("%")[0])
    except (OSError, ValueError):
        return True
    mapped = getattr(ip, "ipv4_mapped", None)
    return not (ip.is_loopback or (mapped is not None and mapped.is_loopback))


class _Listening:
    """The socket as the frame reader sees it, noting when bytes last arrived."""

    def __init__(self, sock: Any, channel: NodeChannel) -> None:
        self._sock, self._channel = sock, channel

    def recv_into(self, buf: Any, nbytes: int = 0) -> int:
        n = int(self._sock.recv_into(buf, nbytes))
        self._channel.heard = time.monotonic()
        return n
