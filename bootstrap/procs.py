"""Whether a process runs, and waiting until it does not, as the node side and the client's
sweeps need to know it; and what a fork must wait for (``hold_over_fork``)."""

from __future__ import annotations

import os
import select
import time

# A worker's exit status after a SIGTERM (as a shell reports one): its handler exits with it, so
# the agent can tell a worker stopped from outside from one that crashed (agent.worker_exited).
TERMINATED = 128 + 15

TYPE_CHECKING = False
if TYPE_CHECKING:  # (a Local pool's fork server loads this module: no typing at run time)
    from collections.abc import Callable
    from typing import Any


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


def hold_over_fork(held: Callable[[], list[Any]]) -> None:
    """From now on, each fork of this process first takes what ``held()`` returns (locks, or
    logging handlers: anything with ``acquire`` and ``release``) and lets go just after, in the
    parent and in the child. Whatever a thread does while holding one of them (a write to a
    buffered file) is then never half done in a child, where nothing would finish it: a file's
    buffer inherited locked hangs the child for good when it flushes that file at its exit."""
    taken: list[Any] = []

    def before() -> None:
        items = held()
        for item in items:
            item.acquire()
        taken[:] = items

    def after() -> None:
        items, taken[:] = list(taken), []
        for item in items:
            try:
                item.release()
            except RuntimeError:  # (in the child, a lock its owner's module made anew already)
                pass

    os.register_at_fork(before=before, after_in_parent=after, after_in_child=after)
