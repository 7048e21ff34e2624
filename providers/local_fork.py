"""The Local provider's side of a pool's fork server (skyward/bootstrap/zygote.py).

``ForkServer`` starts the server once per cluster and asks it for agents; each comes back as a
``ForkedAgent``, the part of ``subprocess.Popen`` the provider uses (``pid``, ``poll``,
``wait``), plus ``hello()``: the agent's handshake line. The server's stdout carries the lines
of all its agents, so whichever caller reads it files every line it finds by pid.

**A warm server.** Building a ``sky.Compute`` of Local nodes starts one server ahead
(``prestart``), before the pool's own modules load and its folders exist, so that the server's
interpreter and imports (about 55 ms) run beside the client's instead of after it. It knows no
pool: it runs with ``-P`` (nothing of its working directory on its path), and each request brings
the node's whole environment (the pool's token and folders in it) and what goes first on its
import path. The first pool that can use it takes it (``take_warm``) and owns it from then on, as
it would its own; a pool whose nodes need another interpreter start (its own packages, other
``PYTHON*`` or ``LD_*`` variables) starts its own server as before, and the warm one exits.
"""

from __future__ import annotations

import itertools
import os
import select
import subprocess
import sys
import threading
import time
import weakref

from skyward.bootstrap.procs import alive, hold_over_fork, wait_gone

# Building a sky.Compute of Local nodes imports this module to start the warm server, so it
# loads nothing the server's start does not need: json (whose regexes compile on import),
# pathlib and typing load later, with the pool (about 13 ms earlier a start; see prestart).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any


def _let_go_in_child() -> None:
    """In a child forked from a program with a Local pool open: the server exits when its stdin
    reaches end of file, so a child holding a copy of the pipe's write end would keep it (and
    the parent's close would wait for it). The fd is pointed at /dev/null rather than closed,
    so that the file object, when collected, closes a descriptor that is still its own. A warm
    server waiting is the parent's too: the child's first pool starts its own."""
    global _warm, _warm_lock
    _warm, _warm_lock = None, threading.Lock()
    for server in list(ForkServer.running):
        stdin = server.proc.stdin
        if stdin is None or stdin.closed:
            continue
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stdin.fileno())
            os.close(null)
        except OSError:
            pass


class ForkServer:
    # The servers of this process: a child forked from it lets go of their stdin (see below).
    running: weakref.WeakSet[ForkServer] = weakref.WeakSet()

    def __init__(self, env: dict[str, str], root: Path | None) -> None:
        """A server for the pool whose folder is ``root``, started with the nodes' ``env``; with
        ``root`` None, a warm one (see the module's docstring): its own errors go to an unnamed
        file instead of ``fork-server.log``."""
        self.env = env
        self.log: Path | None = None
        command = [sys.executable, "-m", "skyward.bootstrap.agent_start", "--fork-server"]
        self._log_fd: int | None = None  # a warm server's unnamed log, read by errors()
        if root is None:
            command.insert(1, "-P")
            log_fd = _unnamed_file()
            try:
                self.proc = subprocess.Popen(command, cwd="/", env=env, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log_fd, start_new_session=True)
            except BaseException:
                if log_fd != subprocess.DEVNULL:
                    os.close(log_fd)
                raise
            if log_fd != subprocess.DEVNULL:
                self._log_fd = log_fd
        else:
            self.log = root / "fork-server.log"
            with open(self.log, "ab") as log_file:
                self.proc = subprocess.Popen(command, cwd=root, env=env, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log_file, start_new_session=True)
        self._lock = threading.Lock()  # one reader of its stdout at a time
        self._writing = threading.Lock()  # one request on its stdin at a time
        self._keys = itertools.count()  # each request's own number (its answer says it)
        self._pending = b""
        self._pids: dict[int, int] = {}  # request number -> agent pid
        self._hellos: dict[int, bytes] = {}  # agent pid -> its hello line
        self._ended = False
        ForkServer.running.add(self)

    def fork(self, argv: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None,
             environ: dict[str, str] | None = None, path: list[str] | None = None) -> ForkedAgent:
        """Ask for an agent started as ``argv`` in ``cwd``, with ``env`` added to the pool's environment (the
        node's own GPUs); a warm server gets the node's whole environment (``environ``) and
        what goes first on its import path (``path``) too. Raises OSError when the server is gone."""
        import json

        assert self.proc.stdin is not None
        with self._writing:
            key = next(self._keys)
            request: dict[str, Any] = {"index": key, "argv": argv, "cwd": str(cwd), "log": str(log)}
            if env:
                request["env"] = env
            if environ is not None:
                request["environ"] = environ
            if path:
                request["path"] = path
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        return ForkedAgent(key, self)

    def wait_for(self, key: int, deadline: float, hello: bool) -> tuple[int | None, bytes | None]:
        """Request ``key``'s agent pid, and its hello line when ``hello``, reading the server's
        output until they come, it ends, or ``deadline`` (monotonic) passes."""
        with self._lock:
            while True:
                pid = self._pids.get(key)
                line = self._hellos.get(pid) if pid is not None else None
                if (pid is not None and (line is not None or not hello)) or self._ended:
                    return pid, line
                left = deadline - time.monotonic()
                if left <= 0 or not self._read(left):
                    return pid, line

    def _read(self, timeout: float) -> bool:
        import json

        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return False
        data = os.read(fd, 65536)
        if not data:
            self._ended = True
            return False
        self._pending += data
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            try:
                said: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            if "forked" in said:
                self._pids[int(said["forked"])] = int(said["pid"])
            elif "pid" in said:
                self._hellos[int(said["pid"])] = line
        return True

    def errors(self) -> str:
        """What the server itself wrote on stderr (its agents write to their nodes' logs)."""
        try:
            if self._log_fd is not None:
                return os.pread(self._log_fd, 1 << 16, 0).decode(errors="replace")
            if self.log is not None and self.log.exists():
                return self.log.read_text(errors="replace")
        except OSError:
            pass
        return ""

    def close(self, timeout: float = 5.0) -> None:
        """No more agents: the server exits once the ones it forked have (they are stopped by
        pid); waits up to ``timeout`` s for that, then kills it."""
        self.detach()
        if not wait_gone(self.proc.pid, timeout):  # (Popen.wait polls with sleeps)
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def detach(self) -> None:
        """This process lets go: the server stays until its agents have exited."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        fd, self._log_fd = self._log_fd, None
        if fd is not None:
            os.close(fd)


class ForkedAgent:
    """An agent the fork server started: not this process's child, so it is waited for by pid."""

    returncode: int | None = None

    def __init__(self, key: int, server: ForkServer) -> None:
        self.key = key  # the request's number
        self.server = server
        self._pid: int | None = None

    @property
    def pid(self) -> int:
        """The agent's pid (once the server has said it; -1 if it never does)."""
        if self._pid is None:
            pid, _ = self.server.wait_for(self.key, time.monotonic() + 30, hello=False)
            if pid is None:
                return -1
            self._pid = pid
        return self._pid

    def hello(self, timeout: float) -> bytes:
        """The agent's handshake line, or b"" when it did not come in time."""
        pid, line = self.server.wait_for(self.key, time.monotonic() + timeout, hello=True)
        if pid is not None:
            self._pid = pid
        return line or b""

    def poll(self) -> int | None:
        pid = self.pid
        if pid > 0 and alive(pid):
            return None
        if self.returncode is None:
            self.returncode = -1  # (its exit status is the server's to read)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None and not wait_gone(self.pid, timeout):
            raise subprocess.TimeoutExpired(f"agent {self.pid}", timeout or 0)
        code = self.poll()
        return -1 if code is None else code


def _unnamed_file() -> int:
    """A file of this user's with no name (O_TMPFILE) for a warm server's own errors, or
    DEVNULL where the system has none."""
    try:
        return os.open(os.environ.get("TMPDIR") or "/tmp", os.O_TMPFILE | os.O_RDWR, 0o600)
    except (OSError, AttributeError):
        return subprocess.DEVNULL


# -- the warm server ----------------------------------------------------------------------------
# Variables read when an interpreter starts (or its loader does), which a forked agent cannot
# take from its request: a pool that sets any of them otherwise needs a server of its own.
_STARTUP_PREFIXES = ("PYTHON", "LD_", "MALLOC_")
_NODE_ONLY = ("SKYWARD_GPUS", "SKYWARD_GPU_SHARE", "SKYWARD_NODE_GPUS")  # a node's own (local.py)
_warm: ForkServer | None = None
_warm_lock = threading.Lock()


def client_paths() -> list[str]:
    """This process's own import path (script folder, cwd, PYTHONPATH), without what the
    interpreter adds itself (its stdlib and site-packages): what a Local node needs on its
    PYTHONPATH to import what this process can."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths: list[str] = []
    for entry in sys.path:
        entry = entry or os.getcwd()
        if not any(entry.startswith(p) for p in prefixes) and entry not in paths:
            paths.append(entry)
    return paths


def prestart() -> None:
    """Start a warm server for the next Local pool of this process, unless one is waiting
    already. Nothing is said when it cannot start: the pool then starts its own, as before."""
    global _warm
    with _warm_lock:
        if _warm is not None and _warm.proc.poll() is None:
            return
        if _warm is not None:  # one that ended before any pool took it: its pipes go
            _warm.close(timeout=0)
        env = {k: v for k, v in os.environ.items() if k not in _NODE_ONLY}
        env["PYTHONPATH"] = os.pathsep.join(client_paths())
        try:
            _warm = ForkServer(env, None)
        except OSError:
            _warm = None


def take_warm(env: dict[str, str]) -> tuple[ForkServer, list[str]] | None:
    """The warm server, taken for a pool whose nodes run with ``env``, and what goes first on
    their import path beyond the server's own; None when there is none, or when its start does
    not fit that environment (it is then closed)."""
    global _warm
    with _warm_lock:
        server, _warm = _warm, None
    if server is None:
        return None
    extra = _fits(server.env, env)
    if extra is None or server.proc.poll() is not None:
        server.close(timeout=1)
        return None
    return server, extra


def _fits(started: dict[str, str], env: dict[str, str]) -> list[str] | None:
    """The import path entries ``env`` puts before those the server started with, or None when
    the server's start differs from what ``env`` asks of an interpreter's start."""
    for name in started.keys() | env.keys():
        if name != "PYTHONPATH" and name.startswith(_STARTUP_PREFIXES) and started.get(name) != env.get(name):
            return None
    have = [p for p in started.get("PYTHONPATH", "").split(os.pathsep) if p]
    want = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if len(want) < len(have) or want[len(want) - len(have):] != have:
        return None
    return want[:len(want) - len(have)]


def _close_warm() -> None:
    """At exit: a warm server no pool took goes (it has no agent)."""
    global _warm
    with _warm_lock:
        server, _warm = _warm, None
    if server is not None:
        server.close(timeout=1)


import atexit  # noqa: E402

atexit.register(_close_warm)

def _writers() -> list[threading.Lock]:
    """The locks under which requests are written to the servers' stdin (held over a fork)."""
    while True:
        try:
            return [server._writing for server in list(ForkServer.running)]
        except RuntimeError:  # (a server started meanwhile, on another thread)
            continue


if hasattr(os, "register_at_fork"):
    hold_over_fork(_writers)
    os.register_at_fork(after_in_child=_let_go_in_child)
