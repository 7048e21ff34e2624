"""A Local pool's fork server (bootstrap/zygote.py, providers/local_fork.py): every agent of the
pool is forked from one interpreter, which goes when its agents have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import skyward as sky
from skyward.bootstrap.channel import NodeChannel


@sky.function
def agent_pid() -> int:
    return int(os.environ["SKYWARD_AGENT_PID"])


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _stat(pid)[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.02)
    return False


def test_a_pools_agents_share_one_fork_server_that_goes_with_them() -> None:
    with sky.Compute(nodes=3, options=sky.Options(console=False, logging=False)) as pool:
        agents = sorted(set(agent_pid() @ pool))
        assert len(agents) == 3
        parents = {int(_stat(pid)[1]) for pid in agents}
        assert len(parents) == 1, parents  # one parent for all...
        (server,) = parents
        cmdline = Path(f"/proc/{server}/cmdline").read_bytes().split(b"\0")
        assert b"--fork-server" in cmdline  # ...the pool's fork server, not this process
        assert server != os.getpid()
        for pid in agents:  # each agent leads a session of its own, named for what it is
            assert int(_stat(pid)[3]) == pid
            assert Path(f"/proc/{pid}/comm").read_text().strip() == "skyward-agent"
        # A node started later (a resize) is forked too.
        pool.resize(4)
        later = set(agent_pid() @ pool) - set(agents)
        assert len(later) == 1 and int(_stat(later.pop())[1]) == server
    assert all(_gone(pid) for pid in agents)
    assert _gone(server)


def test_the_fork_server_forks_on_request_and_exits_after_its_last_agent(tmp_path: Path) -> None:
    token = "t" * 43
    env = dict(os.environ, SKYWARD_AGENT_TOKEN=token)
    server = subprocess.Popen([sys.executable, "-m", "skyward.bootstrap.agent_start", "--fork-server"], cwd=tmp_path,
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    assert server.stdin is not None and server.stdout is not None
    try:
        request = {"index": 7, "argv": ["--ttl", "30", "--log", str(tmp_path / "a.log")], "cwd": str(tmp_path),
                   "log": str(tmp_path / "a.log")}
        server.stdin.write(json.dumps(request).encode() + b"\n")
        server.stdin.flush()
        lines = [json.loads(server.stdout.readline()) for _ in range(2)]
        forked = next(line for line in lines if "forked" in line)
        hello = next(line for line in lines if "port" in line)
        assert forked["forked"] == 7 and forked["pid"] == hello["pid"]
        # The forked agent serves as a started one does, with the pool's token.
        import socket

        ch = NodeChannel(socket.create_connection(("127.0.0.1", hello["port"]), timeout=10), node=7,
                         token=token, ttl=30, on_output=lambda *_: None)
        assert ch.facts["pid"] == hello["pid"]
        server.stdin.close()  # no more requests: the server stays while its agent runs...
        time.sleep(0.3)
        assert server.poll() is None
        ch.close(shutdown_agent=True)  # ...and goes once it has exited
        assert server.wait(timeout=10) == 0
        assert _gone(hello["pid"])
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        server.stdout.close()


def test_nodes_start_as_their_own_interpreters_where_the_fork_server_cannot_run(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from skyward.providers import local

    def broken(*_args: object) -> None:
        raise OSError("no fork here")

    monkeypatch.setattr(local, "ForkServer", broken)
    with sky.Compute(nodes=2, options=sky.Options(console=False)) as pool:
        agents = set(agent_pid() @ pool)
        assert {int(_stat(pid)[1]) for pid in agents} == {os.getpid()}  # this process's children
    assert "the Local fork server is not available (no fork here)" in caplog.text
