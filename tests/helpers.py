"""Task functions shared by tests; importable on Local nodes (they get the client's sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
import time


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
