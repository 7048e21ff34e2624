"""A node's first worker, forked from its agent instead of started as a new interpreter.

On a Local pool every node's agent and worker start at once with the client, and on a small
machine that start is CPU-bound: a new interpreter and the imports it shares with the agent are
a third of what a worker costs before its first task. The agent forks its spare worker (see
``Supervisor.prestart``) while it is still single-threaded, before it serves anyone; the child
closes what is the agent's, becomes the session leader of its own process group (as a started
worker does), and runs the same worker code. Workers started later (replacements, process
executors, plugin launchers) are new interpreters, as before: by then the agent has threads,
and forking a threaded process is not safe.

``Forked`` is the part of ``subprocess.Popen`` that the agent uses, for such a child.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from .procs import wait_gone

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, NoReturn


class Forked:
    """A forked worker, as the agent handles a started one: pid, pipes, poll, wait, signals."""

    def __init__(self, pid: int, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._reap(block=False)

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            code = self._reap(block=True)
            assert code is not None
            return code
        deadline = time.monotonic() + timeout
        while True:
            code = self._reap(block=False)
            if code is not None:
                return code
            if not wait_gone(self.pid, max(0.0, deadline - time.monotonic())):
                import subprocess

                raise subprocess.TimeoutExpired(["skyward worker (forked)"], timeout)

    def _reap(self, block: bool) -> int | None:
        """The exit code once the child is gone (None while it runs). Never holds a lock while
        it waits: one thread may wait for good while another polls with a deadline."""
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:  # another thread of ours reaped it: it records the code now
            deadline = time.monotonic() + 1.0
            while self.returncode is None and time.monotonic() < deadline:
                time.sleep(0.001)
            if self.returncode is None:
                self.returncode = 0
            return self.returncode
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def live_forked(name: str, start: Callable[[], None]) -> NoReturn:
    """The life of a forked child: named ``name`` where ps -o comm and top look (its command
    line stays its parent's), then ``start()``; only os._exit leaves, with start's exit status
    (1 and the traceback on stderr for an exception)."""
    code = 1
    try:
        try:
            with open("/proc/self/comm", "w") as comm:
                comm.write(name)
        except OSError:
            pass
        start()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr, flush=True)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def fork_worker(env: dict[str, str], close: list[socket.socket], run: Callable[[], None]) -> Forked | None:
    """Fork a worker that calls ``run()`` (it serves until the worker exits) with ``env`` added
    to its environment, fds 1 and 2 on pipes to us, stdin on /dev/null and the sockets in
    ``close`` (the agent's) closed. None where this platform cannot fork."""
    if not hasattr(os, "fork"):
        return None
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker

        def start() -> None:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the worker installs its own when it serves
            for sock in close:
                sock.close()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (null, out_r, out_w, err_r, err_w):
                os.close(fd)
            os.environ.update(env)
            sys.argv = ["skyward-worker"]
            run()

        live_forked("skyward-worker", start)
    os.close(out_w)
    os.close(err_w)
    return Forked(pid, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
