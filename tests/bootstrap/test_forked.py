"""A Local node's first worker is forked from its agent (bootstrap/forked.py); the workers
started later are new interpreters. Both serve the same."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

import skyward as sky


@sky.function
def ids() -> tuple[int, int, str, str]:
    pid = os.getpid()
    return pid, os.getppid(), Path(f"/proc/{pid}/comm").read_text().strip(), " ".join(sys.argv)


@sky.function
def die() -> None:
    os._exit(3)


@pytest.mark.skipif(not Path("/proc/self/comm").exists(), reason="needs /proc")
def test_the_first_worker_is_forked_and_its_replacement_started() -> None:
    with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
        pid, agent, comm, argv = ids() >> pool
        assert comm == "skyward-worker" and argv == "skyward-worker"
        assert os.getpgid(pid) == pid  # a session of its own, as a started worker's
        assert "skyward.bootstrap.agent" in Path(f"/proc/{agent}/cmdline").read_bytes().decode().replace("\0", " ")
        with pytest.raises(sky.WorkerDiedError, match="exit code 3"):
            die() >> pool
        pid2, agent2, comm2, _ = ids() >> pool
        assert (agent2, pid2 != pid) == (agent, True)
        assert comm2 != "skyward-worker"  # a new interpreter: python
        cmdline = Path(f"/proc/{pid2}/cmdline").read_bytes().decode().replace("\0", " ")
        assert "skyward.bootstrap.worker" in cmdline
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_a_timed_wait_ends_at_its_deadline_while_another_thread_waits_for_good() -> None:
    """The agent waits for a worker on its reader thread and, when it stops, with a deadline on
    another: the deadline must hold (a worker stuck in C code ignores SIGTERM)."""
    import subprocess
    import threading
    import time

    from skyward.bootstrap.forked import fork_worker

    def stuck() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(30)

    proc = fork_worker({}, [], stuck)
    assert proc is not None
    waiter = threading.Thread(target=proc.wait)
    waiter.start()
    try:
        time.sleep(0.2)
        proc.terminate()  # ignored
        start = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.5)
        assert time.monotonic() - start < 2
    finally:
        proc.kill()
        waiter.join(5)
    assert proc.returncode == -signal.SIGKILL and not waiter.is_alive()
