"""A Local pool's fork server: one interpreter that has loaded the agent, from which every node's
agent of the pool is forked.

On a Local pool all the nodes start at once on this machine, and that start is CPU-bound: each
agent used to be a new interpreter that loaded the same modules (half of an agent's cost before
its first task). The provider now starts one process, ``python -m skyward.bootstrap.agent
--fork-server`` (which loads the agent module and starts no thread), and asks it for each node:
one JSON line on its stdin, ``{"index": 0, "argv": [...], "cwd": ..., "log": ...}`` (and
``"env"``: variables of that node's own, such as its GPUs; a warm server, one started before
its pool existed, also gets ``"environ"``, the node's whole environment, and ``"path"``, what
goes first on its import path). The index is the request's number, which the answer repeats. It forks a
child that becomes that node's agent as if it had been started with ``argv``: its own session,
stdin on /dev/null, stderr on the node's log, the pool's token in its environment. On stdout the
server says ``{"forked": index, "pid": pid}`` and the child then prints its usual hello
(``{"port": ..., "pid": ...}``); both are single writes shorter than a pipe's atomic size, so
the provider matches them by pid whatever their order.

The server reaps its children and exits once its stdin is closed (the client closed the pool,
detached from it, or died) and no agent of its runs any more. Agents stop on their own lease as
before; the server needs no ttl of its own.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
from collections.abc import Callable

from .forked import live_forked


def preload() -> None:
    """Load what every node's agent and first worker load before its first task (the agent,
    the head's collections and the load sampler; the worker and cloudpickle), so that the
    agents and their forked workers (forked.py) have it: once per pool instead of once per
    node, and before the client connects rather than after. Importing them starts no thread."""
    import cloudpickle  # noqa: F401

    from . import agent, metrics, state, worker  # noqa: F401


def serve(run_agent: Callable[[list[str]], None]) -> None:
    """Fork an agent per request on stdin (``run_agent(argv)`` in the child) until stdin ends
    and the last agent has exited."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (the wakeup fd is what wakes the loop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client decides; Ctrl-C is its to handle
    children: set[int] = set()
    pending = b""
    reading = True
    while reading or children:
        ready, _, _ = select.select([0, wake_r] if reading else [wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(children)
        if 0 not in ready:
            continue
        data = os.read(0, 65536)
        if not data:
            reading = False
            continue
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = _fork(request, run_agent, (wake_r, wake_w))
            children.add(pid)
            os.write(1, json.dumps({"forked": request["index"], "pid": pid}).encode() + b"\n")


def _reap(children: set[int]) -> None:
    for pid in list(children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            children.discard(pid)


def _fork(request: dict[str, object], run_agent: Callable[[list[str]], None], ours: tuple[int, int]) -> int:
    argv = [str(a) for a in request["argv"]]  # type: ignore[attr-defined]
    pid = os.fork()
    if pid:
        return pid

    def start() -> None:  # the agent
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in ours:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log = os.open(str(request["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(str(request["cwd"]))
        environ = request.get("environ")  # (a warm server's node: its whole environment)
        if isinstance(environ, dict):
            os.environ.clear()
            os.environ.update(environ)
        env = request.get("env")  # (this node's own variables: its GPUs)
        if isinstance(env, dict):
            os.environ.update(env)
        path = request.get("path")
        if isinstance(path, list):
            sys.path[0:0] = [str(p) for p in path]
        sys.argv = ["skyward-agent", *argv]
        run_agent(argv)

    live_forked("skyward-agent", start)
