"""Where a node's runtime folder and its agent's sockets go when another user of the node got
there first: a folder of our own whatever a stranger made, and Unix sockets whatever the path."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.script import NODE_DIRS

NOBODY = 65534


def _as_nobody(*argv: str) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (to act as another user)")
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv], check=True)


def _node_dirs(home: Path, run: Path) -> dict[str, str]:
    out = subprocess.run(["sh", "-c", NODE_DIRS + 'echo "@@sky $SKY"; echo "@@run $RUN"'],
                         env={"PATH": os.environ["PATH"], "HOME": str(home), "SKYWARD_NODE_RUN": str(run)},
                         capture_output=True, text=True, check=True).stdout
    return dict(line[2:].split(" ", 1) for line in out.splitlines() if line.startswith("@@"))


def test_a_strangers_run_folder_is_never_used_and_ours_stays_on_local_disk(tmp_path: Path) -> None:
    # (SKYWARD_NODE_RUN names the folder: the real /var/tmp/skyward-<uid> is other pools')
    taken = Path("/var/tmp") / f"skyward-{os.geteuid()}-taken-{os.urandom(4).hex()}"
    _as_nobody("mkdir", "-m", "777", str(taken))  # another user of the node, first
    home = tmp_path / "home"
    home.mkdir()
    made: list[str] = []
    try:
        first = _node_dirs(home, taken)
        made.append(first["run"])
        run = Path(first["run"])
        # Not the stranger's, not moved into the (maybe shared, maybe deep) home: a private
        # folder of our own on node-local disk, made anew.
        assert run != taken and home not in run.parents, first
        assert run.parent == Path("/var/tmp") and run.name.startswith(f"skyward-{os.geteuid()}."), first
        st = run.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
        # The next bootstrap on this host finds the same folder (its markers and pool folders).
        assert _node_dirs(home, taken)["run"] == first["run"]
        # Our folder went (a reboot's cleaning) and the stranger made one under its name: not
        # used either.
        shutil.rmtree(run)
        made.append(str(run))
        _as_nobody("mkdir", "-m", "777", str(run))
        again = _node_dirs(home, taken)["run"]
        made.append(again)
        assert again != str(run) and Path(again).stat().st_uid == os.geteuid()
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(taken, ignore_errors=True)


def test_an_agent_whose_folder_is_too_deep_still_listens_on_a_unix_socket_of_its_own(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True, mode=0o700)
    path = deep / "agent.sock"
    assert len(os.fsencode(str(path))) > 108
    env = dict(os.environ, SKYWARD_AGENT_TOKEN="secret-token")
    proc = subprocess.Popen([sys.executable, "-m", "skyward.bootstrap.agent_start", "--ttl", "30",
                             "--socket", str(path)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        hello = json.loads(proc.stdout.readline())
        assert "port" not in hello and "unix_error" not in hello, hello  # no loopback TCP port
        unix = Path(hello["unix"])
        assert len(os.fsencode(str(unix))) <= 100 and unix.name == "agent.sock", hello
        st = unix.parent.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(unix))
        ch = NodeChannel(sock, node=0, token="secret-token", ttl=30, on_output=lambda *a: None)
        assert ch.facts["pid"] == proc.pid
        ch.close(shutdown_agent=True)
        assert proc.wait(timeout=10) == 0
        assert not unix.parent.exists()  # its short folder goes with it
    finally:
        proc.kill()
        proc.wait()
