"""How many times a pool waits for each SSH host, counted on the wire (tests/ssh/wire.py), not
timed: what a host costs on a real network is these round trips times its latency.

A host is reached by one login, then one command does all the rest (its folders, what it lacks
of the shipment, sent back on the same channel, the bootstrap script, the agent's start), then one
channel reaches the agent; the next pool of the same process takes the connection the last one
left (bootstrap.remote.PARK_SECONDS) and skips the login. The pool's secret and its own files
(includes) go with the command, so a warm host never waits for the client within it; only a host
that lacks files waits for them (one answer). Before, a warm host took four commands (its
folders, which files it has, the script, the agent's start), a fresh one five or six (one per
upload), and then one command with an answer every time."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

import pytest
from helpers import running_description
from sshhosts import SSHHosts, SSHHostsUnavailable

import skyward as sky

from .test_provider import on_host
from .wire import Wire

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


@sky.function
def noop() -> None:
    return None


def provider(hosts: SSHHosts, **kw: Any) -> sky.SSH:
    return sky.SSH(
        hosts=[
            sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
            for h in hosts
        ],
        **kw,
    )


def counted(hosts: SSHHosts, **kw: Any) -> Wire:
    """One pool on ``hosts``, its enter, first result and exit counted per host."""
    with Wire() as wire, contextlib.ExitStack() as stack:
        with wire.phase("enter"):
            pool = stack.enter_context(
                sky.Compute(provider=provider(hosts), nodes=len(hosts), options=QUIET, **kw)
            )
        with wire.phase("first result"):
            assert (noop() >> pool) is None
        with wire.phase("exit"):
            stack.close()
    return wire


ONE_COMMAND = {"connections": 1, "sessions": 1, "commands": 1, "tunnels": 1, "answers": 0}
NOTHING = {"connections": 0, "sessions": 0, "commands": 0, "tunnels": 0, "answers": 0}


def test_a_warm_host_costs_one_login_one_command_and_one_channel_to_its_agent(
    three_hosts: SSHHosts,
) -> None:
    from skyward.bootstrap.remote import close_parked

    counted(three_hosts)  # the hosts get everything
    close_parked()  # (as in a new process)
    wire = counted(three_hosts)
    for h in three_hosts:
        assert wire.of(h.address, "enter") == ONE_COMMAND, wire.table()
        assert wire.of(h.address, "first result") == NOTHING, wire.table()
        # Stopping the agent and removing the pool's folder: one command.
        assert wire.of(h.address, "exit") == {**NOTHING, "sessions": 1, "commands": 1}, wire.table()
    # The next pool of this process takes the connections the last one left: no login.
    wire = counted(three_hosts)
    for h in three_hosts:
        assert wire.of(h.address, "enter") == {**ONE_COMMAND, "connections": 0}, wire.table()


def test_a_kept_connection_whose_host_went_away_is_logged_into_again(ssh_hosts: Any) -> None:
    hosts = ssh_hosts(1)
    counted(hosts)  # leaves its connection
    hosts[0].restart(new_host_key=False)  # a reboot: the kept connection is gone with it
    wire = counted(hosts)
    # (and the test host's home, a tmpfs: the files it lacks now are sent again, one answer)
    assert wire.of(hosts[0].address, "enter") == {**ONE_COMMAND, "answers": 1}, wire.table()


def test_a_fresh_host_gets_its_files_on_the_same_command(ssh_hosts: Any) -> None:
    hosts = ssh_hosts(2)
    image = sky.Image(includes=[__file__])  # an includes archive goes along too
    wire = counted(hosts, image=image)
    for h in hosts:
        # The files it lacks: sent when it says so, on the same command.
        assert wire.of(h.address, "enter") == {**ONE_COMMAND, "answers": 1}, wire.table()
    wire = counted(hosts, image=image)
    for h in hosts:  # warm: the includes went with the command, and nothing was waited for
        assert wire.of(h.address, "enter") == {**ONE_COMMAND, "connections": 0}, wire.table()


def test_a_pinned_resolution_is_reused_for_a_while_and_a_loose_one_never(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """What a warm pool no longer waits for: the package index, asked again about requirements that
    name exact versions (the agent's own). Requirements without one are resolved every time."""
    import os
    import sys
    import time

    from skyward.bootstrap import shipment, wheelhouse
    from skyward.paths import cache_root

    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))
    pinned = list(wheelhouse.agent_requirements())
    kw: dict[str, Any] = {"python": sys.executable, "platform": None, "indexes": []}
    first = shipment.resolve(pinned, reuse=True, **kw)
    (entry,) = (cache_root() / "locks").iterdir()
    assert entry.stat().st_mode & 0o077 == 0
    # The entry is what the next pool takes (shown by changing it): no index asked.
    entry.write_text("cloudpickle==0.0.1\n")
    assert [(p.name, p.version) for p in shipment.resolve(pinned, reuse=True, **kw)] == [
        ("cloudpickle", "0.0.1")
    ]
    # Older than LOCK_FRESH_S, or reuse off: resolved again.
    old = time.time() - shipment.LOCK_FRESH_S - 1
    os.utime(entry, (old, old))
    assert shipment.resolve(pinned, reuse=True, **kw) == first
    entry.write_text("cloudpickle==0.0.1\n")
    assert shipment.resolve(pinned, reuse=False, **kw) == first
    loose = [*pinned, "cloudpickle"]  # no exact version: its newest is what it asks for
    shipment.resolve(loose, reuse=True, **kw)
    assert len(list((cache_root() / "locks").iterdir())) == 1


@sky.function
def hostname() -> str:
    import socket

    return socket.gethostname()


def test_attaching_to_a_direct_pool_logs_into_no_host_until_its_ssh_is_needed(three_hosts: SSHHosts) -> None:
    """A named pool with sky.SSH(direct=True) (what `skyward exec` and `status` attach to): the
    agents answer on their direct ports, so attaching and running a task cost no login, no
    command and no tunnel; `skyward ssh` (the node's SSH connection) logs in then. A node whose
    agent is gone is judged the SSH way (a login and a command) and reported, the others used."""
    from skyward.core.pool import Pool

    hosts = three_hosts[:2]
    ssh = provider(hosts, direct=True)
    spec = sky.Spec(provider=ssh, nodes=2)
    description = running_description(ssh, spec, "direct01")
    try:
        assert [n["direct_host"] for n in description["nodes"]] == [h.address for h in hosts]
        assert all(n["direct_port"] for n in description["nodes"])
        with Wire() as wire:
            with wire.phase("attach"):
                attached = ssh.attach(description)
                pool = Pool(spec, QUIET, sky.Worker(), cluster=attached)
            try:
                with wire.phase("tasks"):
                    assert len(set(hostname() @ pool)) == 2
                    stream = attached.table.nodes[1].endpoint.connect()  # a second stream: direct again
                    assert isinstance(stream, socket.socket), stream
                    stream.close()
                with wire.phase("ssh"):
                    code, _ = attached.remote(0).run("true", check=False)
                    assert code == 0
            finally:
                pool.close()
        for h in hosts:
            assert wire.of(h.address, "attach") == NOTHING, wire.table()
            assert wire.of(h.address, "tasks") == NOTHING, wire.table()
        assert wire.of(hosts[0].address, "ssh") == {**NOTHING, "connections": 1, "sessions": 1, "commands": 1}
        assert wire.of(hosts[1].address, "ssh") == NOTHING

        # A description written before the direct address was kept: the SSH way, as it was.
        older = json.loads(json.dumps(description))
        for n in older["nodes"]:
            del n["direct_host"]
        attached = ssh.attach(older)
        with Wire() as wire, wire.phase("attach"):
            assert len(attached.start(2)) == 2
        attached.detach()
        for h in hosts:
            assert wire.of(h.address, "attach") == {**NOTHING, "connections": 1, "sessions": 1,
                                                    "commands": 1}, wire.table()

        # Node 1's agent stopped: its direct port refuses, so it is asked the SSH way.
        pid = int(description["nodes"][1]["agent_pid"])
        on_host(hosts[1], f"kill -KILL -- -{pid} 2>/dev/null; kill -KILL {pid} 2>/dev/null; true")
        attached = ssh.attach(description)
        with Wire() as wire, wire.phase("attach"):
            endpoints = attached.start(2)
        attached.detach()
        assert [e.index for e in endpoints] == [0]
        assert "no longer runs" in attached.unreachable()[1]
        assert wire.of(hosts[0].address, "attach") == NOTHING, wire.table()
        assert wire.of(hosts[1].address, "attach") == {**NOTHING, "connections": 1, "sessions": 1,
                                                       "commands": 1}, wire.table()
    finally:
        ssh.destroy(description)


def test_an_idle_connection_sleeps_on_its_socket_and_ends_at_once_when_closed(ssh_hosts: Any) -> None:
    """paramiko's transport thread woke every 0.1 s on an idle connection: a pool of 32 SSH nodes
    cost the client 28 ms of CPU each second it stayed open. Logged in, it waits IDLE_POLL_S;
    a closed connection's thread still ends at once (its socket is shut down), not a poll later."""
    import time

    from skyward.bootstrap.remote import IDLE_POLL_S, Remote, Target, close_parked

    close_parked()
    h = ssh_hosts(1)[0]
    remote = Remote(Target(h.address, h.port, h.user, str(h.key_path))).open()
    transport = remote.transport
    assert IDLE_POLL_S >= 1 and transport.sock.gettimeout() == IDLE_POLL_S
    assert remote.run("echo hi")[1].strip() == "hi"  # (commands are not slower for it)
    time.sleep(0.3)  # the thread is waiting on its socket now
    started = time.monotonic()
    remote.close()
    transport.join(IDLE_POLL_S)
    assert not transport.is_alive()
    assert time.monotonic() - started < 1.0


def test_a_task_for_every_node_is_pickled_once(three_hosts: SSHHosts, monkeypatch: pytest.MonkeyPatch) -> None:
    """``@`` sends the same task to every node: its function and arguments are pickled (and
    compressed) once, not once per node; each node still gets its own call."""
    from skyward.bootstrap import serialize

    calls: list[int] = []
    real = serialize.dumps

    def counting(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, tuple) and len(obj) == 4 and callable(obj[0]):  # a task's (fn, args, kwargs, timeout)
            calls.append(1)
        return real(obj, *args, **kwargs)

    @sky.function
    def length(data: bytes) -> tuple[int, str]:
        import socket

        return len(data), socket.gethostname()

    with sky.Compute(provider=provider(three_hosts), nodes=3, options=QUIET) as pool:
        monkeypatch.setattr(serialize, "dumps", counting)
        answers = length(b"x" * 2_000_000) @ pool
        assert [n for n, _ in answers] == [2_000_000] * 3 and len({h for _, h in answers}) == 3
        assert len(calls) == 1
        calls.clear()
        assert (length(b"y") >> pool)[0] == 1 and len(calls) == 1  # (one node: as before)


def test_a_connection_through_a_jump_host_closes_cleanly_and_ends_both_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing a node's connection that goes through a jump host: the node's goes first (its
    socket is a channel of the jump host's connection, whose close message needs that connection
    still open), then the jump host's socket is shut down and closed, each thread ending at once.
    (The other way round, `skyward up` of a pool behind a bastion failed with EOFError.)"""
    import os
    import time

    import fabric

    from skyward.bootstrap.remote import Remote, Target, _hops, close_parked

    close_parked()
    hosts = SSHHosts(1, mode="netns", bastion=True, user="auto")
    try:
        hosts.start()
    except SSHHostsUnavailable as exc:
        pytest.skip(f"netns SSH test hosts unavailable: {exc}")
    try:
        h = hosts[0]
        remote = Remote(Target(h.address, h.port, h.user, str(h.key_path), jump=hosts.jump)).open()
        assert remote.run("echo hi")[1].strip() == "hi"
        assert remote.conn is not None
        hop = _hops(remote.conn)[0]
        transports = [remote.conn.transport, hop.transport]
        order: list[str] = []

        class Watched(socket.socket):  # the jump host's socket (a second descriptor of it)
            def shutdown(self, how: int) -> None:
                order.append("jump host shut down")
                super().shutdown(how)

        hop.transport.sock = Watched(fileno=os.dup(hop.transport.sock.fileno()))
        real_close = fabric.Connection.close

        def close(self: Any) -> Any:
            order.append(f"closed {self.host}")
            return real_close(self)

        monkeypatch.setattr(fabric.Connection, "close", close)
        started = time.monotonic()
        remote.close()
        assert order == [f"closed {h.address}", "jump host shut down", f"closed {hop.host}"]
        for t in transports:
            t.join(5)
            assert not t.is_alive()
        assert time.monotonic() - started < 2.0
    finally:
        hosts.close()
