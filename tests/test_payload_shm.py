"""Large payloads on Local pools go through shared memory, and no segment outlives its pool:
normal close, an exception in the block, a killed client, a killed node or worker, and a full
/dev/shm (a small tmpfs mounted for the test)."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import alive, kill_all, small_tmpfs, wait_gone
from test_teardown import REAPER

import skyward as sky
import skyward.providers.local as local_provider
from skyward.bootstrap.sweep import LOCK

MB8 = 1_000_000  # float64 elements: 8 MB


@sky.function
def echo(arr: np.ndarray) -> np.ndarray:
    return arr


@sky.function
def where_is(arr: np.ndarray) -> tuple[str, bool, int, int]:
    """How a node received its argument: what owns its memory, whether it is writable, and
    the worker's pid and its agent's."""
    base: object = arr
    while isinstance(base, np.ndarray | memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    arr[0] = -1.0  # writable without a copy of the whole
    return type(base).__name__, bool(arr.flags.writeable), os.getpid(), os.getppid()


@sky.function
def die() -> None:
    os._exit(3)


def _files(folder: Path) -> list[str]:
    """The segments in ``folder`` (not the lock its owners hold, bootstrap/sweep.py)."""
    return sorted(n for n in os.listdir(folder) if n != LOCK) if folder.exists() else []


def _mapped(folder: Path) -> list[str]:
    """This process's mappings of files in ``folder``."""
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if str(folder) in line]


def _root(arr: np.ndarray) -> object:
    base: object = arr
    while isinstance(base, np.ndarray | memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return base


def test_arrays_travel_through_reused_segments_without_copies() -> None:
    arr = np.random.default_rng(0).random(MB8)
    with sky.Compute(nodes=1) as pool:
        spill = pool.cluster.spill_dir
        assert spill is not None and str(spill).startswith("/dev/shm/")
        owner, writable, _, _ = where_is(arr) >> pool
        assert (owner, writable) == ("mmap", True)
        assert arr[0] != -1.0  # the node wrote into its own view, not into ours
        for _ in range(3):
            back = echo(arr) >> pool
            np.testing.assert_array_equal(back, arr)
            assert isinstance(_root(back), mmap.mmap) and back.flags.writeable
            del back
        # One segment for the client's argument, one for the worker's result, reused each time.
        assert len(_files(spill)) == 2, _files(spill)
        held = echo(arr) >> pool
    assert not spill.exists()
    assert _mapped(spill) == [f for f in _mapped(spill) if "(deleted)" in f]  # only what we hold
    np.testing.assert_array_equal(held, arr)  # still readable: its mapping outlives the file
    del held
    assert _mapped(spill) == []


def test_large_bytes_go_through_shared_memory_both_ways() -> None:
    data = os.urandom(16 << 20)
    with sky.Compute(nodes=1) as pool:
        spill = pool.cluster.spill_dir
        assert spill is not None
        for _ in range(2):
            assert (echo(data) >> pool) == data
        assert len(_files(spill)) == 2  # one segment each way, reused


def test_an_exception_in_the_block_removes_the_segments() -> None:
    arr = np.random.default_rng(1).random(MB8)
    spill = None
    with pytest.raises(RuntimeError, match="user bug"), sky.Compute(nodes=2) as pool:
        spill = pool.cluster.spill_dir
        results = [echo(arr) >> pool for _ in range(2)]
        assert len(_files(spill)) >= 2
        raise RuntimeError("user bug")
    assert spill is not None and not spill.exists()
    del results
    assert _mapped(spill) == []


def test_a_killed_worker_or_node_leaves_no_segment_behind() -> None:
    arr = np.random.default_rng(2).random(MB8)
    with sky.Compute(nodes=2) as pool:
        spill = pool.cluster.spill_dir
        assert spill is not None
        infos = where_is(arr) @ pool  # every worker has received a segment
        for _ in range(2):
            for back in echo(arr) @ pool:  # and made one of its own
                np.testing.assert_array_equal(back, arr)
            del back
        workers = {pid for _, _, pid, _ in infos}
        owned = {name.split("-")[0] for name in _files(spill)}
        assert {str(pid) for pid in workers} <= owned
        # A worker that dies: its agent starts another and removes the dead one's segments.
        with pytest.raises(sky.WorkerDiedError):
            die() >> pool
        left = {name.split("-")[0] for name in _files(spill)}
        assert len(workers & {int(p) for p in left}) == 1, (workers, left)
        # A node killed outright (agent and worker): the pool goes on with the other.
        victim = infos[0][3]
        os.kill(victim, signal.SIGKILL)
        assert wait_gone([victim], 10) == []
        np.testing.assert_array_equal(echo(arr) >> pool, arr)
    assert not spill.exists()


CLIENT = """
import os, sys, time
import numpy as np
import skyward as sky

@sky.function
def hold(arr):
    return os.getppid(), arr  # the node keeps nothing; the client gets a segment back

with sky.Compute(nodes=2, ttl=3) as pool:
    arr = np.ones(1_000_000)
    kept = [hold(arr) >> pool for _ in range(2)]
    print(pool.cluster.spill_dir, *sorted({p for p, _ in kept}), flush=True)
    time.sleep(600)
"""


def test_a_killed_client_leaves_no_segment_behind(tmp_path: Path) -> None:
    """SIGKILL: the client cleans nothing; the agents' lease watchdog removes the folder."""
    (tmp_path / "reaper.py").write_text(REAPER)
    (tmp_path / "client.py").write_text(CLIENT)
    reaper = subprocess.Popen(
        [sys.executable, str(tmp_path / "reaper.py"), str(tmp_path / "client.py")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert reaper.stdin is not None and reaper.stdout is not None
    spill, *agents = reaper.stdout.readline().split()
    pids = [int(p) for p in agents]
    try:
        assert len(_files(Path(spill))) >= 2 and all(alive(p) for p in pids)
        reaper.stdin.write("go\n")
        reaper.stdin.flush()
        float(reaper.stdout.readline())  # every agent has exited
        assert reaper.wait(timeout=30) == 0
        assert not Path(spill).exists()
    finally:
        reaper.kill()
        reaper.wait()
        kill_all(pids)


@pytest.fixture
def full_shm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Local pools make their shared-memory folder in a 24 MB tmpfs."""
    with small_tmpfs("24m") as folder:
        monkeypatch.setattr(local_provider, "SHM", folder)
        yield folder


def test_a_full_shared_memory_falls_back_to_the_stream(full_shm: Path, capfd: pytest.CaptureFixture[str]) -> None:
    small = np.random.default_rng(3).random(250_000)  # 2 MB: fits
    big = np.random.default_rng(4).random(4 * MB8)  # 32 MB: does not
    with sky.Compute(nodes=1) as pool:
        spill = pool.cluster.spill_dir
        assert spill is not None and spill.parent == full_shm
        back = echo(big) >> pool
        np.testing.assert_array_equal(back, big)
        assert not isinstance(_root(back), mmap.mmap) and back.flags.writeable  # the stream's bytes
        err = capfd.readouterr().err  # said once by the client, once by the node
        assert "WARNING skyward.shm: no room for a 32 MB buffer" in err and "[node 0] no room" in err
        owner, _, _, _ = where_is(small) >> pool
        assert owner == "mmap"
        np.testing.assert_array_equal(echo(small) >> pool, small)
    assert list(full_shm.iterdir()) == []


def test_a_program_that_ends_without_closing_its_pool_leaves_no_segment(tmp_path: Path) -> None:
    """The pools left open are closed at exit (session), segments and all."""
    script = tmp_path / "forgetful.py"
    script.write_text(textwrap.dedent("""
        import os, numpy as np, skyward as sky
        session = sky.Session()
        pool = session.compute(nodes=1)
        out = sky.function(lambda a: (os.getppid(), a))(np.ones(1_000_000)) >> pool
        print(pool.cluster.spill_dir, out[0], flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    spill, agent = out.stdout.split()
    try:
        assert wait_gone([int(agent)], 5) == []
        assert not Path(spill).exists()
    finally:
        kill_all([int(agent)])
