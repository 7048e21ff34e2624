"""The node agent: one per node, the only long-lived skyward process there.

It listens on 127.0.0.1 only and admits a client that presents the pool's token. Tasks arrive
as frames on that one connection and are relayed, unopened, to worker processes that it
starts, watches and replaces (a task that kills its process gets an error, the node keeps
serving). It holds a lease from the client: when nobody has renewed it for ``ttl`` seconds,
the agent stops its workers and exits, so a crashed or killed client leaves nothing behind.

Plugins come with the first CONFIGURE (cloudpickled, base64): the agent forwards them to its
workers and applies their launcher hooks to the worker command. A launched worker (``accelerate
launch``...) may be several processes; each connects back to the agent on a Unix socket
instead of inheriting one. A task that submits work to the pool (nested dispatch) sends a
SUBMIT frame, which the agent relays to the client that sent the task; while it waits, the
task's slot is lent to other tasks.

Handshake on stdout (one JSON line) so whoever started the agent learns its port:
``{"port": 41234, "pid": 1234}``. The token comes in the environment, never on argv.
"""

from __future__ import annotations

import argparse
import base64
import collections
import hmac
import itertools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import serialize, versions
from .frames import (
    FLAG_STREAM_IN,
    FLAG_STREAM_OUT,
    NESTED,
    Frame,
    FrameReader,
    FrameWriter,
    Kind,
    tune,
)

PROTOCOL = 1


def _log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), "agent:", msg, file=sys.stderr, flush=True)


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    writer: FrameWriter
    open: bool = True


@dataclass(eq=False)
class Route:
    conn: Conn
    client_tid: int
    worker: WorkerProc | None = None
    nested: int = 0  # nested submissions of this task that await their REPLY


@dataclass(eq=False)
class WorkerProc:
    index: int
    proc: subprocess.Popen[bytes]
    writer: FrameWriter
    sock: socket.socket
    capacity: int
    inflight: dict[int, Route] = field(default_factory=dict)
    retiring: bool = False
    lent: int = 0  # slots lent by tasks of this worker that wait for nested work
    launched: bool = False  # started by a plugin launcher: shares its process with others


class Agent:
    def __init__(self, token: str, ttl: float, orphan_cleanup: list[str] | None = None) -> None:
        self.token = token.encode()
        self.ttl = ttl
        self.orphan_cleanup = orphan_cleanup or []
        self.orphaned = False
        self.lock = threading.RLock()
        self.conns: list[Conn] = []
        self.workers: list[WorkerProc] = []
        self.pending: collections.deque[tuple[int, Route, Frame]] = collections.deque()
        self.routes: dict[int, Route] = {}
        self.tids = itertools.count(1)
        self.renewed = time.monotonic()
        self.stopping = threading.Event()
        self.config: dict[str, Any] | None = None
        self.settings: dict[str, Any] = {}
        self.collector: Any = None
        self.launchers: list[Any] = []
        # Plugin launchers' socket folders and listeners: removed when the agent stops.
        self.launch_dirs: list[str] = []
        self.launch_listeners: list[socket.socket] = []
        # agent id -> (worker, the worker's id, the submitting task's route) for nested SUBMITs
        self.nested: dict[int, tuple[WorkerProc, int, Route | None]] = {}
        self.state: Any = None  # the pool's collections (state.StateServer), on the head node
        # (id(connection), client's task id) -> agent task id, for streaming tasks: CREDIT, STOP
        # and FEED frames from the client name the task by the client's id.
        self.streaming: dict[tuple[int, int], int] = {}
        self.spare: tuple[subprocess.Popen[bytes], socket.socket] | None = None  # see prestart

    # -- lifecycle ---------------------------------------------------------------------------
    def serve(self, listener: socket.socket) -> None:
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        threading.Thread(target=self._lease_watchdog, daemon=True).start()
        self.stopping.wait()
        listener.close()
        if self.collector is not None:
            self.collector.stop()
        self._stop_workers()
        for launch_listener in self.launch_listeners:
            launch_listener.close()
        for folder in self.launch_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        with self.lock:
            for c in self.conns:
                _close(c.sock)
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

    def _stop_workers(self) -> None:
        self._drop_spare()
        with self.lock:
            workers = list(self.workers)
            for w in workers:
                w.retiring = True
        for w in workers:
            try:
                w.proc.terminate()  # a worker busy in tasks reads no frames; SIGTERM reaches it
            except OSError:
                pass
        deadline = time.monotonic() + 3
        for w in workers:
            try:
                w.proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # The whole group: processes a task started must not outlive the node either.
            _kill_group(w.proc)
            w.proc.wait()

    # -- client connections ------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            tune(sock)
            threading.Thread(target=self._serve_conn, args=(sock,), daemon=True).start()

    def _serve_conn(self, sock: socket.socket) -> None:
        reader, writer = FrameReader(sock), FrameWriter(sock)
        try:
            hello = reader.read()
            info = json.loads(bytes(hello.body)) if hello.kind == Kind.HELLO else {}
            if not hmac.compare_digest(str(info.get("token", "")).encode(), self.token):
                _log("refused a connection with a wrong token")
                _close(sock)
                return
        except (EOFError, OSError, ValueError):
            _close(sock)
            return
        conn = Conn(sock, writer)
        with self.lock:
            self.conns.append(conn)
            if "ttl" in info:
                self.ttl = float(info["ttl"])
            self.renewed = time.monotonic()
            # What this node is doing for every client (`skyward status` shows it).
            running = sum(len(w.inflight) for w in self.workers)
            queued = len(self.pending)
            clients = len(self.conns)
        welcome = {
            "protocol": PROTOCOL,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "cwd": os.getcwd(),
            "tasks": running + queued,
            "running": running,
            "queued": queued,
            "clients": clients,
            "pong": True,  # answers PING: the client may treat a silent node as lost
            "packages": versions.installed(),  # the client names the ones that differ from its own
        }
        writer.send_parts(Kind.WELCOME, 0, 0, json.dumps(welcome).encode())
        try:
            while True:
                frame = reader.read()
                self.renewed = time.monotonic()
                if frame.kind in (Kind.TASK, Kind.MAP):
                    self._submit(conn, frame)
                elif frame.kind == Kind.REPLY:
                    self._nested_reply(frame)
                elif frame.kind == Kind.CANCEL:
                    self._cancel(conn, frame.task_id)
                elif frame.kind == Kind.CONFIGURE:
                    self._configure(json.loads(bytes(frame.body)))
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
                self.settings = config["worker"]
                self.launchers = _launchers(config.get("plugins"))
                n = self.settings["processes"]
                command = self._launch_command()
                if command is not None:
                    self._drop_spare()
                if command is None:
                    for i in range(n):
                        self.workers.append(self._spawn(i))
                else:
                    self._launch(command)
                self._start_metrics(config.get("metrics") or [])
            else:  # topology changed (resize): tell every live worker
                for w in self.workers:
                    self._send_config(w)
            sends = self._assign()  # tasks that arrived before the first CONFIGURE
        self._send(sends)

    def _start_metrics(self, specs: list[dict[str, Any]]) -> None:
        if not specs:
            return
        from skyward.metrics import from_config

        from .metrics import Collector

        self.collector = Collector(from_config(specs), self._emit_metric)
        self.collector.start()

    def _emit_metric(self, name: str, value: float, unit: str) -> None:
        body = json.dumps({"name": name, "value": value, "unit": unit}).encode()
        self._broadcast(Frame(Kind.METRIC, 0, body))

    def _topology_for(self, index: int) -> dict[str, Any]:
        assert self.config is not None
        return {
            **self.config["topology"],
            "worker": index,
            "workers_per_node": self.settings["processes"],
            "slots_per_node": self.settings["capacity"] * self.settings["processes"],
        }

    def _send_config(self, w: WorkerProc) -> None:
        assert self.config is not None
        body = json.dumps({
            "threads": self.settings["threads"],  # a spare worker learns them here (prestart)
            "exclusive": self.settings["exclusive"],
            "topology": self._topology_for(w.index),
            "spill": self.config.get("spill"),
            "plugins": self.config.get("plugins"),
            "state": self._state_for_workers(),
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

                self.state = StateServer(self.token, self._log_to_clients)
            return self.state

    def _log_to_clients(self, text: str) -> None:
        _log(text)
        self._broadcast(Frame(Kind.OUTPUT, 0, (text + "\n").encode(), 2))

    def _state_for_workers(self) -> dict[str, Any] | None:
        """Where workers reach the collection server, with the token (never on argv)."""
        assert self.config is not None
        where = self.config.get("state")
        if not where or "error" in where:
            return where
        return {**where, "token": self.token.decode()}

    def prestart(self) -> None:
        """Start one worker process now, before any client has configured the node: its
        interpreter starts and imports while the client connects, and the first CONFIGURE
        (which says how many threads it runs) adopts it (``_spawn``). Without it the pool's
        first task would wait for a worker process to start."""
        with self.lock:
            if self.spare is None and not self.stopping.is_set():
                self.spare = self._popen_worker(None)

    def _popen_worker(self, settings: dict[str, Any] | None) -> tuple[subprocess.Popen[bytes], socket.socket]:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env.update(SKYWARD_WORKER_FD=str(theirs.fileno()), SKYWARD_AGENT_PID=str(os.getpid()))
        if settings is not None:  # else the first CONFIGURE says (a spare, see prestart)
            env.update(
                SKYWARD_WORKER_THREADS=str(settings["threads"]),
                SKYWARD_WORKER_EXCLUSIVE="1" if settings["exclusive"] else "0",
            )
        proc = subprocess.Popen(
            [sys.executable, "-m", "skyward.bootstrap.worker"],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        theirs.close()
        return proc, ours

    def _drop_spare(self) -> None:
        """The spare worker is not needed (a plugin launcher starts the workers): stop it."""
        with self.lock:
            spare, self.spare = self.spare, None
        if spare is not None:
            proc, sock = spare
            _close(sock)  # its first read ends: it exits
            _kill_group(proc)
            proc.wait()

    def _spawn(self, index: int) -> WorkerProc:
        with self.lock:
            spare, self.spare = self.spare, None
        proc, ours = spare if spare is not None else self._popen_worker(self.settings)
        w = WorkerProc(index, proc, FrameWriter(ours), ours, self.settings["capacity"])
        self._send_config(w)
        threading.Thread(target=self._serve_worker, args=(w,), daemon=True).start()
        for stream, pipe in ((1, proc.stdout), (2, proc.stderr)):
            threading.Thread(target=self._pump, args=(pipe, stream), daemon=True).start()
        return w

    # -- plugin launchers --------------------------------------------------------------------
    def _launch_command(self) -> str | None:
        """The worker command rewritten by the plugins' launcher hooks (None: no launcher)."""
        if not self.launchers:
            return None
        from skyward.plugins.plugin import LaunchCommand, LaunchContext

        assert self.config is not None
        topo = self.config["topology"]
        node = int(topo["node"])
        peers = topo.get("peers") or []
        ctx = LaunchContext(
            node_id=node,
            num_nodes=int(topo["total_nodes"]),
            head_addr=str(topo["head_addr"]),
            casty_port=int(topo["head_port"]),
            private_ip=str(peers[node]["private_ip"]) if node < len(peers) else "127.0.0.1",
            python_bin=sys.executable,
            venv_dir=sys.prefix,
            concurrency=int(self.settings["processes"] * self.settings["capacity"]),
            executor="process" if self.settings["exclusive"] else "thread",
        )
        cmd = LaunchCommand(entrypoint=f"{shlex.quote(sys.executable)} -m skyward.bootstrap.worker")
        for hook in self.launchers:
            cmd = hook(cmd, ctx)
        return cmd.render()

    def _launch(self, command: str) -> None:
        """Start the launcher; every process it starts connects back as one worker."""
        folder = tempfile.mkdtemp(prefix=f"skyward-launch-{os.getpid()}-")  # whose it is, by pid
        self.launch_dirs.append(folder)
        path = os.path.join(folder, "agent.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.launch_listeners.append(listener)
        listener.bind(path)
        listener.listen(64)
        env = dict(os.environ)
        env.update(
            SKYWARD_WORKER_ADDR=path,
            SKYWARD_AGENT_PID=str(os.getpid()),  # workers under a launcher watch the agent too
            SKYWARD_WORKER_THREADS=str(self.settings["threads"]),
            SKYWARD_WORKER_EXCLUSIVE="1" if self.settings["exclusive"] else "0",
        )
        _log(f"starting workers with a plugin launcher: {command}")
        proc = subprocess.Popen(
            ["bash", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, start_new_session=True,
        )
        for stream, pipe in ((1, proc.stdout), (2, proc.stderr)):
            threading.Thread(target=self._pump, args=(pipe, stream), daemon=True).start()
        threading.Thread(target=self._accept_launched, args=(listener, proc), daemon=True).start()

    def _accept_launched(self, listener: socket.socket, proc: subprocess.Popen[bytes]) -> None:
        index = 0
        while not self.stopping.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            tune(sock)
            with self.lock:
                w = WorkerProc(index, proc, FrameWriter(sock), sock, self.settings["capacity"], launched=True)
                index += 1
                self.workers.append(w)
                self._send_config(w)
                sends = self._assign()
            threading.Thread(target=self._serve_worker, args=(w,), daemon=True).start()
            self._send(sends)

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
        route = Route(conn, frame.task_id)
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

    def _serve_worker(self, w: WorkerProc) -> None:
        reader = FrameReader(w.sock)
        while True:
            try:
                frame = reader.read()
            except (EOFError, OSError):
                break
            if frame.kind == Kind.RESULT:
                with self.lock:
                    route = self.routes.pop(frame.task_id, None)
                    w.inflight.pop(frame.task_id, None)
                    if self.streaming and route is not None:
                        self.streaming.pop((id(route.conn), route.client_tid), None)
                    if not self.settings.get("reuse", True) and not w.retiring:
                        self._retire(w)
                    sends = self._assign()
                if route is not None:
                    self._reply(route, frame)
                self._send(sends)
            elif frame.kind == Kind.SHUTDOWN:  # the worker is about to exit on purpose
                with self.lock:
                    if not w.retiring and not self.stopping.is_set():
                        w.retiring = True
                        self.workers[self.workers.index(w)] = self._spawn(w.index)
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
        if w.launched:  # siblings share the launcher's process: leave it to them
            rc = w.proc.poll() or 0
        else:
            rc = w.proc.wait()
            _kill_group(w.proc)  # what the worker's tasks started goes with it
        _close(w.sock)
        self._worker_exited(w, rc)

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
        """Drop a task that still waits for a slot; it answers with an error at once."""
        with self.lock:
            found = None
            for item in self.pending:
                if item[1].conn is conn and item[1].client_tid == client_tid:
                    found = item
                    break
            if found is None:
                return
            self.pending.remove(found)
            self.routes.pop(found[0], None)
        serialize.discard(found[2].buffers)
        from skyward.errors import TaskCancelledError

        err = TaskCancelledError("the task was cancelled before it started (joblib aborted the batch)")
        flags, body, buffers = serialize.dumps_error(err, tb_text="")
        self._reply(found[1], Frame(Kind.RESULT, 0, body, flags, buffers))

    def _retire(self, w: WorkerProc) -> None:
        """reuse_processes=False: a fresh process for every task (lock held)."""
        w.retiring = True
        try:
            w.writer.send_parts(Kind.SHUTDOWN, 0, 0, b"")
        except OSError:
            pass
        self.workers[self.workers.index(w)] = self._spawn(w.index)

    def _worker_exited(self, w: WorkerProc, rc: int) -> None:
        with self.lock:
            lost = list(w.inflight.items())
            w.inflight.clear()
            for tid, _ in lost:
                self.routes.pop(tid, None)
            for aid in [a for a, (nw, _, _) in self.nested.items() if nw is w]:
                del self.nested[aid]
            if w.launched and w in self.workers:
                self.workers.remove(w)  # a launcher's processes are not restarted one by one
            replace = not w.launched and not w.retiring and not self.stopping.is_set()
            if replace:
                self.workers[self.workers.index(w)] = self._spawn(w.index)
            sends = self._assign()
        if lost:
            from skyward.errors import WorkerDiedError

            how = _describe_exit(rc)
            err = WorkerDiedError(
                f"the worker process running this task on {socket.gethostname()} {how} before "
                f"returning a result (os._exit, a crash in native code, or the out-of-memory "
                f"killer). A fresh worker process replaced it and the node keeps serving; "
                f"retry the task, or look for what ends the process."
            )
            flags, body, buffers = serialize.dumps_error(err, tb_text="")
            for _, route in lost:
                self._reply(route, Frame(Kind.RESULT, 0, body, flags, buffers))
        self._send(sends)

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
            return
        try:
            route.conn.writer.send_parts(
                frame.kind, route.client_tid, frame.flags, frame.body, frame.buffers
            )
        except OSError:
            route.conn.open = False

    def _broadcast(self, frame: Frame) -> None:
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            self._reply(Route(c, 0), frame)

    def _pump(self, pipe: Any, stream: int) -> None:
        """Forward what a worker writes to its fds (C code, subprocesses) as node output."""
        for line in iter(pipe.readline, b""):
            self._broadcast(Frame(Kind.OUTPUT, 0, line, stream))
        pipe.close()


def _launchers(blob: str | None) -> list[Any]:
    """The launcher hooks of the pool's plugins, in plugin order."""
    if not blob:
        return []
    import cloudpickle

    plugins = cloudpickle.loads(base64.b64decode(blob))
    return [p.launcher for p in plugins if getattr(p, "launcher", None) is not None]


def _describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with exit code {rc}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def _unmount_volumes(folder: str) -> None:
    """Run the pool's unmount script (bootstrap/mounts.py), if the volumes phase wrote one;
    no agent is left to wait for after an orphaned pool, so at most a few minutes of uploads."""
    script = os.path.join(folder, "unmount.sh")
    if os.path.isfile(script):
        try:
            subprocess.run(["bash", script], stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            _log(f"unmounting the pool's volumes failed: {exc}")


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="skyward-agent")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttl", type=float, default=600.0)
    parser.add_argument("--log", default=None, help="file for the agent's own log lines")
    parser.add_argument("--orphan-cleanup", action="append", default=[], metavar="PATH",
                        help="folder to remove when the lease expires (the client is gone)")
    args = parser.parse_args(argv)
    token = os.environ.pop("SKYWARD_AGENT_TOKEN", "")
    if not token:
        raise SystemExit("skyward agent: SKYWARD_AGENT_TOKEN is not set; refusing to serve")

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, args.port))
    listener.listen(16)
    port = listener.getsockname()[1]
    print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)
    # After the handshake, stdout/stderr go to the log (or nowhere): whoever started us may
    # stop reading, and a write to a closed pipe must never kill the agent.
    target = os.open(args.log or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    agent = Agent(token, args.ttl, args.orphan_cleanup)
    signal.signal(signal.SIGTERM, lambda *_: agent.shutdown("SIGTERM"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client decides; Ctrl-C is its to handle
    _log(f"serving on {args.host}:{port}, ttl {args.ttl:g} s")
    agent.prestart()
    agent.serve(listener)
    _log("stopped")


if __name__ == "__main__":
    main()
