"""Task functions shared by tests; importable on Local nodes (they get the client's sys.path)."""

from __future__ import annotations

import os
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
