"""A Local pool whose every process was SIGKILLed (the OOM killer does this) leaves its folders,
in the temp folder and in shared memory: the next pool, and `skyward ls`, remove them, while
a live pool's folders (a program's, and a named pool's whose client is gone) and another user's
stay. Real pools, real processes, real kills."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from skyward.bootstrap.sweep import LOCK
from skyward.providers.local import SHM

from .conftest import CLI
from .dashboard_helpers import program, wait_for

pytestmark = pytest.mark.timeout(240)

HOLD = """
    import sys, skyward as sky

    with sky.Compute(nodes=2, options=sky.Options(console="silent")) as pool:
        assert pool.map(abs, range(-4, 4)) == [4, 3, 2, 1, 0, 1, 2, 3]
        print(pool.id, flush=True)
        sys.stdin.readline()
"""


def _folders(pool_id: str) -> list[Path]:
    return sorted([*Path(tempfile.gettempdir()).glob(f"skyward-{pool_id}-*"), *SHM.glob(f"skyward-{pool_id}-*")])


def _started(cli: CLI) -> tuple[subprocess.Popen[str], str]:
    proc = program(cli, HOLD)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, proc.communicate(timeout=30)
    return proc, line


def _kill_every_process_of(cli: CLI, proc: subprocess.Popen[str], spared: set[int]) -> None:
    """SIGKILL the program and every process it started (agents, workers, the fork server)."""
    victims = {proc.pid, *cli.processes()} - spared
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate(timeout=30)
    cli.seen.update(victims)
    wait_for(lambda: not (set(cli.processes()) & victims), 20, "the killed processes to be gone")


def _theirs(tag: str) -> Path | None:
    """A folder of another user, named like a dead pool's, with an unheld lock in it."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    folder = Path(tempfile.gettempdir()) / f"skyward-{tag}-theirs"
    subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                    f"mkdir -m 700 {folder} && echo kept > {folder}/file && : > {folder}/{LOCK}"],
                   check=True, cwd="/")
    return folder


def test_the_next_pool_and_ls_sweep_the_folders_of_a_killed_pool_and_nothing_else(cli: CLI) -> None:
    up = cli("up", "kept", "--provider", "local", "--nodes", "1", "--ttl", "120")
    assert up.code == 0, up
    named_root = Path(cli.record("kept")["cluster"]["root"])
    named_agents = set(cli.processes())  # its client (`skyward up`) is gone: only its agents hold it
    live, live_id = _started(cli)
    spared = named_agents | set(cli.processes())
    theirs = _theirs(uuid.uuid4().hex[:8])
    try:
        for sweeper in ("ls", "a new pool"):
            dead, dead_id = _started(cli)
            made = _folders(dead_id)
            assert len(made) == 2 and all((f / LOCK).exists() for f in made), made  # temp and /dev/shm
            _kill_every_process_of(cli, dead, spared)
            assert _folders(dead_id) == made  # nobody left to remove them
            if sweeper == "ls":
                assert cli("ls").code == 0
            else:
                ran = cli.python("""
                    import skyward as sky
                    with sky.Compute(nodes=1, options=sky.Options(console="silent")) as pool:
                        assert pool.map(abs, [-1]) == [1]
                """)
                assert ran.code == 0, ran
            assert _folders(dead_id) == [], f"{sweeper} left the killed pool's folders"
            assert len(_folders(live_id)) == 2, "a live program's pool lost its folders"
            assert named_root.is_dir(), "a named pool whose agents run lost its folder"
            if theirs is not None:
                assert (theirs / "file").read_text().strip() == "kept", "another user's folder was removed"
        live.communicate("\n", timeout=60)
        assert live.returncode == 0
        assert _folders(live_id) == []  # (closed: it removed its own)
    finally:
        if live.poll() is None:
            live.kill()
            live.communicate(timeout=30)
        if theirs is not None:
            shutil.rmtree(theirs, ignore_errors=True)


def test_an_agents_shared_memory_folder_goes_once_its_agent_is_killed(tmp_path: Path) -> None:
    """SSH and Slurm nodes: an agent's /dev/shm folder is held by its lock, in whatever pid
    namespace; the next agent's start removes it once the agent is gone."""
    if not os.access(SHM, os.W_OK):
        pytest.skip("no writable /dev/shm")
    make = textwrap.dedent("""
        import sys
        from skyward.bootstrap import agent
        print(agent._node_spill_dir(), flush=True)
        sys.stdin.readline()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", make], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        folders = [Path(p.stdout.readline().strip()) for p in procs if p.stdout is not None]
        assert all(f.is_dir() and (f / LOCK).exists() for f in folders), folders
        # The name says "another pid namespace": only the lock can tell whether its agent lives.
        moved = [f.with_name(f.name.replace(f"-{f.name.split('-')[3]}-", "-1-", 1)) for f in folders]
        for f, m in zip(folders, moved, strict=True):
            f.rename(m)
        procs[0].kill()
        procs[0].wait()
        from skyward.bootstrap import sweep

        removed = sweep.sweep_nodes()
        assert moved[0] in removed and not moved[0].exists()
        assert moved[1].is_dir(), "a live agent's folder was removed"
    finally:
        for p in procs:
            if p.poll() is None:
                p.communicate("\n", timeout=30)
        for f in [*folders, *moved]:
            shutil.rmtree(f, ignore_errors=True)
