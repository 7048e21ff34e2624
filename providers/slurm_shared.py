"""One look at the queue per login node, shared by every pool of this process.

Each look is an RPC to the site's controller. A program that opens ten pools at once (a sweep, in
threads) would otherwise ask ten times for what one ``squeue`` of the user's own jobs answers: the
pools waiting in the queue, and `skyward ls` judging several named pools, take their jobs' states
from the last answer for the login node and user when it is recent enough for them, and only one
of them asks at a time (the others wait for its answer rather than ask again).

A failed look (squeue's non-zero status, the login node unreachable) is shared too: it is "no
answer" for everyone, and each caller decides what that means (look again, slower).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

from . import slurm_queue as q

# The user's jobs, every state squeue still shows (ended ones for MinJobAge), then squeue's status.
MINE = (f"squeue -h --states=all -u \"$(id -un)\" -o '{q.SQUEUE_FORMAT}' 2>&1; echo \"@@squeue $?\"")


class SharedQueue:
    """The last answer of ``squeue -u <me>`` on one login node, and who is asking now."""

    def __init__(self) -> None:
        self._asking = threading.Lock()  # one look at a time; whoever waited reuses its answer
        self._last: tuple[float, q.Look] | None = None  # (when the look started, what it said)
        self.looks = 0  # looks this process made at this login node (for tests and benchmarks)

    def look(self, run: Callable[[str], tuple[int, str]], *, max_age: float) -> q.Look:
        """Every job of the user as the controller knows it, from an answer that started at most
        ``max_age`` seconds ago (asked now through ``run(command) -> (status, output)`` when there
        is none). A job the answer does not list is for the caller to confirm (``scontrol``)."""
        with self._asking:
            last = self._last
            if last is not None and time.monotonic() - last[0] <= max_age:
                return last[1]
            started = time.monotonic()
            self.looks += 1
            try:
                _, out = run(MINE)
                look = q.parse_look(out)
            except Exception as exc:
                look = q.Look({}, f"the login node could not be asked ({exc})")
            self._last = (started, look)
            return look


_QUEUES: dict[Hashable, SharedQueue] = {}
_QUEUES_LOCK = threading.Lock()


def queue_of(login: Hashable) -> SharedQueue:
    """The shared look of one login node and user (``login``: its (user, host, port))."""
    with _QUEUES_LOCK:
        found = _QUEUES.get(login)
        if found is None:
            found = _QUEUES[login] = SharedQueue()
        return found
