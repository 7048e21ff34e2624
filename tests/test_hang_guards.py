"""A test that catches a hang fails, and the run then goes on and ends.

Three guards: ``helpers.within`` runs a call in a daemon thread (a hung call's thread cannot keep
the interpreter from exiting), a ``map`` left waiting for an outcome that never comes ends when its
pool closes, and the suite's ``stuck_threads`` plugin ends a run that a stuck thread would keep
alive, showing the thread's stack."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import within

import skyward as sky
from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import Kind
from skyward.core import batches

TESTS = Path(__file__).resolve().parent
QUIET = sky.Options(console=False)

HUNG_TEST = '''
import threading

def test_catches_a_hang():
    threading.Thread(target=threading.Event().wait, name="stuck-in-a-hung-call").start()
    assert False, "the hang was caught"
'''

GREEN_TEST = '''
import threading

def test_passes_but_leaves_a_thread():
    threading.Thread(target=threading.Event().wait, name="left-behind").start()
'''


def _run_pytest(tmp_path: Path, source: str, *plugin: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_it.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(TESTS), "SKYWARD_TEST_STUCK_GRACE": "0.5"}
    try:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, "test_it.py"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the pytest run never exited: its stuck thread kept the interpreter alive")


def test_a_run_whose_test_left_a_stuck_thread_ends_with_the_failure_shown(tmp_path: Path) -> None:
    done = _run_pytest(tmp_path, HUNG_TEST, "-p", "stuck_threads")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the hang was caught" in done.stdout and "1 failed" in done.stdout
    assert "stuck-in-a-hung-call" in done.stderr  # the thread's name and stack, to find the hang
    assert "Event" in done.stderr or "wait" in done.stderr


def test_a_green_run_that_leaves_a_stuck_thread_fails_rather_than_hangs(tmp_path: Path) -> None:
    done = _run_pytest(tmp_path, GREEN_TEST, "-p", "stuck_threads")
    assert "1 passed" in done.stdout
    assert done.returncode == 1 and "left-behind" in done.stderr


def test_within_fails_a_hung_call_and_leaves_only_a_daemon_behind() -> None:
    release = threading.Event()
    before = set(threading.enumerate())
    with pytest.raises(pytest.fail.Exception, match=r"no outcome after 0\.2 s"):
        within(0.2, release.wait)
    left = [t for t in threading.enumerate() if t not in before]
    assert left and all(t.daemon for t in left)
    release.set()
    assert within(5, lambda x: x + 1, 1) == 2
    with pytest.raises(ZeroDivisionError):
        within(5, lambda: 1 / 0)


def _plus_one(x: int) -> int:
    return x + 1


def test_a_map_whose_outcome_never_comes_ends_when_its_pool_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    """With map's check for a lost outcome turned off and a chunk's outcome dropped, the map waits
    for nothing; closing its pool must end that wait with the pool's reason, not leave the
    caller's thread blocked for ever."""
    monkeypatch.setattr(batches._Watch, "missing", lambda self, out: None)
    real_submit = NodeChannel.submit
    dropped = threading.Event()

    def submit(self: NodeChannel, kind: int, flags: int, body: Any, buffers: list[Any], done: Any,
               *args: Any, **kwargs: Any) -> int:
        if kind == Kind.MAP and not dropped.is_set():
            dropped.set()
            done = lambda *a, **k: None  # noqa: E731  (the outcome goes nowhere)
        return real_submit(self, kind, flags, body, buffers, done, *args, **kwargs)

    monkeypatch.setattr(NodeChannel, "submit", submit)
    outcome: list[BaseException | list[int]] = []

    def call(pool: sky.Pool) -> None:
        try:
            outcome.append(pool.map(_plus_one, range(50), chunksize=10))
        except BaseException as e:
            outcome.append(e)

    with sky.Compute(nodes=1, options=QUIET) as pool:
        caller = threading.Thread(target=call, args=(pool,), daemon=True)
        caller.start()
        assert dropped.wait(30)
        time.sleep(1.5)
        assert caller.is_alive()  # waiting for the dropped chunk
    caller.join(15)
    assert not caller.is_alive(), "map still waits after its pool closed"
    assert isinstance(outcome[0], sky.PoolClosedError), outcome


IDLE_POOL_TEST = '''
from concurrent.futures import ThreadPoolExecutor

POOL = ThreadPoolExecutor(2)  # never shut down: its idle workers end with the interpreter

def test_uses_a_pool_and_leaves_it_idle():
    assert POOL.submit(lambda: 2).result() == 2
'''


def test_idle_thread_pool_workers_are_not_taken_for_stuck_threads(tmp_path: Path) -> None:
    done = _run_pytest(tmp_path, IDLE_POOL_TEST, "-p", "stuck_threads")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
    assert "still running" not in done.stderr


HUNG_MAP_TEST = '''
import threading

import pytest

import skyward as sky
from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import Kind
from skyward.core import batches


def plus_one(x):
    return x + 1


@pytest.mark.timeout(10)
def test_a_map_that_never_returns(monkeypatch):
    monkeypatch.setattr(batches._Watch, "missing", lambda self, out: None)
    real = NodeChannel.submit

    def submit(self, kind, flags, body, buffers, done, *args, **kwargs):
        if kind == Kind.MAP:
            done = lambda *a, **k: None
        return real(self, kind, flags, body, buffers, done, *args, **kwargs)

    monkeypatch.setattr(NodeChannel, "submit", submit)
    with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
        pool.map(plus_one, range(20), chunksize=10)
'''


def test_the_per_test_timeout_ends_a_call_that_never_returns_and_the_run_exits(tmp_path: Path) -> None:
    """A map whose outcomes never come, in the test's own thread: the suite's per-test timeout
    (pytest-timeout) fails the test, and the run then ends, showing why."""
    started = time.monotonic()
    done = _run_pytest(tmp_path, HUNG_MAP_TEST, "-p", "stuck_threads")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in done.stdout and "Timeout" in done.stdout
    assert time.monotonic() - started < 50
