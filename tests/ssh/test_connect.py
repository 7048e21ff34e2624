"""Connecting to SSH hosts, as a new user meets it: a host key changed on a non-standard port,
a typo in a host name, a port where nothing listens."""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from typing import Any

import pytest

import skyward as sky
from skyward.bootstrap.remote import Remote, Target

pytestmark = pytest.mark.timeout(180)
QUIET = sky.Options(console=False)


def _provider(hosts: Any) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts])


def test_changed_host_key_on_a_non_standard_port_names_the_form_known_hosts_stores(ssh_hosts: Any) -> None:
    hosts = ssh_hosts(1, mode="loopback")  # loopback hosts listen on high ports, never 22
    h = hosts[0]
    assert h.port != 22
    with sky.Compute(provider=_provider(hosts), nodes=1, options=QUIET) as pool:
        assert sky.function(socket.gethostname)() >> pool
    h.restart(new_host_key=True)
    with pytest.raises(sky.HostKeyError, match="changed") as info, \
            sky.Compute(provider=_provider(hosts), nodes=1, options=QUIET):
        pass
    message = str(info.value)
    assert f"[{h.address}]:{h.port}" in message, message
    command = next(line.strip() for line in message.splitlines() if line.strip().startswith("ssh-keygen -R"))
    done = subprocess.run(command, shell=True, capture_output=True, text=True)
    assert done.returncode == 0 and "updated" in done.stdout + done.stderr, (command, done)
    with sky.Compute(provider=_provider(hosts), nodes=1, options=QUIET) as pool:  # the way out works
        assert sky.function(socket.gethostname)() >> pool


def test_a_host_name_that_does_not_resolve_fails_at_once() -> None:
    remote = Remote(Target("no-such-host.invalid", 22), retry_for=60.0, label="node 0 (no-such-host.invalid)")
    t0 = time.monotonic()
    with pytest.raises(sky.ProviderError) as info:
        remote.open()
    assert time.monotonic() - t0 < 10, "a name that does not resolve is not worth retrying"
    message = str(info.value)
    assert "no-such-host.invalid" in message and "resolve" in message, message
    assert "spelling" in message or "~/.ssh/config" in message, message


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_port_is_retried_and_says_so_while_waiting(caplog: pytest.LogCaptureFixture) -> None:
    port = _closed_port()
    remote = Remote(Target("127.0.0.1", port), retry_for=3.0, label="node 0 (127.0.0.1)")
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="skyward"), pytest.raises(sky.ProviderError) as info:
        remote.open()
    assert time.monotonic() - t0 >= 2.5  # retried until ssh_timeout, not given up at once
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1, said  # said once, when the wait starts, not at every attempt
    assert "refused" in said[0] and str(port) in said[0] and "retrying" in said[0], said
    assert "refused" in str(info.value) and str(port) in str(info.value)


def test_attaching_to_a_described_pool_with_one_host_down_uses_the_others(ssh_hosts: Any) -> None:
    """On SSH: each node of a named pool is judged on its own."""
    from helpers import running_description

    from skyward.core.pool import Pool

    hosts = ssh_hosts(2)
    ssh = _provider(hosts)
    spec = sky.Spec(provider=ssh, nodes=2)
    description = running_description(ssh, spec, "half01", sky.Options(ssh_timeout=3))
    try:
        hosts[1].stop()
        attached = ssh.attach(description)
        pool = Pool(spec, QUIET, sky.Worker(), cluster=attached)
        try:
            assert pool.current_nodes() == 1
            assert len(sky.function(socket.gethostname)() @ pool) == 1  # the live node runs tasks
            (why,) = attached.unreachable().values()
            assert hosts[1].address in why and "could not connect" in why, why
        finally:
            pool.close()
    finally:
        ssh.destroy(description)


def _log_in_and_run(ssh_hosts: Any) -> None:
    """A new login to a loopback host and one command on it."""
    h = ssh_hosts(1, mode="loopback")[0]
    r = Remote(Target(h.address, h.port, h.user, str(h.key_path))).open()
    try:
        assert r.run("echo ok")[1].strip() == "ok"
    finally:
        r.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")
def test_a_hosts_global_request_is_acked_at_once(ssh_hosts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """sshd sends "hostkeys-00@openssh.com" right after the login, wanting no answer, while the
    client asks for its first session. sshd keeps Nagle's algorithm on for commands without a
    terminal, so the session's confirmation waited for the client's delayed ACK of that request
    (40 ms on every new connection). The client ACKs a global request as soon as it is handled."""
    import paramiko

    requests: list[str] = []
    acks: list[int] = []  # how many global requests were handled when TCP_QUICKACK was set
    handle = paramiko.Transport._parse_global_request

    def parse(self: Any, m: Any) -> None:
        requests.append(m.get_text())
        m.rewind()
        handle(self, m)

    def setsockopt(self: socket.socket, level: int, name: int, *value: Any) -> None:
        if (level, name) == (socket.IPPROTO_TCP, socket.TCP_QUICKACK):
            acks.append(len(requests))
        return real(self, level, name, *value)

    real = socket.socket.setsockopt
    monkeypatch.setattr(paramiko.Transport, "_parse_global_request", parse)
    monkeypatch.setattr(socket.socket, "setsockopt", setsockopt)
    _log_in_and_run(ssh_hosts)
    assert "hostkeys-00@openssh.com" in requests, requests  # (what OpenSSH's sshd sends)
    assert acks and acks[0] >= 1, (requests, acks)


def test_the_ssh_socket_has_tcp_nodelay_before_the_handshake(ssh_hosts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A login writes small packets back to back: with Nagle's algorithm the second waits for
    the host's delayed ACK of the first (up to 40 ms, several times a login). TCP_NODELAY must be
    on when paramiko's Transport is made, before the handshake, not only once logged in."""
    import paramiko

    seen: list[int] = []
    made = paramiko.Transport

    def transport(sock: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        return made(sock, *args, **kwargs)

    monkeypatch.setattr(paramiko, "Transport", transport)
    _log_in_and_run(ssh_hosts)
    assert seen and all(seen), seen

