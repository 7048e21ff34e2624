"""An aborted joblib call frees the nodes before Parallel returns, and
``Parallel(backend="skyward")`` works in tasks and in the program's threads without the plugin."""

from __future__ import annotations

import os
import time
from multiprocessing import TimeoutError as JoblibTimeout  # what joblib raises
from time import sleep

import pytest

import skyward as sky

joblib = pytest.importorskip("joblib")
from joblib import Parallel, delayed  # noqa: E402

QUIET = sky.Options(console="silent")
# Bounds for "freed at once": generous for a loaded 2-core machine (a fresh node process may
# take seconds to start there), and still well under what a call waited before (5 or 10 s).
AT_ONCE = 3.0


def boom(i: int) -> int:
    if i == 0:
        raise ValueError("task 0 fails")
    sleep(5)
    return i


def spin(seconds: float) -> int:
    """Python code (interruptible), unlike sleep (a thread blocked in C)."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


@pytest.fixture(scope="module")
def pool():
    with sky.Compute(nodes=2, plugins=[sky.plugins.joblib()], options=QUIET) as p:
        yield p


def timed(call):
    start = time.monotonic()
    try:
        return call(), time.monotonic() - start
    except Exception as exc:
        return exc, time.monotonic() - start


def test_a_timed_out_call_frees_the_nodes_for_the_next(pool) -> None:
    # sleep(10) cannot be interrupted: each running batch's slot is replaced.
    err, took = timed(lambda: Parallel(n_jobs=2, timeout=0.1)(delayed(sleep)(10) for _ in range(10)))
    # joblib's own TimeoutError (multiprocessing's, as loky and threading raise), not the builtin
    assert type(err) is JoblibTimeout and took < AT_ONCE, (type(err), err, took)
    out, took = timed(lambda: Parallel(n_jobs=2, timeout=10)(delayed(sleep)(0.01) for _ in range(10)))
    assert out == [None] * 10 and took < AT_ONCE, (out, took)  # 10.05 s (TimeoutError) before


def test_an_error_in_one_task_frees_the_nodes_for_the_next(pool) -> None:
    err, _ = timed(lambda: Parallel(n_jobs=2)(delayed(boom)(i) for i in range(8)))
    assert isinstance(err, ValueError) and "task 0 fails" in str(err)
    out, took = timed(lambda: Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(4)))
    assert out == [0, 1, 2, 3] and took < AT_ONCE, (out, took)  # 5.0 s before


def test_interruptible_tasks_stop_where_they_run(pool) -> None:
    def fail_soon(i: int) -> int:
        if i == 0:
            sleep(0.2)
            raise KeyError("late")
        return spin(30)

    err, took = timed(lambda: Parallel(n_jobs=2)(delayed(fail_soon)(i) for i in range(6)))
    assert isinstance(err, KeyError) and took < AT_ONCE, (err, took)  # 30 s if not interrupted
    out, took = timed(lambda: Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(4)))
    assert out == [0, 1, 2, 3] and took < AT_ONCE, (out, took)


def test_a_dropped_generator_frees_the_nodes(pool) -> None:
    gen = Parallel(n_jobs=2, return_as="generator")(delayed(sleep)(i and 10) for i in range(6))
    assert next(gen) is None
    start = time.monotonic()
    gen.close()  # the caller stops consuming: joblib aborts
    out = Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(4))
    assert out == [0, 1, 2, 3] and time.monotonic() - start < AT_ONCE


def test_the_process_executor_replaces_the_process() -> None:
    with sky.Compute(nodes=2, worker=sky.Worker(executor="process"), plugins=[sky.plugins.joblib()],
                     options=QUIET):
        pids = set(Parallel(n_jobs=2)(delayed(os.getpid)() for _ in range(4)))
        err, took = timed(lambda: Parallel(n_jobs=2, timeout=0.2)(delayed(sleep)(10) for _ in range(6)))
        assert type(err) is JoblibTimeout and took < AT_ONCE, (type(err), err, took)
        # The two new processes start while the next call waits: seconds on a loaded machine,
        # 10 s (the sleeps) when the old processes were kept.
        out, took = timed(lambda: Parallel(n_jobs=2)(delayed(os.getpid)() for _ in range(4)))
        assert len(out) == 4 and not set(out) & pids and took < 2 * AT_ONCE, (out, pids, took)
