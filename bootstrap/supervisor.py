"""The worker processes of a node's agent: started, kept spare, forked, launched, retired and
watched, and why one ended.

The agent (agent.py) holds one ``Supervisor``; it serves connections and routes frames, the
supervisor owns the processes that run tasks. A node's first worker starts before any client
configured it (``prestart``: the spare, forked from the agent while the agent is still
single-threaded, forked.py); the first CONFIGURE adopts it and starts the rest (``start``), or
hands the worker command to the plugins' launcher hooks, whose processes connect back one by one
(``launch``). A worker that dies is replaced in its place unless it was retiring, launched, or
the agent is stopping (``exited``); ``retire`` replaces one that should not take another task.

Each worker is watched on a thread of its own: its frames go to the agent (``Owner.from_worker``)
until its connection closes, then its process is reaped, what its tasks started is killed, and
the agent hears how it ended (``Owner.worker_exited``; ``exit_reason`` says it in words). What a
worker writes to its fds goes to the agent too (``Owner.output``). Nothing here knows tasks,
clients or routes: another kind of process can be supervised beside the workers the same way.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import sys
import threading
import time

from .forked import Forked, fork_worker
from .frames import HEADER, FrameReader, FrameWriter, Kind, tune
from .handshake import Gate, Refused, admit
from .lane import LaneCount
from .listeners import close, unix_listener, unlink
from .procs import TERMINATED

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any, Protocol

    from .frames import Frame

    class Owner(Protocol):
        """What the supervisor tells the agent that holds it."""

        def send_config(self, w: WorkerProc) -> None:
            """A worker has started (the lock is held): give it its CONFIGURE."""

        def from_worker(self, w: WorkerProc, frame: Frame) -> None:
            """A frame from a worker (other than its SHUTDOWN, which the supervisor handles)."""

        def worker_exited(self, w: WorkerProc, rc: int) -> None:
            """A worker's connection closed and its process was reaped (``rc``: its exit status)."""

        def worker_joined(self) -> None:
            """A worker a plugin launcher started has connected and is configured."""

        def output(self, line: bytes, stream: int) -> None:
            """A line a worker process wrote to its stdout (1) or stderr (2)."""


def _log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), "agent:", msg, file=sys.stderr, flush=True)


# A plain class, not a dataclass: importing dataclasses (and inspect with it) would be a fifth
# of the agent's start-up, which every Local node pays on the way to its first task.
class WorkerProc:
    """One worker: its process, its connection to the agent and its lane; the agent keeps its
    bookkeeping of the tasks it routed there on it too (``inflight``, ``lent``)."""

    __slots__ = ("capacity", "index", "inflight", "lane", "lane_count", "launched", "lent", "proc",
                 "retiring", "sock", "writer")

    def __init__(self, index: int, proc: subprocess.Popen[bytes] | Forked, writer: FrameWriter, sock: socket.socket,
                 capacity: int, launched: bool = False) -> None:
        self.index, self.proc, self.writer, self.sock, self.capacity = index, proc, writer, sock, capacity
        self.inflight: dict[int, Any] = {}  # agent task id -> its route (agent.Route)
        self.retiring = False
        self.lent = 0  # slots lent by tasks of this worker that wait for nested work
        self.launched = launched  # started by a plugin launcher: shares its process with others
        self.lane: str | None = None  # where its lane listens (lane.py), when clients may use it
        self.lane_count: LaneCount | None = None  # how many lane tasks it runs now


class Supervisor:
    """The agent's worker processes. ``lock`` is the agent's: the worker list changes under it,
    and the methods that say "lock held" are called from the agent's own critical sections."""

    def __init__(self, owner: Owner, lock: threading.RLock, stopping: threading.Event) -> None:
        self.owner, self.lock, self.stopping = owner, lock, stopping
        self.workers: list[WorkerProc] = []
        self.settings: dict[str, Any] = {}  # the CONFIGURE's "worker" part (start)
        self.spare: tuple[subprocess.Popen[bytes] | Forked, socket.socket, _LaneSetup | None] | None = None  # see prestart
        # Where workers' lane listeners go (lane.py): beside the agent's own Unix socket, when
        # it has one (a Local node: its clients are on this host).
        self.lane_dir: str | None = None
        self.lane_ids = itertools.count(1)
        # Connections from workers a plugin launcher started, still in their handshake.
        self.launch_gate = Gate(per_source=16)
        # Plugin launchers' socket folders and listeners: removed when the agent stops.
        self.launch_dirs: list[str] = []
        self.launch_listeners: list[socket.socket] = []

    # -- start ---------------------------------------------------------------------------------
    def prestart(self, ours: list[socket.socket] | None = None) -> None:
        """Start one worker process now, before any client has configured the node: it
        imports while the client connects, and the first CONFIGURE (which says how many
        threads it runs) adopts it (``_spawn``). Without it the pool's first task would wait
        for a worker process to start. Called before the agent serves (no thread yet), it is
        forked from this process (forked.py; ``ours``: the listeners it closes), which spares
        it a new interpreter and the imports it shares with the agent."""
        with self.lock:
            if self.spare is None and not self.stopping.is_set():
                forked = self._fork_spare(ours or []) if threading.active_count() == 1 else None
                self.spare = forked or self._popen_worker(None)

    def start(self, settings: dict[str, Any], topology: dict[str, Any], plugins: str | None) -> None:
        """The first CONFIGURE (lock held): ``settings`` say how many workers run how; the
        workers start, or the plugins' launcher hooks start them (``plugins``: cloudpickled,
        base64)."""
        self.settings = settings
        command = launch_command(_launchers(plugins), topology, settings)
        if command is not None:
            self._drop_spare()
        if command is None:
            for i in range(settings["processes"]):
                self.workers.append(self._spawn(i))
        else:
            self._launch(command)

    def retire(self, w: WorkerProc) -> None:
        """reuse_processes=False: ``w`` takes no other task; a fresh process takes its place
        (lock held)."""
        w.retiring = True
        try:
            w.writer.send_parts(Kind.SHUTDOWN, 0, 0, b"")
        except OSError:
            pass
        self.workers[self.workers.index(w)] = self._spawn(w.index)

    def exited(self, w: WorkerProc) -> bool:
        """``w`` has exited (lock held): a launched one leaves the list, one that died on its
        own is replaced in its place. True when it was replaced."""
        if w.launched and w in self.workers:
            self.workers.remove(w)  # a launcher's processes are not restarted one by one
        replace = not w.launched and not w.retiring and not self.stopping.is_set()
        if replace:
            self.workers[self.workers.index(w)] = self._spawn(w.index)
        return replace

    def stop(self) -> None:
        """Stop every worker (SIGTERM, then the whole process group), the spare and the
        launchers' listeners and folders."""
        import subprocess

        self._drop_spare()
        with self.lock:
            workers = list(self.workers)
            for w in workers:
                w.retiring = True
        for w in workers:
            unlink(w.lane)
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
        for launch_listener in self.launch_listeners:
            launch_listener.close()
        import shutil

        for folder in self.launch_dirs:
            shutil.rmtree(folder, ignore_errors=True)

    # -- spare and spawned workers -----------------------------------------------------------------
    def _fork_spare(self, ours: list[socket.socket]) -> tuple[Forked, socket.socket, _LaneSetup | None] | None:
        mine, theirs = socket.socketpair()
        lane = self._lane_listener(None)

        def run() -> None:
            from . import worker

            worker.spare(theirs, lane.listener if lane else None, lane.count if lane else None)

        env = {"SKYWARD_AGENT_PID": str(os.getpid())}
        proc = fork_worker(env, [*ours, mine], run)
        theirs.close()
        if lane is not None:
            lane.listener.close()  # the worker has its own copy
        if proc is None:
            mine.close()
            if lane is not None:
                lane.drop()
            return None
        return proc, mine, lane

    def _popen_worker(self, settings: dict[str, Any] | None) -> tuple[subprocess.Popen[bytes], socket.socket, _LaneSetup | None]:
        # (Imported here: a node's first worker is forked, and the agent's start is on the way
        # to every Local pool's first task.)
        import subprocess

        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env.update(SKYWARD_WORKER_FD=str(theirs.fileno()), SKYWARD_AGENT_PID=str(os.getpid()))
        lane = self._lane_listener(settings)
        fds = [theirs.fileno()]
        if lane is not None:
            env["SKYWARD_LANE_FD"] = str(lane.listener.fileno())
            fds.append(lane.listener.fileno())
            if lane.count is not None:
                env["SKYWARD_LANE_COUNT_FD"] = str(lane.count.fd)
                fds.append(lane.count.fd)
        if settings is not None:  # else the first CONFIGURE says (a spare, see prestart)
            env.update(
                SKYWARD_WORKER_THREADS=str(settings["threads"]),
                SKYWARD_WORKER_EXCLUSIVE="1" if settings["exclusive"] else "0",
            )
        proc = subprocess.Popen(
            [sys.executable, "-m", "skyward.bootstrap.worker"],
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        theirs.close()
        if lane is not None:
            lane.listener.close()  # the worker has its own copy
        return proc, ours, lane

    def _lane_listener(self, settings: dict[str, Any] | None) -> _LaneSetup | None:
        """A listener for a worker's lane (lane.py): on nodes with a Unix socket, for a worker
        that runs its tasks in threads and lives on (a spare: its CONFIGURE decides)."""
        if self.lane_dir is None:
            return None
        if settings is not None and (settings["exclusive"] or not settings.get("reuse", True)):
            return None
        path = os.path.join(self.lane_dir, f"lane-{next(self.lane_ids)}.sock")
        sock = unix_listener(path)
        if isinstance(sock, str):
            _log(f"no lane for a worker: {sock}")
            return None
        return _LaneSetup(sock, path, LaneCount.create())

    def _drop_spare(self) -> None:
        """The spare worker is not needed (a plugin launcher starts the workers): stop it."""
        with self.lock:
            spare, self.spare = self.spare, None
        if spare is not None:
            proc, sock, lane = spare
            close(sock)  # its first read ends: it exits
            if lane is not None:
                lane.drop()
            _kill_group(proc)
            proc.wait()

    def _spawn(self, index: int) -> WorkerProc:
        with self.lock:
            spare, self.spare = self.spare, None
        proc, ours, lane = spare if spare is not None else self._popen_worker(self.settings)
        w = WorkerProc(index, proc, FrameWriter(ours), ours, self.settings["capacity"])
        # One thread-executor worker per node, reused: the lane may carry its tasks.
        if lane is not None and (self.settings["exclusive"] or not self.settings.get("reuse", True)
                                 or self.settings["processes"] != 1):
            lane.drop()  # the worker closes its listener when its CONFIGURE has no lane
            lane = None
        if lane is not None:
            w.lane, w.lane_count = lane.path, lane.count
        self.owner.send_config(w)
        threading.Thread(target=self._watch, args=(w,), daemon=True).start()
        for stream, pipe in ((1, proc.stdout), (2, proc.stderr)):
            threading.Thread(target=self._pump, args=(pipe, stream), daemon=True).start()
        return w

    # -- plugin launchers --------------------------------------------------------------------------
    def _launch(self, command: str) -> None:
        """Start the launcher; every process it starts connects back as one worker."""
        import subprocess
        import tempfile

        folder = tempfile.mkdtemp(prefix=f"skyward-launch-{os.getpid()}-")  # whose it is, by pid
        self.launch_dirs.append(folder)
        path = os.path.join(folder, "agent.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.launch_listeners.append(listener)
        listener.bind(path)
        listener.listen(64)
        env = dict(os.environ)
        key = os.urandom(32)  # the launched workers prove it when they call back (handshake.py)
        env.update(
            SKYWARD_WORKER_ADDR=path,
            SKYWARD_WORKER_KEY=key.hex(),
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
        threading.Thread(target=self._accept_launched, args=(listener, proc, key), daemon=True).start()

    def _accept_launched(self, listener: socket.socket, proc: subprocess.Popen[bytes], key: bytes) -> None:
        indices = itertools.count()
        while not self.stopping.is_set():
            try:
                sock, peer = listener.accept()
            except OSError:
                return
            if not self.launch_gate.enter(sock, peer):
                self._refused(sock, "too many launched workers in their handshake")
                continue
            threading.Thread(target=self._admit_launched, args=(sock, proc, key, indices), daemon=True).start()

    def _admit_launched(self, sock: socket.socket, proc: subprocess.Popen[bytes], key: bytes,
                        indices: itertools.count[int]) -> None:
        """A process the launcher started calls back: it becomes a worker once it proved the
        launch's key (the folder is this user's alone, but no listener trusts a connection)."""
        try:
            _, proof = admit(sock, key, gate=self.launch_gate)
            sock.sendall(_welcome(proof))
        except (Refused, OSError) as exc:
            self._refused(sock, f"a launched worker: {exc}")
            return
        finally:
            self.launch_gate.leave(sock)
        tune(sock)
        with self.lock:
            w = WorkerProc(next(indices), proc, FrameWriter(sock), sock, self.settings["capacity"], launched=True)
            self.workers.append(w)
            self.owner.send_config(w)
        threading.Thread(target=self._watch, args=(w,), daemon=True).start()
        self.owner.worker_joined()

    def _refused(self, sock: socket.socket, why: str) -> None:
        close(sock)
        line = self.launch_gate.refused(why)
        if line is not None:
            _log(line)

    # -- watch -------------------------------------------------------------------------------------
    def _watch(self, w: WorkerProc) -> None:
        """Read ``w``'s frames until its connection closes, then reap it and tell the agent."""
        reader = FrameReader(w.sock)
        while True:
            try:
                frame = reader.read()
            except (EOFError, OSError):
                break
            if frame.kind == Kind.SHUTDOWN:  # the worker is about to exit on purpose
                with self.lock:
                    if not w.retiring and not self.stopping.is_set():
                        w.retiring = True
                        self.workers[self.workers.index(w)] = self._spawn(w.index)
            else:
                self.owner.from_worker(w, frame)
        if w.launched:  # siblings share the launcher's process: leave it to them
            rc = w.proc.poll() or 0
        else:
            rc = w.proc.wait()
            _kill_group(w.proc)  # what the worker's tasks started goes with it
        close(w.sock)
        self.owner.worker_exited(w, rc)

    def _pump(self, pipe: Any, stream: int) -> None:
        """Forward what a worker writes to its fds (C code, subprocesses) as node output."""
        for line in iter(pipe.readline, b""):
            self.owner.output(line, stream)
        pipe.close()


def terminated(rc: int) -> bool:
    """Whether a worker with exit status ``rc`` ended on a SIGTERM (its handler's status, or the
    signal itself when it came before the handler was set)."""
    return rc in (TERMINATED, -signal.SIGTERM)


def exit_reason(rc: int) -> str:
    """How a process with exit status ``rc`` ended, in words ("was killed by SIGKILL")."""
    if terminated(rc):
        return "was stopped by a SIGTERM"
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with exit code {rc}"


def exit_causes(rc: int) -> str:
    """What usually ends a worker the way exit status ``rc`` says, for the task's error."""
    if terminated(rc):
        return "kill, or a scheduler or service manager stopping the node's processes"
    if rc == -signal.SIGKILL:
        return "the out-of-memory killer, or kill -9"
    return "os._exit, a crash in native code, or the out-of-memory killer"


def launch_command(launchers: list[Any], topology: dict[str, Any], settings: dict[str, Any]) -> str | None:
    """The worker command rewritten by the plugins' launcher hooks (None: no launcher)."""
    if not launchers:
        return None
    from skyward.plugins.plugin import LaunchCommand, LaunchContext

    node = int(topology["node"])
    peers = topology.get("peers") or []
    ctx = LaunchContext(
        node_id=node,
        num_nodes=int(topology["total_nodes"]),
        head_addr=str(topology["head_addr"]),
        casty_port=int(topology["head_port"]),
        private_ip=str(peers[node]["private_ip"]) if node < len(peers) else "127.0.0.1",
        python_bin=sys.executable,
        venv_dir=sys.prefix,
        concurrency=int(settings["processes"] * settings["capacity"]),
        executor="process" if settings["exclusive"] else "thread",
    )
    import shlex

    cmd = LaunchCommand(entrypoint=f"{shlex.quote(sys.executable)} -m skyward.bootstrap.worker")
    for hook in launchers:
        cmd = hook(cmd, ctx)
    return cmd.render()


def _launchers(blob: str | None) -> list[Any]:
    """The launcher hooks of the pool's plugins, in plugin order."""
    if not blob:
        return []
    import base64

    import cloudpickle

    plugins = cloudpickle.loads(base64.b64decode(blob))
    return [p.launcher for p in plugins if getattr(p, "launcher", None) is not None]


def _kill_group(proc: subprocess.Popen[bytes] | Forked) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


class _LaneSetup:
    """A lane made for a worker before it starts: its listener, the listener's path and the
    counter of its running lane tasks (lane.py)."""

    __slots__ = ("count", "listener", "path")

    def __init__(self, listener: socket.socket, path: str, count: LaneCount | None) -> None:
        self.listener, self.path, self.count = listener, path, count

    def drop(self) -> None:
        """Not used after all (the node's settings allow no lane)."""
        unlink(self.path)
        if self.count is not None:
            self.count.close()


def _welcome(proof: str) -> bytes:
    body = json.dumps({"proof": proof}).encode()
    return HEADER.pack(Kind.WELCOME, 0, 0, 0, len(body)) + body
