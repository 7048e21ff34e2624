"""Nothing is left running: normal exit, exceptions, Ctrl-C, a killed client."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import helpers
import pytest
from conftest import alive, kill_all, pool_dirs, wait_gone

import skyward as sky

agent_pid = sky.function(helpers.agent_pid)


def _agents(pool: sky.Pool) -> list[int]:
    pids = agent_pid() @ pool
    assert all(alive(p) for p in pids)
    return pids


def test_normal_exit_stops_agents_and_removes_workdirs() -> None:
    with sky.Compute(nodes=2) as pool:
        pids = _agents(pool)
        dirs = sky.function(os.getcwd)() @ pool
    assert wait_gone(pids, 0) == []
    assert not any(Path(d).exists() for d in dirs)


def test_exception_in_block_stops_agents() -> None:
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="user bug"), sky.Compute(nodes=2) as pool:
        pids = _agents(pool)
        raise RuntimeError("user bug")
    assert wait_gone(pids, 0) == []


def test_keyboard_interrupt_stops_agents() -> None:
    pids: list[int] = []
    with pytest.raises(KeyboardInterrupt), sky.Compute(nodes=2) as pool:
        pids = _agents(pool)
        raise KeyboardInterrupt
    assert wait_gone(pids, 0) == []


@contextlib.contextmanager
def client_script(tmp_path: Path, source: str) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """Run a client program that prints its agents' pids on its first line; clean up after."""
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(source))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    try:
        yield proc, pids
    finally:
        proc.kill()
        proc.wait()
        kill_all(pids)


def test_sigint_during_a_running_task_stops_agents(tmp_path: Path) -> None:
    source = """
        import os, time
        import skyward as sky

        @sky.function
        def forever():
            time.sleep(600)

        with sky.Compute(nodes=2) as pool:
            print(" ".join(map(str, sky.function(os.getppid)() @ pool)), flush=True)
            forever() >> pool
    """
    with client_script(tmp_path, source) as (proc, pids):
        time.sleep(0.3)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) != 0
        assert wait_gone(pids, 10) == []
        assert time.monotonic() - start < 2.5  # a busy worker is stopped, not waited for


def test_sigterm_stops_agents(tmp_path: Path) -> None:
    source = """
        import os, time
        import skyward as sky

        with sky.Compute(nodes=1) as pool:
            print(sky.function(os.getppid)() >> pool, flush=True)
            time.sleep(600)
    """
    with client_script(tmp_path, source) as (proc, pids):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert wait_gone(pids, 10) == []


# The client is SIGKILLed: nothing in it runs again, so only the agents' lease watchdog can
# clean up. A small reaper process adopts the orphans (PR_SET_CHILD_SUBREAPER) and exits once
# every one of them has exited, so its exit time is when the last agent was gone.
REAPER = """
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
client = subprocess.Popen([sys.executable, sys.argv[1]], stdout=subprocess.PIPE, text=True)
print(client.stdout.readline().strip(), flush=True)   # the agent pids, from the client
sys.stdin.readline()                                   # the test says: go
os.kill(client.pid, 9)
t0 = time.monotonic()
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
print(f"{time.monotonic() - t0:.2f}", flush=True)
"""

CLIENT = """
import os, time
import skyward as sky

@sky.function
def parent():
    return os.getppid()

with sky.Compute(nodes=2, ttl=3) as pool:
    print(pool.id, " ".join(map(str, parent() @ pool)), flush=True)
    time.sleep(600)
"""


def test_killed_client_agents_exit_within_ttl(tmp_path: Path) -> None:
    (tmp_path / "reaper.py").write_text(REAPER)
    (tmp_path / "client.py").write_text(CLIENT)
    reaper = subprocess.Popen(
        [sys.executable, str(tmp_path / "reaper.py"), str(tmp_path / "client.py")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert reaper.stdin is not None and reaper.stdout is not None
    pool_id, *agents = reaper.stdout.readline().split()
    pids = [int(p) for p in agents]
    # This pool's folders only: other skyward processes on the machine have their own.
    ours = {d for d in pool_dirs() if Path(d).name.startswith(f"skyward-{pool_id}-")}
    try:
        assert len(pids) == 2 and all(alive(p) for p in pids)
        assert len(ours) == 2, ours  # its working folder and its shared-memory folder
        reaper.stdin.write("go\n")
        reaper.stdin.flush()
        elapsed = float(reaper.stdout.readline())
        assert reaper.wait(timeout=30) == 0
        print(f"agents exited {elapsed:.2f} s after the client was killed")
        assert elapsed < 3 + 3, f"agents took {elapsed:.1f} s to exit after the client died (ttl 3 s)"
        assert not any(alive(p) for p in pids)
        assert not any(Path(d).exists() for d in ours)  # the agents removed the pool's folders too
    finally:
        reaper.kill()
        reaper.wait()
        kill_all(pids)


def test_pools_left_open_are_closed_at_exit(tmp_path: Path) -> None:
    script = tmp_path / "forgetful.py"
    script.write_text(textwrap.dedent("""
        import os
        import skyward as sky

        session = sky.Session()
        pool = session.compute(nodes=2)
        print(" ".join(map(str, sky.function(os.getppid)() @ pool)), flush=True)
        # no session.close(): the program just ends
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    try:
        assert wait_gone(pids, 5) == []
    finally:
        kill_all(pids)


def test_processes_started_by_tasks_do_not_outlive_the_pool() -> None:
    @sky.function
    def start_child() -> int:
        return subprocess.Popen(["sleep", "600"]).pid

    libc = ctypes.CDLL(None)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the orphaned child becomes ours to reap
    child = 0
    try:
        with sky.Compute(nodes=1) as pool:
            child = start_child() >> pool
            assert alive(child)
        assert wait_gone([child], 5) == []
    finally:
        kill_all([child] if child else [])
        if child:
            try:
                os.waitpid(child, 0)
            except ChildProcessError:
                pass
        libc.prctl(36, 0, 0, 0, 0)
