"""The agent's direct listener on a host's private address, as another local user sees it
: a stranger's 300 MB claim or TASK header is closed before it costs the node memory
or shared memory, and a capture on the test bridge shows the pool's secret never crossing and
no proof repeating. Real sshd hosts in network namespaces (tests/sshhosts.py)."""

from __future__ import annotations

import glob
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sshhosts import SSHHosts, SSHHostsUnavailable

import skyward as sky
from skyward.bootstrap.frames import BUFLEN, FLAG_SHIFT, HEADER, Kind
from skyward.bootstrap.handshake import AGENT, COLLECTIONS, LANE, derive

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)
MB = 1 << 20


@pytest.fixture(scope="module")
def hosts() -> Iterator[SSHHosts]:
    made = SSHHosts(2)
    try:
        try:
            made.start()
        except SSHHostsUnavailable as e:
            pytest.skip(f"SSH test hosts unavailable: {e}")
        yield made
    finally:
        made.close()


def provider(hosts: SSHHosts) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts], direct=True)


@sky.function
def count(name: str) -> int:
    return sky.counter(name).increment()


@sky.function
def rss(pid: int) -> int:
    """The resident memory of a process on the node (hosts have their own pid namespace)."""
    from pathlib import Path

    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _shm_bytes() -> int:
    """What the nodes' shared-memory folders hold (netns hosts share this machine's /dev/shm)."""
    total = 0
    for folder in glob.glob("/dev/shm/skyward-node-*"):
        for f in glob.glob(os.path.join(folder, "*")):
            try:
                total += os.stat(f).st_blocks * 512
            except OSError:
                pass
    return total


_AS_NOBODY = """
import socket, sys, time
host, port, data = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
s = socket.create_connection((host, port), timeout=10)
s.sendall(data)  # and keep the connection open, as an attacker would
got, start = b"", time.monotonic()
try:
    while chunk := s.recv(4096):
        got += chunk
except (ConnectionResetError, TimeoutError):
    pass
print(len(got), round(time.monotonic() - start, 2))
"""


def _as_nobody(host: str, port: int, data: bytes) -> tuple[int, float]:
    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                          "-c", _AS_NOBODY, host, str(port), data.hex()],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    n, took = out.stdout.split()
    return int(n), float(took)


def test_another_users_300_mb_claims_cost_the_node_nothing(hosts: SSHHosts) -> None:
    with sky.Compute(provider=provider(hosts), nodes=2, options=QUIET) as pool:
        assert count("warm") >> pool == 1  # configured: the node's shared-memory folder exists
        ch = pool.members.channels[0]
        address, port = ch._sock.getpeername()[:2]
        agent = int(ch.facts["pid"])
        before, shm = pool.run(rss(agent), target=0), _shm_bytes()
        hello = HEADER.pack(Kind.HELLO, 0, 0, 0, 300 * MB)
        task = HEADER.pack(Kind.TASK, 0, 1, 1, 16) + BUFLEN.pack(210 * MB & ((1 << FLAG_SHIFT) - 1))
        for data in (hello, task):
            got, took = _as_nobody(address, port, data)
            assert got == 20 + 32 and took < 2  # the challenge, then closed at once
        assert pool.run(rss(agent), target=0) - before < 5 * MB
        assert _shm_bytes() - shm < 1 * MB
        # an idle stranger is closed at the handshake's deadline, not kept forever
        got, took = _as_nobody(address, port, b"")
        assert got == 20 + 32 and took < 10
        assert count("warm") >> pool == 2


def _capture(bridge: str, stop: threading.Event, into: list[bytes]) -> None:
    """Every frame on the test bridge until ``stop`` (an AF_PACKET socket: root only)."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
    s.bind((bridge, 0))
    s.settimeout(0.2)
    try:
        while not stop.is_set():
            try:
                into.append(s.recv(65535))
            except TimeoutError:
                pass
    finally:
        s.close()


def test_a_capture_on_the_bridge_shows_no_secret_and_no_repeated_proof(hosts: SSHHosts) -> None:
    if os.geteuid() != 0 or not hosts.bridge:
        pytest.skip("capturing on the test bridge needs root and the netns hosts")
    frames: list[bytes] = []
    stop = threading.Event()
    tap = threading.Thread(target=_capture, args=(hosts.bridge, stop, frames))
    tap.start()
    try:
        time.sleep(0.3)
        with sky.Compute(provider=provider(hosts), nodes=2, options=QUIET) as pool:
            secret: Any = pool.cluster.token
            assert sorted(count("cap") @ pool) == [1, 2]  # node 1's worker reaches the head's collections
    finally:
        time.sleep(0.3)
        stop.set()
        tap.join(10)
    wire = b"".join(frames)
    assert wire, "nothing captured"
    for purpose in (AGENT, LANE, COLLECTIONS):
        key = derive(secret, purpose)
        assert key not in wire and key.hex().encode() not in wire
    assert secret.encode() not in wire
    # every handshake's proof is fresh: no MAC crosses twice
    proofs = re.findall(rb'"proof": "([0-9a-f]{64})"', wire)
    assert len(proofs) >= 4, proofs  # two agents and a collections peer, each side of each
    assert len(set(proofs)) == len(proofs)
