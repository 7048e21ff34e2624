"""A pytest plugin (the suite's conftest takes its hooks): a run whose tests left a thread stuck
in a hung call still ends.

A test that catches a hang fails, and the run must then go on and end. A thread still stuck in the
hung call (a ``ThreadPoolExecutor``'s worker, any thread that is not a daemon) would otherwise keep
the interpreter from exiting for ever, since its shutdown joins such threads before anything else:
a clear red test would become a CI run that passes its time limit and shows nothing. At the end of
the session, threads that are not daemons and outlive a grace period are listed with their stacks,
the exit hooks run (pools closed, test hosts removed) and the process exits with the session's
status, or 1 if the tests passed: a stuck thread is a failure of its own."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from types import FrameType

import pytest

# Seconds the threads left at the end get to finish; SKYWARD_TEST_STUCK_GRACE sets it (the
# plugin's own test sets a short one).
GRACE = float(os.environ.get("SKYWARD_TEST_STUCK_GRACE", "60"))
_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if not _exit_status or threading.current_thread() is not threading.main_thread():
        return
    stuck = stuck_threads(GRACE)
    if not stuck:
        return
    frames = sys._current_frames()
    lines = [f"\n{len(stuck)} thread(s) still running {GRACE:g} s after the last test would keep "
             "this run from ever exiting; exiting without them. Their stacks:"]
    for t in stuck:
        frame = frames.get(t.ident or -1)
        lines.append(f"--- thread {t.name!r} ---")
        lines.append("".join(traceback.format_stack(frame)) if frame is not None else "(no frame)\n")
    print("\n".join(lines), file=sys.stderr, flush=True)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status[-1] or 1)


def stuck_threads(grace: float) -> list[threading.Thread]:
    """The threads that are not daemons and are still alive after up to ``grace`` seconds,
    leaving out the idle workers of thread pools (asyncio's default executor among them): the
    interpreter's shutdown ends those itself."""
    deadline = time.monotonic() + grace
    while True:
        frames = sys._current_frames()
        left = [t for t in threading.enumerate()
                if t is not threading.main_thread() and not t.daemon and t.is_alive()
                and not _idle_pool_worker(frames.get(t.ident or -1))]
        if not left or time.monotonic() >= deadline:
            return left
        left[0].join(min(0.2, max(0.0, deadline - time.monotonic())))


_WAITING = (os.sep + "threading.py", os.sep + "queue.py")
_POOL_WORKER = os.path.join("concurrent", "futures", "thread.py")


def _idle_pool_worker(frame: FrameType | None) -> bool:
    """Whether this stack is a ``ThreadPoolExecutor`` worker waiting for its next work item
    (nothing but the queue's wait above its loop), not one running a call."""
    while frame is not None:
        name = frame.f_code.co_filename
        if frame.f_code.co_name == "_worker" and name.endswith(_POOL_WORKER):
            return True
        if not name.endswith(_WAITING):
            return False
        frame = frame.f_back
    return False
