"""Another user of a node cannot lock the client out by holding the agent's
handshake slots. User nobody on the head host finds every TCP listener there (as in
/proc/net/tcp), holds 20 silent connections to each and reopens each one that is closed, while
new clients attach to the pool three times, run a task on every node and use a collection from
the other node: every try succeeds. The agent has no TCP port left to flood (a Unix socket in
the pool's 0700 folder, reached through sshd), and the listeners that stay on TCP (the
collections for the other nodes, and with sky.SSH(direct=True) the agent's direct listener)
give one address only its share of their handshake slots."""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import flood_silently
from sshhosts import SSHHosts, SSHHostsUnavailable

import skyward as sky

from .test_provider import on_host

pytestmark = pytest.mark.timeout(600)
QUIET = sky.Options(console=False)

# As user nobody on the host, for at most 90 s: 20 silent connections to every TCP listener but
# sshd's, each reopened 5 ms after it is closed; and a try at every Unix socket of the host.
_FLOOD = r"""
import json, os, socket, sys, threading, time
sshd, until = int(sys.argv[1]), time.monotonic() + 90
targets, made, unix = [], {}, {}
for name, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
    try:
        lines = open(name).read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        local, state = line.split()[1], line.split()[3]
        host, port = local.split(":")
        if state != "0A" or int(port, 16) == sshd:
            continue
        raw = bytes.fromhex(host)
        if family == socket.AF_INET:
            addr = socket.inet_ntop(family, raw[::-1])
        else:
            addr = socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        if addr in ("0.0.0.0", "::"):
            addr = "127.0.0.1" if family == socket.AF_INET else "::1"
        targets.append((family, addr, int(port, 16)))
for line in open("/proc/net/unix").read().splitlines()[1:]:
    path = line.split()[-1] if len(line.split()) > 7 else ""
    if path.startswith("/") and path.endswith(".sock"):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            unix[path] = "connected"
        except OSError as exc:
            unix[path] = type(exc).__name__
        finally:
            s.close()

def hold(family, addr, port):
    key = f"{addr}:{port}"
    while time.monotonic() < until:
        s = socket.socket(family)
        try:
            s.connect((addr, port))
            made[key] = made.get(key, 0) + 1
            s.settimeout(0.5)
            while time.monotonic() < until:
                try:
                    if not s.recv(4096):
                        break
                except TimeoutError:
                    continue
        except OSError:
            pass
        finally:
            s.close()
        time.sleep(0.005)

for t in targets:
    for _ in range(20):
        threading.Thread(target=hold, args=t, daemon=True).start()
while time.monotonic() < until:
    with open("/tmp/flood.json.new", "w") as f:
        json.dump({"targets": [f"{a}:{p}" for _, a, p in targets], "made": made, "unix": unix}, f)
    os.replace("/tmp/flood.json.new", "/tmp/flood.json")
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def hosts() -> Iterator[SSHHosts]:
    made = SSHHosts(2, mode="netns")
    try:
        try:
            made.start()
        except SSHHostsUnavailable as e:
            pytest.skip(f"netns SSH test hosts unavailable: {e}")
        yield made
    finally:
        made.close()


@sky.function
def where() -> str:
    import socket

    return socket.gethostname()


@sky.function
def bump(name: str) -> int:
    return sky.counter(name).increment()


def _flood_status(hosts: SSHHosts) -> dict[str, Any]:
    out = on_host(hosts[0], "cat /tmp/flood.json 2>/dev/null || echo '{}'")
    return dict(json.loads(out or "{}"))


@pytest.mark.parametrize("direct", [False, True], ids=["tunnel", "direct"])
def test_a_flood_of_silent_connections_by_another_user_does_not_lock_the_client_out(
    hosts: SSHHosts, caplog: pytest.LogCaptureFixture, direct: bool,
) -> None:
    from skyward.core.pool import Pool

    caplog.set_level(logging.INFO, logger="skyward")

    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root")
    ssh = sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                         for h in hosts], direct=direct)
    spec = sky.Spec(provider=ssh, nodes=2)
    cluster = ssh.create(spec, f"flood49{'d' if direct else 't'}")
    description: dict[str, Any] = {}
    pid = 0
    try:
        cluster.start(2)
        description = json.loads(json.dumps(cluster.describe()))  # what the registry stores
        cluster.detach()
        first = Pool(spec, QUIET, sky.Worker(), cluster=ssh.attach(description))
        try:
            assert bump("warm") >> first == 1  # the head serves its collections (a TCP listener)
        finally:
            first.close()
        flood = shlex.quote(_FLOOD)
        pid = int(on_host(hosts[0], f"rm -f /tmp/flood.json; setpriv --reuid=65534 --regid=65534 "
                                    f"--clear-groups python3 -c {flood} {hosts[0].port} </dev/null "
                                    f">/tmp/flood.log 2>&1 & echo $!"))
        deadline = time.monotonic() + 20
        while not (status := _flood_status(hosts)).get("made") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert status.get("targets"), status  # at least the collections listener is there to flood
        time.sleep(3)  # every slot taken a while: past the first-byte deadline, reopened
        answers = []
        for attempt in range(3):  # as `skyward exec` does: a new client attaches each time
            pool = Pool(spec, QUIET, sky.Worker(), cluster=ssh.attach(description))
            try:
                answers.append(sorted(where() @ pool))
                # the collections: the other node's worker over TCP (its address has its own
                # share of the gate), the head's own by the Unix socket beside the agent's
                assert pool.run(bump("flooded"), target=1) == 2 * attempt + 1
                assert pool.run(bump("flooded"), target=0) == 2 * attempt + 2
            finally:
                pool.close()
        assert answers == [sorted(h.name for h in hosts)] * 3
        status = _flood_status(hosts)
        # the flood ran all along and held connections to what still listens on TCP...
        assert sum(status["made"].values()) >= 20, status
        # ...but the agents are not among it: no TCP listener of theirs, and their sockets are
        # closed to another user
        for node in description["nodes"]:
            assert node["agent_socket"].endswith("/agent.sock") and node.get("agent_port") is None, node
        ours = [p for p in status["unix"] if p.endswith(("/agent.sock", "/state.sock"))]
        assert any(p.endswith("/state.sock") for p in ours), status
        assert ours and all(status["unix"][p] == "PermissionError" for p in ours), status
        assert "relaying over an exec channel" not in caplog.text  # sshd's streamlocal channel
    finally:
        if pid:
            on_host(hosts[0], f"kill {pid} 2>/dev/null; true")
        if description:
            ssh.destroy(description)
        else:
            cluster.detach()


@sky.function
def handshakes(tries: int) -> int:
    """How many of ``tries`` new connections to the collections (from this node) were admitted."""
    from skyward.bootstrap.state import StateConnection
    from skyward.runtime import context

    where, done = context.state, 0
    for _ in range(tries):
        try:
            StateConnection(where["host"], int(where["port"]), where["token"], 1).close()
            done += 1
        except ConnectionError:
            pass
        time.sleep(0.05)
    return done


def test_a_flood_from_four_lan_addresses_leaves_the_other_node_its_collections(hosts: SSHHosts) -> None:
    """A neighbour on the nodes' network with four addresses (here: the bridge's machine)
    takes every handshake slot of the collections' TCP listener that one address could not;
    node 1's address is the pool's own (the head knows it from the topology), so its new
    connections are admitted all the same."""
    if os.geteuid() != 0:
        pytest.skip("adding addresses to the bridge needs root")
    assert hosts.bridge is not None and hosts.subnet is not None
    ssh = sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                         for h in hosts])
    sources = [str(hosts.subnet[200 + i]) for i in range(4)]
    added: list[str] = []
    stop = threading.Event()
    flood: threading.Thread | None = None
    try:
        with sky.Compute(provider=ssh, nodes=2, options=QUIET) as pool:
            assert bump("warm") >> pool == 1  # the head serves its collections
            served = pool.shared.served
            assert served is not None and served[1] and "port" in served[1], served
            for source in sources:
                subprocess.run(["ip", "addr", "add", f"{source}/{hosts.subnet.prefixlen}", "dev", hosts.bridge],
                               check=True, capture_output=True)
                added.append(source)
            flood = threading.Thread(target=flood_silently, args=(served[1]["host"], int(served[1]["port"]),
                                                                   sources, 12, stop), daemon=True)
            flood.start()
            time.sleep(1.5)  # every slot the flood can take is taken, and reopened as it goes
            assert pool.run(handshakes(15), target=1) == 15
    finally:
        stop.set()
        if flood is not None:
            flood.join(10)
        for source in added:
            subprocess.run(["ip", "addr", "del", f"{source}/{hosts.subnet.prefixlen}", "dev", hosts.bridge],
                           capture_output=True)
