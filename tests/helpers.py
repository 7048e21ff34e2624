"""Task functions shared by tests; importable on Local nodes (they get the client's sys.path)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class CustomError(Exception):
    """A user-defined exception raised on a node."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


def agent_pid() -> int:
    return os.getppid()


def sleep_then(seconds: float, value: object = None) -> object:
    time.sleep(seconds)
    return value


def fresh_python_line(script: str, *args: str, **env: str) -> str:
    """The last line ``script`` printed, run by a fresh interpreter of this venv (``python -c``)
    with ``args`` and ``env`` added to this process's environment; fails the test if it failed."""
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def within(seconds: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a daemon thread: its value (or its exception, raised here), or
    the test fails when it has not returned within ``seconds``. The hung call's thread is left
    behind as a daemon, so it cannot keep the test run from exiting (a ``ThreadPoolExecutor``'s
    worker would: interpreter shutdown joins it)."""
    import pytest

    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the test's thread
            box["error"] = e

    thread = threading.Thread(target=call, name=f"within-{getattr(fn, '__name__', 'call')}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"no outcome after {seconds} s: the call waits for a task nobody will answer")
    if "error" in box:
        raise box["error"]
    return box["value"]


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "the condition", step: float = 0.05,
             ignoring: tuple[type[BaseException], ...] = ()) -> Any:
    """Poll ``check`` until it returns something truthy, and return that; an AssertionError
    naming ``what`` (and the last answer) after ``timeout`` seconds. Exceptions of the types in
    ``ignoring`` count as "not yet" (a page or a server that is not up yet)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except ignoring as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last: {last!r}")
        time.sleep(step)


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on ``address`` now (another process may take it before the caller binds
    it: fine for tests)."""
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def flood_silently(host: str, port: int, sources: list[str], per_source: int, stop: threading.Event) -> None:
    """Until ``stop``: hold ``per_source`` connections to ``host``:``port`` from each of the
    ``sources`` addresses, saying nothing, and open a new one for each the server closes (an
    idle stranger's flood that reopens every slot it loses)."""
    import select

    def opened(source: str) -> socket.socket:
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            s.bind((source, 0))
            s.connect((host, port))
        except OSError:
            s.close()
            raise
        return s

    socks = {opened(source): source for source in sources for _ in range(per_source)}
    try:
        while not stop.is_set():
            ready, _, _ = select.select(list(socks), [], [], 0.05)
            for s in ready:
                try:
                    gone = s.recv(4096) == b""
                except OSError:
                    gone = True
                if gone:
                    source = socks.pop(s)
                    s.close()
                    with contextlib.suppress(OSError):  # (not reachable now: one fewer held)
                        socks[opened(source)] = source
    finally:
        for s in socks:
            s.close()


class Recorder:
    """A pool's events as they come (``pool.subscribe(recorder)``); ``of(kind)`` the ones of a kind,
    once every event sent so far has been delivered."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        from skyward.observe import events

        events.bus.flush()
        with self._lock:
            return [e for e in self.events if isinstance(e, kind)]


def without_fork_server(monkeypatch: Any, why: str = "no fork server here") -> None:
    """Local nodes as their own interpreters, as where no fork server can run: the pool's own
    server and the warm one (providers/local_fork.py) both fail to start, and a warm one an
    earlier test left waiting goes first."""
    from skyward.providers import local, local_fork

    def broken(*_args: object, **_kwargs: object) -> None:
        raise OSError(why)

    local_fork._close_warm()
    monkeypatch.setattr(local, "ForkServer", broken)
    monkeypatch.setattr(local_fork, "ForkServer", broken)


def running_description(provider: Any, spec: Any, name: str, options: Any = None) -> dict[str, Any]:
    """Start ``spec``'s nodes on ``provider`` as pool ``name`` and let them run, as `skyward up`
    does: the description the registry stores (through JSON), the client detached."""
    import json

    cluster = provider.create(spec, name, *([options] if options is not None else []))
    cluster.start(spec.nodes.desired)
    description: dict[str, Any] = json.loads(json.dumps(cluster.describe()))
    cluster.detach()
    return description
