"""The node agent: one per node, the only long-lived skyward process there.

It listens on a Unix socket in the node's 0700 folder (a Local node's, or, with ``--socket``,
an SSH, cloud or Slurm node's, which the client reaches through sshd's streamlocal forwarding or
a relay: no other user of the node can connect at all), or else on 127.0.0.1, and admits a
client only after both proved the pool's secret (handshake.py). Tasks arrive as frames on that
one connection and are relayed, unopened, to worker processes, which the agent's supervisor
(supervisor.py) starts, watches and replaces (a task that kills its process gets an error, the
node keeps serving); the agent serves the connections, holds the lease and routes the frames.
It holds a lease from the client: when nobody has renewed it for ``ttl`` seconds, the agent
stops its workers and exits, so a crashed or killed client leaves nothing behind.

Plugins come with the first CONFIGURE (cloudpickled, base64): the agent forwards them to its
workers, and the supervisor applies their launcher hooks to the worker command. A launched
worker (``accelerate launch``...) may be several processes; each connects back to the agent on
a Unix socket instead of inheriting one. A task that submits work to the pool (nested dispatch)
sends a SUBMIT frame, which the agent relays to the client that sent the task; while it waits,
the task's slot is lent to other tasks.

One JSON line on stdout tells whoever started the agent where it listens: ``{"port": 41234,
"pid": 1234}`` (``{"unix": PATH, ...}`` with ``--unix``; ``{"error": ...}`` when it cannot). The
pool's secret comes in the environment, never on argv.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from . import serialize, shm, versions
from .frames import (
    FLAG_STREAM_IN,
    FLAG_STREAM_OUT,
    NESTED,
    Frame,
    FrameReader,
    FrameWriter,
    Kind,
    Tampered,
    tune,
)
from .handshake import AGENT, COLLECTIONS, LANE, LEASE_MAX, LEASE_MIN, Gate, Refused, admit, derive
from .listeners import close as _close
from .listeners import unlink as _unlink
from .supervisor import Supervisor, WorkerProc, exit_causes, exit_reason, terminated

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROTOCOL = 2  # 2: the challenge-response handshake (handshake.py)
# How long a worker stopped by a SIGTERM from outside waits for the agent's own (the whole node
# stopping) before its tasks are told it crashed: signals to a job's processes land together.
_NODE_STOP_GRACE = 1.0


def _log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), "agent:", msg, file=sys.stderr, flush=True)


# Plain classes, not dataclasses: importing dataclasses (and inspect with it) would be a
# fifth of the agent's start-up, which every Local node pays on the way to its first task.
class Conn:
    __slots__ = ("open", "sock", "writer")

    def __init__(self, sock: socket.socket, writer: FrameWriter) -> None:
        self.sock, self.writer = sock, writer
        self.open = True


class Route:
    __slots__ = ("client_tid", "conn", "nested", "spilled", "worker")

    def __init__(self, conn: Conn, client_tid: int, spilled: list[tuple[int, Any]] | None = None) -> None:
        self.conn, self.client_tid = conn, client_tid
        self.worker: WorkerProc | None = None
        self.nested = 0  # nested submissions of this task that await their REPLY
        # The task's shared-memory buffers: given back if its worker dies before it lets them go.
        self.spilled = spilled if spilled is not None else []


def lease_ttl(value: object) -> float | None:
    """The lease a HELLO asks for (its ``ttl``): None when it asks for none (the agent keeps its
    own), else seconds, 0 or from ``LEASE_MIN`` to ``LEASE_MAX``. Raises ``Refused`` for anything
    else: a ttl of 0.01 would stop the agent at once, and a negative or NaN one (JSON says NaN
    too) would stop its lease for ever."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            value == 0 or LEASE_MIN <= value <= LEASE_MAX):  # NaN compares false: refused
        raise Refused(f"the HELLO's ttl {value!r:.40} is not a lease: seconds, 0 (none) or from "
                      f"{LEASE_MIN:g} to {LEASE_MAX:g}")
    return float(value)


class Agent:
    def __init__(self, token: str, ttl: float, orphan_cleanup: list[str] | None = None, identity: str = "") -> None:
        # Keys, not the secret: what a worker gets (lane, collections) opens no agent.
        self.key = derive(token, AGENT)
        self.lane_key = derive(token, LANE).hex()
        self.state_key = derive(token, COLLECTIONS)
        # Connections still in their handshake, few at once: a gate per listener (serve), so a
        # flood of one (the direct TCP listener) leaves the others open (workers a plugin
        # launcher started have theirs: supervisor.py).
        self.gate = Gate(per_source=16)  # the Unix socket's (one user) or the loopback port's
        # This node's shared-memory folder, for pools whose client is on another host (made
        # at the first CONFIGURE without a pool-wide one): large buffers from the client are
        # received straight into segments there and mapped by the workers, and the workers'
        # large results reach the agent the same way.
        self.node_spill: Path | None = None
        self.ttl = ttl
        self.identity = identity  # who this agent is (agent_start makes it; its WELCOME says it)
        self.orphan_cleanup = orphan_cleanup or []
        self.orphaned = False
        self.lock = threading.RLock()
        self.conns: list[Conn] = []
        self.pending: collections.deque[tuple[int, Route, Frame]] = collections.deque()
        self.routes: dict[int, Route] = {}
        self.tids = itertools.count(1)
        self.renewed = time.monotonic()
        self.stopping = threading.Event()
        # The worker processes: started, kept spare, launched, retired, watched (supervisor.py).
        self.supervisor = Supervisor(self, self.lock, self.stopping)
        self.config: dict[str, Any] | None = None
        self.settings: dict[str, Any] = {}
        self.collector: Any = None
        self._metric_batch: list[dict[str, Any]] = []  # (the collector thread's)
        self.metric_specs: list[dict[str, Any]] = []  # sampled once the first CONFIGURE is answered
        # agent id -> (worker, the worker's id, the submitting task's route) for nested SUBMITs
        self.nested: dict[int, tuple[WorkerProc, int, Route | None]] = {}
        self.state: Any = None  # the pool's collections (state.StateServer), on the head node
        # (id(connection), client's task id) -> agent task id, for streaming tasks: CREDIT, STOP
        # and FEED frames from the client name the task by the client's id.
        self.streaming: dict[tuple[int, int], int] = {}
        # The folder of the agent's Unix socket on a node reached over SSH (--socket): the
        # collections' socket for this node's own workers goes there too (state.py).
        self.socket_dir: str | None = None
        self.sealed_at: set[tuple[str, int]] = set()  # the direct listeners' addresses (see serve)

    @property
    def lane_dir(self) -> str | None:
        """Where workers' lane listeners go (lane.py), and the collections' socket for this
        node's workers: beside the agent's own Unix socket, when it has one (a Local node: its
        clients are on this host)."""
        return self.supervisor.lane_dir

    @lane_dir.setter
    def lane_dir(self, folder: str | None) -> None:
        self.supervisor.lane_dir = folder

    @property
    def workers(self) -> list[WorkerProc]:
        """The node's workers (the supervisor's list: change it only through the supervisor)."""
        return self.supervisor.workers

    # -- lifecycle ---------------------------------------------------------------------------
    def serve(self, listener: socket.socket, *more: socket.socket) -> None:
        """Serve clients on ``listener`` (loopback, or the node's Unix socket) and ``more`` (the
        direct listener on the node's private address, ``--direct``): the same handshake on each,
        and the direct one's links sealed after it (frames.py: no SSH carries them)."""
        self.sealed_at = {sock.getsockname()[:2] for sock in more}
        for sock in (listener, *more):
            gate = self.gate if sock is listener else Gate()  # (TCP: a share per address)
            threading.Thread(target=self._accept, args=(sock, gate), daemon=True).start()
        threading.Thread(target=self._lease_watchdog, daemon=True).start()
        self.stopping.wait()
        for sock in (listener, *more):
            sock.close()
        with self.lock:
            collector = self.collector
        if collector is not None:
            collector.stop()
        self.supervisor.stop()
        import shutil  # (here: shutil costs every node's start 4 ms)

        with self.lock:
            for c in self.conns:
                _close(c.sock)
        if self.node_spill is not None:
            shm.forget(self.node_spill)
            shutil.rmtree(self.node_spill, ignore_errors=True)
        if self.orphaned:
            for path in self.orphan_cleanup:
                _unmount_volumes(path)  # sky.Volume: a pool folder's mounts go before the folder
                shutil.rmtree(path, ignore_errors=True)

    def shutdown(self, why: str) -> None:
        if not self.stopping.is_set():
            _log(f"shutting down: {why}")
            self.stopping.set()

    def _lease_watchdog(self) -> None:
        while not self.stopping.wait(0.25):
            if self.ttl > 0 and time.monotonic() - self.renewed > self.ttl:
                self.orphaned = True
                self.shutdown(f"no client renewed the lease for {self.ttl:g} s (ttl)")

    # -- client connections ------------------------------------------------------------------
    def _accept(self, listener: socket.socket, gate: Gate) -> None:
        while not self.stopping.is_set():
            try:
                sock, peer = listener.accept()
            except OSError:
                return
            # A flood of strangers: no thread, no memory for them (a full gate closes its
            # oldest silent handshake for this one, or this one if all are recent).
            if not gate.enter(sock, peer):
                self._refused(sock, "too many connections in their handshake", gate)
                continue
            threading.Thread(target=self._serve_conn, args=(sock, gate), daemon=True).start()

    def _refused(self, sock: socket.socket, why: str, gate: Gate | None = None) -> None:
        # The reason is in the log before the peer sees the close (CI read the log once the
        # client had its EOF and found nothing yet).
        line = (gate or self.gate).refused(why)
        if line is not None:
            _log(line)
        _close(sock)

    def _remote_spill(self) -> Path | None:
        """The node's shared-memory folder when the client is on another host (no pool-wide
        folder in the configuration), else None."""
        config = self.config
        if config is None or config.get("spill") or self.node_spill is None:
            return None
        return self.node_spill

    def _reserve(self, kind: int, n: int) -> tuple[memoryview, bytes] | None:
        """Where a client's large buffer is received (FrameReader): a segment of the node's
        folder, for frames that go to a worker."""
        if n < serialize.SPILL_MIN or kind not in _TO_WORKERS:
            return None
        spill = self._remote_spill()
        return shm.reserve(spill, n) if spill is not None else None

    def _serve_conn(self, sock: socket.socket, gate: Gate) -> None:
        try:  # nothing of ours (reader, shared memory, a Conn) exists until the peer proved the key
            info, proof = admit(sock, self.key, gate=gate)
            lease = lease_ttl(info.get("ttl"))
        except (Refused, OSError) as exc:
            self._refused(sock, str(exc), gate)
            return
        finally:
            gate.leave(sock)
        tune(sock)
        reader, writer = FrameReader(sock, self._reserve, shm.release), FrameWriter(sock)
        sealed = sock.family != socket.AF_UNIX and sock.getsockname()[:2] in self.sealed_at
        conn = Conn(sock, writer)
        with self.lock:
            self.renewed = time.monotonic()
            # What this node is doing for every client (`skyward status` shows it).
            running = sum(len(w.inflight) + (w.lane_count.get() if w.lane_count else 0) for w in self.workers)
            queued = len(self.pending)
            clients = len(self.conns) + 1  # (this one joins them once its WELCOME is sent)
        welcome = {
            # this agent holds the pool's key too: the client may send it tasks (and, on a
            # sealed link, it says so under the key: see handshake.Proof.sealing)
            "proof": proof.sealing() if sealed else proof,
            "protocol": PROTOCOL,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "id": self.identity,  # as the start-up line said (agent_start): which agent this is
            "python": sys.version.split()[0],
            "cwd": os.getcwd(),
            "tasks": running + queued,
            "running": running,
            "queued": queued,
            "clients": clients,
            "pong": True,  # answers PING: the client may treat a silent node as lost
            "packages": versions.installed(),  # the client names the ones that differ from its own
            "sealed": sealed,  # every later frame carries MACs under the session's keys
        }
        body = json.dumps(welcome).encode()
        try:
            if sealed:
                send, receive = proof.keys(body)
                writer.seal(send, Frame(Kind.WELCOME, 0, body))
                reader.seal(receive)
            else:
                writer.send_parts(Kind.WELCOME, 0, 0, body)
            # Only now do the frames to every client (METRIC, STOPPING) reach this one: one sent
            # before its WELCOME would be taken for a stranger's answer to the handshake.
            with self.lock:
                self.conns.append(conn)
            while True:
                frame = reader.read()
                if lease is not None:
                    # The HELLO's lease, taken only now: on a sealed link the first frame's MAC
                    # is what proves the HELLO (its body is under the session keys), and a relay
                    # that changed the ttl got the connection dropped before this.
                    self.ttl, lease = lease, None
                self.renewed = time.monotonic()
                if frame.kind in (Kind.TASK, Kind.MAP):
                    self._submit(conn, frame)
                elif frame.kind == Kind.REPLY:
                    self._nested_reply(frame)
                elif frame.kind == Kind.CANCEL:
                    self._cancel(conn, frame.task_id)
                elif frame.kind == Kind.CONFIGURE:
                    self._configure(json.loads(bytes(frame.body)))
                    self._offer_lane(conn)
                    self._start_metrics()
                elif frame.kind == Kind.PING:
                    writer.send_parts(Kind.PONG, 0, 0, b"")
                elif frame.kind == Kind.STATE:
                    self._state().handle_client(id(conn), writer, frame)
                elif frame.kind in (Kind.CREDIT, Kind.STOP, Kind.FEED):
                    self._to_streaming_task(conn, frame)
                elif frame.kind == Kind.HEALTH:
                    threading.Thread(target=self._health, args=(conn, frame), daemon=True).start()
                elif frame.kind == Kind.SHUTDOWN:
                    if frame.body:  # `skyward down`: the other clients are told why
                        self._stopped_from_outside(conn, bytes(frame.body))
                    self.shutdown("the client asked")
                    return
        except Tampered as exc:  # someone between the client and us: say so, drop the connection
            _log(f"dropped a client's connection: {exc}")
        except (EOFError, OSError):
            pass
        finally:
            conn.open = False
            _close(sock)
            if self.state is not None:
                self.state.client_gone(id(conn))
            with self.lock:
                if conn in self.conns:
                    self.conns.remove(conn)

    # -- configuration -----------------------------------------------------------------------
    def _configure(self, config: dict[str, Any]) -> None:
        with self.lock:
            first = self.config is None
            self.config = config
            if first:
                if not config.get("spill"):
                    self.node_spill = _node_spill_dir()
                self.settings = config["worker"]
                self.supervisor.start(self.settings, config["topology"], config.get("plugins"))
                # Started once the client has its answer (_serve_conn): the sampler's imports
                # cost the first task 20 ms of a node's CPU when they come before it.
                self.metric_specs = config.get("metrics") or []
            else:  # topology changed (resize): tell every live worker
                for w in self.workers:
                    self.send_config(w)
            if self.state is not None:  # the collections serve the pool's nodes first
                self.state.trust(config.get("topology"))
            sends = self._assign()  # tasks that arrived before the first CONFIGURE
        self._send(sends)

    def _start_metrics(self) -> None:
        """Start sampling the configured metrics (once, on a thread of its own)."""
        with self.lock:
            specs, self.metric_specs = self.metric_specs, []
        if specs and not self.stopping.is_set():
            threading.Thread(target=self._sample, args=(specs,), name="skyward-metrics", daemon=True).start()

    def _sample(self, specs: list[dict[str, Any]]) -> None:
        from .metrics import Collector, node_specs

        collector = Collector(node_specs(specs), self._emit_metric, self._send_metrics)
        with self.lock:  # serve() reads it under the lock once stopping is set
            if self.stopping.is_set():
                return
            collector.start()
            self.collector = collector

    def _emit_metric(self, name: str, value: float, unit: str) -> None:
        """One sample, kept until the collector's tick is over (on its thread: no lock)."""
        self._metric_batch.append({"name": name, "value": value, "unit": unit})

    def _send_metrics(self) -> None:
        """The samples of one tick in one frame, a JSON list (one frame per sample was the
        client's CPU per node per second: four frames a second on a GPU node)."""
        batch, self._metric_batch = self._metric_batch, []
        if batch:
            self._broadcast(Frame(Kind.METRIC, 0, json.dumps(batch).encode()))

    def _topology_for(self, index: int) -> dict[str, Any]:
        assert self.config is not None
        return {
            **self.config["topology"],
            "worker": index,
            "workers_per_node": self.settings["processes"],
            "slots_per_node": self.settings["capacity"] * self.settings["processes"],
        }

    def send_config(self, w: WorkerProc) -> None:
        """A worker's CONFIGURE: what it runs, where, and with which plugins (a new worker's
        first frame; again when the pool's topology changes)."""
        assert self.config is not None
        spill = self.config.get("spill") or (str(self.node_spill) if self.node_spill is not None else None)
        body = json.dumps({
            "threads": self.settings["threads"],  # a spare worker learns them here (prestart)
            "exclusive": self.settings["exclusive"],
            "topology": self._topology_for(w.index),
            "spill": spill,
            "local": bool(self.config.get("spill")),  # the pool's folder: a Local pool, its client on this host
            "plugins": self.config.get("plugins"),
            "state": self._state_for_workers(),
            "lane": {"key": self.lane_key} if w.lane else None,
        }).encode()
        try:
            w.writer.send_parts(Kind.CONFIGURE, 0, 0, body)
        except OSError:
            pass

    # -- distributed collections (state.py) ---------------------------------------------------
    def _state(self) -> Any:
        with self.lock:
            if self.state is None:
                from .state import StateServer

                self.state = StateServer(self.state_key, self._log_to_clients, unix_dir=self.lane_dir,
                                         local_dir=self.socket_dir)
                if self.config is not None:
                    self.state.trust(self.config.get("topology"))
            return self.state

    def _log_to_clients(self, text: str) -> None:
        _log(text)
        self._broadcast(Frame(Kind.OUTPUT, 0, (text + "\n").encode(), 2))

    def _state_for_workers(self) -> dict[str, Any] | None:
        """Where workers reach the collection server, with its key (never on argv; not the
        agents' key)."""
        assert self.config is not None
        where = self.config.get("state")
        if not where or "error" in where:
            return where
        # A node of another group than the head's gets the head's key (``key``: its agent has
        # another secret, the server another key).
        where = dict(where)
        return {**where, "token": where.pop("key", None) or self.state_key.hex()}

    def prestart(self, ours: list[socket.socket] | None = None) -> None:
        """Start the node's spare worker before serving anyone (Supervisor.prestart; ``ours``:
        the listeners a forked worker closes)."""
        self.supervisor.prestart(ours)

    # -- health checks (sky.HealthChecker) -------------------------------------------------------
    def _health(self, conn: Conn, frame: Frame) -> None:
        """Run the pool's health check in this process, beside the workers: a node whose slots
        are all busy still answers. The client judges the value and the time it took."""
        try:
            from skyward.runtime import context
            from skyward.runtime.info import InstanceInfo

            fn = serialize.loads_frame(frame)
            with self.lock:
                topology = self._topology_for(0) if self.config is not None else None
            if topology is not None:
                context.configure(topology)  # instance_info() works inside the check too
            info = InstanceInfo.model_validate(topology) if topology is not None else None
            flags, body, buffers = serialize.dumps_ok(fn(info), "health check")
        except BaseException as exc:
            flags, body, buffers = serialize.dumps_error(exc)
        self._reply(Route(conn, frame.task_id), Frame(Kind.RESULT, 0, body, flags, buffers))

    # -- tasks -------------------------------------------------------------------------------
    def _submit(self, conn: Conn, frame: Frame) -> None:
        route = Route(conn, frame.task_id, spilled=[b for b in frame.buffers if b[0] & serialize.BUF_SPILLED])
        with self.lock:
            tid = next(self.tids)
            self.routes[tid] = route
            if frame.flags & (FLAG_STREAM_OUT | FLAG_STREAM_IN):
                self.streaming[(id(conn), frame.task_id)] = tid
            self.pending.append((tid, route, frame))
            sends = self._assign()
        self._send(sends)

    def _assign(self) -> list[tuple[WorkerProc, int, Frame]]:
        """Hand pending tasks to workers with a free slot (call with the lock held)."""
        sends = []
        while self.pending:
            free = [w for w in self.workers if not w.retiring and len(w.inflight) < w.capacity + w.lent]
            if not free:
                break
            w = min(free, key=lambda w: len(w.inflight))
            tid, route, frame = self.pending.popleft()
            route.worker = w
            w.inflight[tid] = route
            sends.append((w, tid, frame))
        return sends

    def _send(self, sends: list[tuple[WorkerProc, int, Frame]]) -> None:
        for w, tid, frame in sends:
            try:
                w.writer.send_parts(frame.kind, tid, frame.flags, frame.body, frame.buffers)
            except OSError:
                pass  # the worker died; its reader thread reports the task as failed

    def from_worker(self, w: WorkerProc, frame: Frame) -> None:
        """A frame from worker ``w`` (on its watcher's thread, supervisor.py): a result, output,
        nested work or a streaming task's values, each to where it goes."""
        if frame.kind == Kind.RESULT:
            with self.lock:
                route = self.routes.pop(frame.task_id, None)
                w.inflight.pop(frame.task_id, None)
                if self.streaming and route is not None:
                    self.streaming.pop((id(route.conn), route.client_tid), None)
                if not self.settings.get("reuse", True) and not w.retiring:
                    self.supervisor.retire(w)
                sends = self._assign()
            if route is not None:
                self._reply(route, frame)
            self._send(sends)
        elif frame.kind == Kind.OUTPUT:
            route = self.routes.get(frame.task_id) if frame.task_id else None
            if route is not None:
                self._reply(route, frame)
            else:
                self._broadcast(frame)
        elif frame.kind == Kind.SUBMIT:
            self._relay_nested(w, frame)
        elif frame.kind in (Kind.YIELD, Kind.PULL):  # a streaming task's values, its feed requests
            route = self.routes.get(frame.task_id)
            if route is not None:
                self._reply(route, frame)

    def worker_joined(self) -> None:
        """A worker a plugin launcher started is configured: it takes what waits."""
        with self.lock:
            sends = self._assign()
        self._send(sends)

    def output(self, line: bytes, stream: int) -> None:
        """What a worker process writes to its fds (C code, subprocesses): node output."""
        self._broadcast(Frame(Kind.OUTPUT, 0, line, stream))

    # -- nested dispatch ---------------------------------------------------------------------
    def _relay_nested(self, w: WorkerProc, frame: Frame) -> None:
        """A task on worker ``w`` submits work to the pool: pass it to the client that sent
        the task, and lend the task's slot while it waits."""
        parent_tid, _ = NESTED.unpack_from(frame.body, 0)
        with self.lock:
            route = self.routes.get(parent_tid)
            conn = route.conn if route is not None and route.conn.open else next(
                (c for c in self.conns if c.open), None)
            aid = next(self.tids)
            if conn is not None:
                self.nested[aid] = (w, frame.task_id, route)
                if route is not None:
                    route.nested += 1
                    if route.nested == 1:
                        w.lent += 1
            sends = self._assign()
        if conn is None:
            from skyward.errors import NoActivePoolError

            err = NoActivePoolError("no client is connected to this node; nested work cannot be dispatched")
            flags, body, buffers = serialize.dumps_error(err, tb_text="")
            self._to_worker(w, Frame(Kind.REPLY, frame.task_id, body, flags, buffers))
            return
        self._reply(Route(conn, aid), frame)
        self._send(sends)

    def _nested_reply(self, frame: Frame) -> None:
        with self.lock:
            entry = self.nested.pop(frame.task_id, None)
            if entry is None:
                return
            w, nid, route = entry
            if route is not None:
                route.nested -= 1
                if route.nested == 0:
                    w.lent = max(0, w.lent - 1)
        self._to_worker(w, Frame(Kind.REPLY, nid, frame.body, frame.flags, frame.buffers))

    def _to_streaming_task(self, conn: Conn, frame: Frame) -> None:
        """CREDIT / STOP / FEED from the client for one of its streaming tasks."""
        with self.lock:
            tid = self.streaming.get((id(conn), frame.task_id))
            route = self.routes.get(tid) if tid is not None else None
            w = route.worker if route is not None else None
        if w is None or tid is None:
            if frame.kind == Kind.STOP:  # the consumer gave up before the task started
                self._cancel(conn, frame.task_id)
            return
        self._to_worker(w, Frame(frame.kind, tid, frame.body, frame.flags, frame.buffers))

    def _to_worker(self, w: WorkerProc, frame: Frame) -> None:
        try:
            w.writer.send_parts(frame.kind, frame.task_id, frame.flags, frame.body, frame.buffers)
        except OSError:
            pass

    def _cancel(self, conn: Conn, client_tid: int) -> None:
        """Drop a task that still waits for a slot (it answers with an error at once), or pass
        the CANCEL to the worker running it (which stops it and answers once its slot is free)."""
        with self.lock:
            found = None
            for item in self.pending:
                if item[1].conn is conn and item[1].client_tid == client_tid:
                    found = item
                    break
            if found is None:
                running = next(((tid, r.worker) for tid, r in self.routes.items()
                                if r.conn is conn and r.client_tid == client_tid and r.worker is not None), None)
                if running is not None:
                    self._to_worker(running[1], Frame(Kind.CANCEL, running[0], b""))
                return
            self.pending.remove(found)
            self.routes.pop(found[0], None)
        serialize.discard(found[2].buffers)
        from skyward.errors import TaskCancelledError

        err = TaskCancelledError("the task was cancelled before it started (its caller gave up on it: joblib aborted the call)")
        flags, body, buffers = serialize.dumps_error(err, tb_text="")
        self._reply(found[1], Frame(Kind.RESULT, 0, body, flags, buffers))

    def worker_exited(self, w: WorkerProc, rc: int) -> None:
        """Worker ``w`` has exited (supervisor.py): its tasks end with WorkerDiedError, and
        its lane's clients hear of it.

        A SIGTERM the agent did not send most likely stops the whole node (scancel signals
        every process of the job, systemd every process of its unit), and the agent's own
        may land a moment after the worker's: it waits that moment. When the node is stopping,
        the tasks end with it (their client sees the node lost, with its provider's reason)
        rather than as a crash on a node that "keeps serving"."""
        if terminated(rc) and not w.retiring and not w.launched:
            self.stopping.wait(_NODE_STOP_GRACE)
        with self.lock:
            lost = list(w.inflight.items())
            w.inflight.clear()
            for tid, _ in lost:
                self.routes.pop(tid, None)
            for aid in [a for a, (nw, _, _) in self.nested.items() if nw is w]:
                del self.nested[aid]
            replace = self.supervisor.exited(w)  # a fresh one in its place, unless it was meant to go
            stopping = self.stopping.is_set()
            sends = self._assign()
            spill = self.config.get("spill") if self.config is not None else None
            # Its lane's clients hear of it unless the agent is stopping it (they are leaving too).
            told = w.lane is not None and replace
            offer = self._lane_offer() if told else None
            count, w.lane_count = w.lane_count, None
        _unlink(w.lane)
        if count is not None:
            count.close()
        if spill and not w.launched:  # its shared-memory segments nobody holds
            shm.sweep(Path(spill), w.proc.pid)
        for _, route in lost:
            serialize.discard(route.spilled)  # the dead worker's views of them are gone
        if stopping:  # the connections close next: their clients see the node lost, not a crash
            lost = []
        if lost or told:
            from skyward.errors import WorkerDiedError

            how = exit_reason(rc)
            err = WorkerDiedError(
                f"the worker process running this task on {socket.gethostname()} {how} before "
                f"returning a result ({exit_causes(rc)}). A fresh worker process replaced it and "
                f"the node keeps serving; retry the task, or look for what ends the process."
            )
            flags, body, buffers = serialize.dumps_error(err, tb_text="")
            for _, route in lost:
                self._reply(route, Frame(Kind.RESULT, 0, body, flags, buffers))
            if told:  # the tasks the clients sent it directly end the same way
                self._broadcast(Frame(Kind.LANE_LOST, 0, body, flags))
                if offer is not None:
                    self._broadcast(offer)
        self._send(sends)

    def _offer_lane(self, conn: Conn) -> None:
        """Tell a client where this node's worker takes tasks directly (lane.py), if it does."""
        with self.lock:
            offer = self._lane_offer()
        if offer is not None:
            self._reply(Route(conn, 0), offer)

    def _lane_offer(self) -> Frame | None:
        """The LANE frame for the node's worker (call with the lock held)."""
        live = [w for w in self.workers if not w.retiring]
        if len(live) != 1 or live[0].lane is None:
            return None
        w = live[0]
        return Frame(Kind.LANE, 0, json.dumps({"path": w.lane, "capacity": w.capacity}).encode())

    def _stopped_from_outside(self, by: Conn, body: bytes) -> None:
        """SHUTDOWN with a reason (JSON ``{"message": ...}``) from a command stopping the pool:
        every other client hears it (STOPPING), and every task in flight ends with
        PoolStoppedError carrying it, instead of looking like a crash when the workers stop."""
        try:
            message = str(json.loads(body).get("message") or "the pool was stopped")
        except (ValueError, AttributeError):
            message = "the pool was stopped"
        with self.lock:
            routes = list(self.routes.values())
            self.routes.clear()
            for w in self.workers:
                w.inflight.clear()
            pending, self.pending = list(self.pending), collections.deque()
            others = [c for c in self.conns if c is not by]
        for _, _, frame in pending:
            serialize.discard(frame.buffers)
        from skyward.errors import PoolStoppedError

        _log(f"stopping: {message}")
        for c in others:
            self._reply(Route(c, 0), Frame(Kind.STOPPING, 0, body))
        flags, err, buffers = serialize.dumps_error(PoolStoppedError(message), tb_text="")
        for route in routes:
            self._reply(route, Frame(Kind.RESULT, 0, err, flags, buffers))

    def _reply(self, route: Route, frame: Frame) -> None:
        if not route.conn.open:
            serialize.discard(frame.buffers)  # nobody will read them
            return
        buffers = frame.buffers
        if buffers and self._remote_spill() is not None:
            buffers = _inline(buffers)  # the client is on another host: the bytes themselves
        try:
            route.conn.writer.send_parts(frame.kind, route.client_tid, frame.flags, frame.body, buffers)
        except OSError:
            route.conn.open = False
            serialize.discard(frame.buffers)

    def _broadcast(self, frame: Frame) -> None:
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            self._reply(Route(c, 0), frame)



# Frames from a client that the agent passes to a worker (their buffers may go to shared memory).
_TO_WORKERS = frozenset({Kind.TASK, Kind.MAP, Kind.REPLY, Kind.FEED})


def _inline(buffers: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """A worker's shared-memory buffers as bytes for a client on another host (compressed
    where it pays, as the worker would have for the stream); each segment is given back when
    its view is dropped, once sent."""
    out = []
    for bflags, data in buffers:
        if bflags & serialize.BUF_SPILLED:
            try:
                view = shm.get(data).raw()
            except OSError:
                view = memoryview(b"")  # gone (the worker's folder was removed): an error there
            out.append(serialize.maybe_compress(view))
        else:
            out.append((bflags, data))
    return out


def _node_spill_dir() -> Path | None:
    """A shared-memory folder of this agent's own (``/dev/shm/skyward-node-<pid>-<ns>-*``),
    whose lock it holds while it lives (sweep.py); those of agents that are gone are removed
    first. None where /dev/shm cannot be used.

    ``ns`` names the agent's pid namespace: containers (and the test hosts) may share one
    /dev/shm while each counts its own pids; the lock says who is gone in every namespace."""
    from . import sweep

    shm_root = Path(sweep.SHM)
    if not (shm_root.is_dir() and os.access(shm_root, os.W_OK)):
        return None
    sweep.sweep_nodes()
    ns = sweep.pid_namespace()
    # As tempfile.mkdtemp makes it (a new name, mode 0700), without tempfile's imports (4 ms of
    # every node's start).
    for _ in range(100):
        folder = shm_root / f"skyward-node-{os.getpid()}-{ns}-{os.urandom(5).hex()}"
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            continue
        except OSError:
            return None
        sweep.hold(folder)  # (a sweep finds no lock file before this: an unlocked one is new)
        return folder
    return None


def _pid_namespace() -> str:
    from .sweep import pid_namespace

    return pid_namespace()


def _unmount_volumes(folder: str) -> None:
    """Run the pool's unmount script (bootstrap/mounts.py), if the volumes phase wrote one;
    no agent is left to wait for after an orphaned pool, so at most a few minutes of uploads."""
    import subprocess

    script = os.path.join(folder, "unmount.sh")
    if os.path.isfile(script):
        try:
            subprocess.run(["bash", script], stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            _log(f"unmounting the pool's volumes failed: {exc}")


if __name__ == "__main__":  # (the agent's process starts in agent_start.py, before this module's imports)
    raise SystemExit("skyward agent: run `python -m skyward.bootstrap.agent_start`")
