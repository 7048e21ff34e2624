"""Whether a process runs, as the node side and the client's sweeps need to know it."""

from __future__ import annotations

import os


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
