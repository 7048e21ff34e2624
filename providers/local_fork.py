"""The Local provider's side of a pool's fork server (skyward/bootstrap/zygote.py).

``ForkServer`` starts the server once per cluster and asks it for agents; each comes back as a
``ForkedAgent``, the part of ``subprocess.Popen`` the provider uses (``pid``, ``poll``,
``wait``), plus ``hello()``: the agent's handshake line. The server's stdout carries the lines
of all its agents, so whichever caller reads it files every line it finds by pid.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from skyward.bootstrap.procs import alive, wait_gone


def _let_go_in_child() -> None:
    """In a child forked from a program with a Local pool open: the server exits when its stdin
    reaches end of file, so a child holding a copy of the pipe's write end would keep it (and
    the parent's close would wait for it). The fd is pointed at /dev/null rather than closed,
    so that the file object, when collected, closes a descriptor that is still its own."""
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

    def __init__(self, env: dict[str, str], root: Path) -> None:
        self.log = root / "fork-server.log"
        with open(self.log, "ab") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "skyward.bootstrap.agent_start", "--fork-server"],
                cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file,
                start_new_session=True,
            )
        self._lock = threading.Lock()  # one reader of its stdout at a time
        self._pending = b""
        self._pids: dict[int, int] = {}  # node index -> agent pid
        self._hellos: dict[int, bytes] = {}  # agent pid -> its hello line
        self._ended = False
        ForkServer.running.add(self)

    def fork(self, index: int, argv: list[str], cwd: Path, log: Path,
             env: dict[str, str] | None = None) -> ForkedAgent:
        """Ask for node ``index``'s agent, with ``env`` added to the pool's environment (the
        node's own GPUs); raises OSError when the server is gone."""
        assert self.proc.stdin is not None
        request: dict[str, Any] = {"index": index, "argv": argv, "cwd": str(cwd), "log": str(log)}
        if env:
            request["env"] = env
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        return ForkedAgent(index, self)

    def wait_for(self, index: int, deadline: float, hello: bool) -> tuple[int | None, bytes | None]:
        """Node ``index``'s agent pid, and its hello line when ``hello``, reading the server's
        output until they come, it ends, or ``deadline`` (monotonic) passes."""
        with self._lock:
            while True:
                pid = self._pids.get(index)
                line = self._hellos.get(pid) if pid is not None else None
                if (pid is not None and (line is not None or not hello)) or self._ended:
                    return pid, line
                left = deadline - time.monotonic()
                if left <= 0 or not self._read(left):
                    return pid, line

    def _read(self, timeout: float) -> bool:
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


class ForkedAgent:
    """An agent the fork server started: not this process's child, so it is waited for by pid."""

    returncode: int | None = None

    def __init__(self, index: int, server: ForkServer) -> None:
        self.index = index
        self.server = server
        self._pid: int | None = None

    @property
    def pid(self) -> int:
        """The agent's pid (once the server has said it; -1 if it never does)."""
        if self._pid is None:
            pid, _ = self.server.wait_for(self.index, time.monotonic() + 30, hello=False)
            if pid is None:
                return -1
            self._pid = pid
        return self._pid

    def hello(self, timeout: float) -> bytes:
        """The agent's handshake line, or b"" when it did not come in time."""
        pid, line = self.server.wait_for(self.index, time.monotonic() + timeout, hello=True)
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


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_let_go_in_child)
