"""The agent process on its own: handshake, token check, lease watchdog."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skyward.bootstrap.channel import NodeChannel
from skyward.errors import ProtocolError


def start_agent(ttl: float, token: str = "secret-token") -> tuple[subprocess.Popen[bytes], int]:
    env = dict(os.environ, SKYWARD_AGENT_TOKEN=token)
    proc = subprocess.Popen(
        [sys.executable, "-m", "skyward.bootstrap.agent_start", "--ttl", str(ttl)],
        stdout=subprocess.PIPE, env=env,
    )
    assert proc.stdout is not None
    port = json.loads(proc.stdout.readline())["port"]
    return proc, port


def test_listens_on_loopback_only_and_refuses_a_wrong_token() -> None:
    proc, port = start_agent(ttl=30)
    try:
        with pytest.raises(ProtocolError, match="token"):
            NodeChannel(socket.create_connection(("127.0.0.1", port)), node=0, token="wrong",
                        ttl=30, on_output=lambda *a: None)
        ch = NodeChannel(socket.create_connection(("127.0.0.1", port)), node=0,
                         token="secret-token", ttl=30, on_output=lambda *a: None)
        assert ch.facts["pid"] == proc.pid
        ch.close(shutdown_agent=True)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
    out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout if _has_ss() else ""
    assert f":{port} " not in out


def _has_ss() -> bool:
    return subprocess.run(["sh", "-c", "command -v ss"], capture_output=True).returncode == 0


def test_refuses_to_start_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SKYWARD_AGENT_TOKEN"}
    proc = subprocess.run([sys.executable, "-m", "skyward.bootstrap.agent_start"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "SKYWARD_AGENT_TOKEN" in proc.stderr


def test_exits_when_nobody_renews_the_lease() -> None:
    proc, _port = start_agent(ttl=1)
    start = time.monotonic()
    try:
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - start < 1 + 2
    finally:
        proc.kill()
        proc.wait()


def test_lease_renewed_by_pings_then_expires_after_disconnect() -> None:
    proc, port = start_agent(ttl=1)
    try:
        ch = NodeChannel(socket.create_connection(("127.0.0.1", port)), node=0,
                         token="secret-token", ttl=1, on_output=lambda *a: None)
        for _ in range(8):  # 2 s of pings: the agent must stay
            ch.ping()
            time.sleep(0.25)
        assert proc.poll() is None
        ch.close()
        assert proc.wait(timeout=5) == 0
    finally:
        proc.kill()
        proc.wait()


def test_command_line_forms_and_mistakes() -> None:
    from skyward.bootstrap.agent_start import _parse_args

    args = _parse_args(["--ttl", "30", "--port=0", "--orphan-cleanup", "/a", "--orphan-cleanup=/b",
                        "--unix", "/tmp/x.sock", "--log", "agent.log"])
    assert (args.ttl, args.port, args.orphan_cleanup, args.unix, args.log) == (30.0, 0, ["/a", "/b"], "/tmp/x.sock", "agent.log")
    assert (args.host, args.direct) == ("127.0.0.1", None)
    with pytest.raises(SystemExit, match="unknown option '--tll'"):
        _parse_args(["--tll", "3"])
    with pytest.raises(SystemExit, match="--ttl takes a number, got 'soon'"):
        _parse_args(["--ttl", "soon"])
    with pytest.raises(SystemExit, match="--log needs a value"):
        _parse_args(["--log"])


def test_the_shared_memory_sweep_leaves_other_pid_namespaces_alone() -> None:
    """Containers (and the SSH test hosts) may share /dev/shm while each counts its own pids: a
    folder of another namespace is never taken for a dead agent's."""
    import shutil
    import tempfile
    from pathlib import Path

    from skyward.bootstrap import agent

    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    ns = agent._pid_namespace()
    dead = 2**22 + 17  # above pid_max's default: no process has it
    theirs = Path(tempfile.mkdtemp(prefix=f"skyward-node-{dead}-{ns}1-", dir="/dev/shm"))
    ours_dead = Path(tempfile.mkdtemp(prefix=f"skyward-node-{dead}-{ns}-", dir="/dev/shm"))
    made = agent._node_spill_dir()
    try:
        assert made is not None and made.name.startswith(f"skyward-node-{os.getpid()}-{ns}-")
        assert theirs.exists() and not ours_dead.exists()
    finally:
        for p in (theirs, ours_dead, made):
            if p is not None:
                shutil.rmtree(p, ignore_errors=True)


def test_the_start_up_line_comes_before_the_agents_modules_import_and_a_client_connects_meanwhile(
        tmp_path: Path) -> None:
    """Whoever started the agent reads where it listens and connects while the agent's own modules
    (frames, handshake, pickling, shared memory) still import: ``-X importtime`` writes each import
    to stderr, which is the caller's pipe until the start-up line is out and the agent's log after."""
    log = tmp_path / "agent.log"
    env = dict(os.environ, SKYWARD_AGENT_TOKEN="secret-token")
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "skyward.bootstrap.agent_start", "--ttl", "30",
                             "--socket", str(tmp_path / "agent.sock"), "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        hello = json.loads(proc.stdout.readline())
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(hello["unix"])  # (queued until the agent serves)
        ch = NodeChannel(sock, node=0, token="secret-token", ttl=30, on_output=lambda *a: None)
        assert ch.facts["pid"] == proc.pid == hello["pid"]
        ch.close(shutdown_agent=True)
        assert proc.wait(timeout=10) == 0
        before = proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.wait()
    after = log.read_text()
    heavy = ("skyward.bootstrap.frames", "skyward.bootstrap.handshake", "skyward.bootstrap.serialize",
             "skyward.bootstrap.shm", "skyward.bootstrap.agent\n")
    assert "skyward.bootstrap.listeners" in before
    for module in heavy:
        assert module not in before + "\n", f"{module.strip()} imported before the start-up line"
        assert module in after + "\n", f"{module.strip()} not imported after it"
