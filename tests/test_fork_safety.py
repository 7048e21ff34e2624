"""Fork safety: a child forked while pools are open owns none of them.

A program that forks (os.fork, multiprocessing's fork start method, a library that
daemonizes) hands its child the pool objects, their sockets and the exit hooks. The child
must never close, stop, detach or write to the parent's pools, and gets InheritedPoolError
when it tries to use one. The same for the event bus, the dashboard hook and the log file.
The named-pool variant is tests/cli/test_fork_safety_named.py, the sshd one
tests/ssh/test_fork_safety.py.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fork_program
import pytest

import skyward as sky
from skyward.observe import events as ev
from skyward.observe import logs

pytestmark = pytest.mark.timeout(180)


def _wait_child(pid: int, timeout: float = 20) -> int:
    """The child's exit code; a child still running after ``timeout`` is killed (and waited for)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child {pid} did not end within {timeout} s")


def _in_child(body: Any) -> dict[str, Any]:
    """Run ``body()`` in a forked child that ends with os._exit; return what it returned (JSON)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # never returns into pytest
        try:
            os.close(r)
            try:
                answer = {"ok": body()}
            except BaseException as exc:
                answer = {"error": repr(exc)}
            os.write(w, json.dumps(answer).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as out:
        code = _wait_child(pid)  # small answers: the pipe never fills before the child ends
        result: dict[str, Any] = json.loads(out.read() or b"null")
    assert code == 0
    assert "error" not in result, result["error"]
    return result["ok"]


# -- pools ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["exit", "os._exit", "mp"])
def test_a_forked_child_leaves_the_parents_local_pool_alone(tmp_path: Path, mode: str) -> None:
    report = fork_program.run(tmp_path, [mode])
    fork_program.check(report, [mode])


def test_the_error_says_whose_pool_it_is_and_what_to_do() -> None:
    with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
        seen = _in_child(lambda: _raised(lambda: sky.function(os.getpid)() >> pool))
    kind, message = seen
    assert kind == "InheritedPoolError"
    assert issubclass(sky.InheritedPoolError, sky.PoolClosedError)
    assert f"belongs to process {os.getpid()}, which opened it" in message
    assert "with sky.Compute(...) as pool:" in message and "sky.Compute(name=NAME)" in message


def test_a_living_forked_child_does_not_hold_up_the_parents_close() -> None:
    """The Local fork server exits at the end of its stdin: a child must not keep that pipe open."""
    with sky.Compute(nodes=2, options=sky.Options(console=False)) as pool:
        assert sky.function(os.getpid)() >> pool > 0
        pid = os.fork()
        if pid == 0:
            try:
                time.sleep(30)
            finally:
                os._exit(0)
        start = time.monotonic()
        # (Seen once in CI, not reproduced since: a close that took the child's 30 s. Should it
        # come back, the stacks of what the close waits on are in the failure's output.)
        faulthandler.dump_traceback_later(10, exit=False)
    took = time.monotonic() - start
    faulthandler.cancel_dump_traceback_later()
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert took < 3, f"the pool took {took:.1f} s to close while a forked child lived"


@sky.function
def fork_and_count(name: str) -> tuple[int, int]:
    """On a node: a child forked inside the task counts too, then the task counts again."""
    counter = sky.counter(name)
    counter.increment()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            sky.counter(name).increment()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    counter.increment()
    return os.waitstatus_to_exitcode(status), counter.value


def test_a_child_forked_inside_a_task_opens_its_own_collections_connection() -> None:
    with sky.Compute(nodes=2, options=sky.Options(console=False)) as pool:
        assert pool.counter("forks").value == 0  # (served before the tasks run)
        code, value = pool.run(fork_and_count("forks"), target=1)  # not the head: over the listener
        assert code == 0 and value == 3
        assert pool.counter("forks").value == 3


def _raised(call: Any) -> list[str] | None:
    try:
        call()
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    return None


def test_a_pool_left_open_at_exit_is_closed_by_its_opener_not_by_a_child(tmp_path: Path) -> None:
    """A Session left open: the child's exit hook must not close it; the parent's still does."""
    script = tmp_path / "forgetful.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import skyward as sky

        session = sky.Session(options=sky.Options(console=False))
        pool = session.compute(nodes=2)
        before = sky.function(os.getppid)() @ pool
        child = os.fork()
        if child == 0:
            sys.exit(0)  # the exit hook that closes pools left open runs here
        os.waitpid(child, 0)
        after = sky.function(os.getppid)() @ pool
        print(before == after, " ".join(map(str, after)), flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    same, *pids = out.stdout.split()
    assert same == "True", out.stdout + out.stderr
    from conftest import kill_all, wait_gone

    try:
        assert wait_gone([int(p) for p in pids], 5) == []  # the parent closed it at its exit
    finally:
        kill_all([int(p) for p in pids])


def test_a_child_forked_while_the_pool_writes_its_log_exits(tmp_path: Path) -> None:
    """A thread writing the pool's log file when another forks held the file's buffer: the
    child hung for good at its exit, which flushes that buffer. Our handlers are held over
    the fork, so no child inherits a write in progress."""
    script = tmp_path / "logging_fork.py"
    script.write_text(textwrap.dedent("""
        import logging, os, sys, threading, time
        import skyward as sky

        session = sky.Session(options=sky.Options(console=False))
        pool = session.compute(nodes=1)
        log = logging.getLogger("skyward.observe.events")  # (the pool's log file's handler)
        threading.Thread(target=lambda: [log.info("x" * 3000) for _ in iter(int, 1)], daemon=True).start()
        for i in range(100):
            child = os.fork()
            if child == 0:
                sys.exit(0)  # the exit flushes what the child has of the parent's files
            end = time.monotonic() + 10
            while not os.waitpid(child, os.WNOHANG)[0]:
                if time.monotonic() > end:
                    os.kill(child, 9)
                    os.waitpid(child, 0)
                    print("hung", i, flush=True)
                    os._exit(1)
                time.sleep(0.005)
        print("ok", flush=True)
        session.close()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr[-3000:]


# -- the event bus --------------------------------------------------------------------------------
def test_a_forked_childs_events_reach_its_subscribers_and_not_the_parents_views() -> None:
    got: list[str] = []
    unsubscribe_all = sky.subscribe(lambda e: got.append(f"all:{e.pool}"))
    unsubscribe_one = ev.bus.subscribe(lambda e: got.append(f"one:{e.pool}"), "parents-pool")
    try:
        ev.emit(ev.Log(pool="parents-pool", level="INFO", message="before the fork"))
        ev.bus.flush(5)
        assert got == ["all:parents-pool", "one:parents-pool"]

        def child() -> list[str]:
            got.clear()
            ev.emit(ev.Log(pool="parents-pool", level="INFO", message="in the child"))
            ev.emit(ev.Log(pool="childs-pool", level="INFO", message="in the child"))
            ev.bus.flush(5)
            return list(got)

        # A subscription to every pool is this process's too; the parent's view of its pool is not.
        assert _in_child(child) == ["all:parents-pool", "all:childs-pool"]
    finally:
        unsubscribe_all()
        unsubscribe_one()


# -- the log file ---------------------------------------------------------------------------------
def test_a_forked_child_neither_writes_nor_rotates_the_parents_log_file(tmp_path: Path) -> None:
    path = tmp_path / "skyward.log"
    handle = logs.configure(sky.LogConfig(file=str(path), rotation="2 KB", retention=3, console=False))
    log = logging.getLogger("skyward.test")
    try:
        log.warning("parent before the fork")

        def child() -> bool:
            for i in range(200):  # ten times the rotation size
                log.warning("child line %d %s", i, "x" * 40)
            handle.close()  # the parent's: nothing of it is closed here
            return True

        assert _in_child(child)
        log.warning("parent after the fork")
        assert not handle.closed and handle.handlers
        text = path.read_text()
        assert "child line" not in text
        assert "parent before the fork" in text and "parent after the fork" in text
        assert not list(tmp_path.glob("skyward.log.*")), "the child rotated the parent's log file"
    finally:
        handle.close()


# -- the dashboard hook ---------------------------------------------------------------------------
class _Ingest(BaseHTTPRequestHandler):
    posts: list[tuple[str, Any]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posts.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[Path, list[tuple[str, Any]]]]:
    """A stand-in dashboard that records what programs post; (SKYWARD_HOME, posts)."""
    home = tmp_path / "home"
    (home / "dashboard").mkdir(parents=True)
    posts: list[tuple[str, Any]] = []
    handler = type("Ingest", (_Ingest,), {"posts": posts})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    info = {"url": f"http://127.0.0.1:{server.server_address[1]}", "token": "t", "pid": os.getpid()}
    (home / "dashboard" / "server.json").write_text(json.dumps(info))
    try:
        yield home, posts
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_forked_child_does_not_post_the_parents_dashboard_events(dashboard: tuple[Path, list[Any]],
                                                                   tmp_path: Path) -> None:
    home, posts = dashboard
    script = tmp_path / "watched.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        import skyward as sky
        from skyward.dashboard import hook
        from skyward.observe.events import bus

        hook.SEND_EVERY = 30  # after its first look the hook waits: the task's events stay queued
        with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
            deadline = time.monotonic() + 20
            while not (hook._link is not None and pool.id in hook._link.subscribed):
                assert time.monotonic() < deadline, "the hook never found the dashboard"
                time.sleep(0.05)
            sky.function(os.getpid)() >> pool
            bus.flush(5)
            child = os.fork()
            if child == 0:
                sys.exit(0)  # its exit hooks run: one sends what the dashboard link has queued
            os.waitpid(child, 0)
            print(pool.id, flush=True)
    """))
    env = {**os.environ, "SKYWARD_HOME": str(home)}
    env.pop("PYTEST_CURRENT_TEST", None)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=env)
    assert out.returncode == 0, out.stderr
    pool_id = out.stdout.split()[-1]
    events = [e for path, batch in posts if path == "/api/ingest/events" for e in batch if e["pool"] == pool_id]
    started = [e for e in events if e["type"] == "TaskStarted"]
    assert len(started) == 1, f"the task's start was posted {len(started)} times: {events}"
    assert sum(1 for e in events if e["type"] == "ClusterDestroyed") == 1
