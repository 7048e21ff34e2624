"""Whether a process runs, and waiting until it does not, as the node side and the client's
sweeps need to know it."""

from __future__ import annotations

import os
import select
import time


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: init may never reap it here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def wait_gone(pid: int, timeout: float | None) -> bool:
    """Wait up to ``timeout`` s (None: for good) until ``pid`` no longer runs; True once it
    does not. Woken by its exit (a pidfd) where the kernel has them, else it looks every 10 ms.
    It reaps nothing: a child of ours still has to be waited for."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        fd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here, or no such process any more
        fd = None
    try:
        while alive(pid):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if fd is None:
                time.sleep(0.01 if left is None else min(0.01, left))
            elif select.select([fd], [], [], left)[0]:
                return True  # the process the pidfd names exited (its pid may be another's now)
        return True
    finally:
        if fd is not None:
            os.close(fd)
