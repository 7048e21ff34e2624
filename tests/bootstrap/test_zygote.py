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
from tests.helpers import without_fork_server


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
    without_fork_server(monkeypatch, "no fork here")
    with sky.Compute(nodes=2, options=sky.Options(console=False)) as pool:
        agents = set(agent_pid() @ pool)
        assert {int(_stat(pid)[1]) for pid in agents} == {os.getpid()}  # this process's children
    assert "the Local fork server is not available (no fork here)" in caplog.text


def _cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


@sky.function
def node_view() -> dict[str, object]:
    import sys

    return {"agent": int(os.environ["SKYWARD_AGENT_PID"]), "path": sys.path[:3], "env": dict(os.environ),
            "hash": hash("skyward")}


def test_building_a_local_compute_warms_a_server_that_its_pool_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    from skyward.providers import local_fork

    local_fork._close_warm()
    compute = sky.Compute(nodes=2, options=sky.Options(console=False, logging=False))
    warm = local_fork._warm
    assert warm is not None and "-P" in warm.proc.args  # nothing of its cwd on its path
    monkeypatch.setenv("SKYWARD_TEST_LATE", "set after the server started")
    with compute as pool:
        assert local_fork._warm is None and pool.cluster._forks is warm  # taken, and owned by the pool
        views = node_view() @ pool
        root = str(pool.cluster._root)
        for view in views:
            assert int(_stat(int(view["agent"]))[1]) == warm.proc.pid  # its agent, forked from it
            # As a server of the pool's own has it: the pool's folder, then its site folder first.
            assert view["path"][:2] == [root, os.path.join(root, "site")]
            env = view["env"]
            assert env["SKYWARD_TEST_LATE"] == "set after the server started"  # the node's environment, now
            assert env["SKYWARD_SITE"] == os.path.join(root, "site")
            assert "SKYWARD_AGENT_TOKEN" not in env
    assert _gone(warm.proc.pid)


def test_a_pool_whose_interpreter_start_differs_starts_its_own_server() -> None:
    from skyward.providers import local_fork

    local_fork._close_warm()
    image = sky.Image(env={"PYTHONHASHSEED": "7"})  # read when an interpreter starts: a fork cannot take it
    compute = sky.Compute(nodes=1, image=image, options=sky.Options(console=False, logging=False))
    warm = local_fork._warm
    assert warm is not None
    with compute as pool:
        assert _gone(warm.proc.pid)  # not taken: it went
        (view,) = node_view() @ pool
        assert b"-P" not in _cmdline(int(_stat(int(view["agent"]))[1]))  # the pool's own server
    seeded = subprocess.run([sys.executable, "-c", "print(hash('skyward'))"], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONHASHSEED="7"), check=True)
    assert view["hash"] == int(seeded.stdout)


def test_a_warm_server_no_pool_took_goes_when_its_program_ends(tmp_path: Path) -> None:
    script = ("import skyward as sky\n"
              "from skyward.providers import local_fork\n"
              "sky.Compute(nodes=2)\n"
              "print(local_fork._warm.proc.pid, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert _gone(int(out.stdout))


def test_which_environments_a_warm_server_fits() -> None:
    from skyward.providers.local_fork import _fits

    started = {"PATH": "/bin", "PYTHONPATH": "/a:/b", "PYTHONUNBUFFERED": "1", "HOME": "/root"}
    pool = {**started, "PYTHONPATH": "/pool/site:/inc:/a:/b", "SKYWARD_AGENT_TOKEN": "t", "HOME": "/elsewhere"}
    assert _fits(started, pool) == ["/pool/site", "/inc"]  # what goes first; other variables travel
    assert _fits(started, {**pool, "PYTHONPATH": "/pool/site:/b:/a"}) is None  # the server's path, changed
    assert _fits(started, {**pool, "PYTHONHASHSEED": "0"}) is None  # read at start: a server of its own
    assert _fits(started, {k: v for k, v in pool.items() if k != "PYTHONUNBUFFERED"}) is None
    assert _fits(started, {**pool, "LD_PRELOAD": "/x.so"}) is None
    assert _fits({**started, "PYTHONPATH": ""}, {**pool, "PYTHONPATH": "/pool/site"}) == ["/pool/site"]


def test_a_warm_server_that_fails_says_why(tmp_path: Path) -> None:
    from skyward.providers.local_fork import ForkServer

    (tmp_path / "cloudpickle.py").write_text("raise ImportError('a broken cloudpickle on the path')\n")
    server = ForkServer(dict(os.environ, PYTHONPATH=str(tmp_path)), None)
    try:
        assert server.proc.wait(timeout=30) != 0
        assert "a broken cloudpickle on the path" in server.errors()  # kept in its unnamed log
    finally:
        server.close(timeout=1)


def test_a_warm_server_that_ended_is_replaced_and_let_go() -> None:
    from skyward.providers import local_fork

    local_fork._close_warm()
    local_fork.prestart()
    first = local_fork._warm
    assert first is not None
    first.proc.kill()
    first.proc.wait()
    local_fork.prestart()  # the next sky.Compute(...)
    try:
        assert local_fork._warm is not None and local_fork._warm is not first
        assert first.proc.stdout is not None and first.proc.stdout.closed and first.proc.stdin.closed
    finally:
        local_fork._close_warm()


def test_what_starts_the_warm_server_loads_little() -> None:
    """Building a sky.Compute of Local nodes imports local_fork to start the warm server: json,
    pathlib and typing (13 ms here) load with the pool afterwards, beside the server's start,
    not before it."""
    code = ("import sys\n"
            "import skyward.providers.local_fork\n"
            "print(sorted(m for m in ('json', 'pathlib', 'typing') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
