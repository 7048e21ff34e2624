"""Task functions shared by tests; importable on Local nodes (they get the client's sys.path)."""

from __future__ import annotations

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
