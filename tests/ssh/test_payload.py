"""Large payloads to SSH nodes: through the tunnel, the agent receives a large
buffer straight into a segment of the node's shared memory and the worker maps it (no second
socket hop); with sky.SSH(direct=True) the client talks to the agent over plain TCP on the
host's private address, after the same token check. Real sshd hosts (tests/sshhosts.py).

Buffers are PickleBuffers (protocol 5 out of band, like NumPy arrays) so that the hosts need
no NumPy."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pickle
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from sshhosts import SSHHosts, SSHHostsUnavailable

import skyward as sky
from skyward.bootstrap.frames import FrameReader, FrameWriter, Kind
from skyward.bootstrap.remote import ChannelSocket
from skyward.providers.ssh import SSHHost as Host
from skyward.providers.ssh import direct_address

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)
SIZE = 8 << 20


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


def provider(hosts: SSHHosts, **kw: Any) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts], **kw)


@sky.function
def inspect(buf: Any) -> tuple[str, str, int]:
    """What the node got: a digest, what owns its memory, and the worker's pid."""
    view = memoryview(buf)
    owner: Any = view
    while isinstance(owner, memoryview):
        owner = owner.obj
    return hashlib.sha256(view).hexdigest(), type(owner).__name__, os.getpid()


@sky.function
def make(seed: int, n: int) -> pickle.PickleBuffer:
    return pickle.PickleBuffer(bytearray(hashlib.sha256(str(seed).encode()).digest() * (n // 32)))


def _blob(seed: int) -> pickle.PickleBuffer:
    return pickle.PickleBuffer(bytearray(os.urandom(SIZE)))


def _node_dirs() -> set[str]:
    return set(glob.glob("/dev/shm/skyward-node-*"))  # netns hosts share this machine's /dev/shm


def test_through_the_tunnel_the_worker_maps_what_the_agent_received(hosts: SSHHosts) -> None:
    before = _node_dirs()
    with sky.Compute(provider=provider(hosts), nodes=1, options=QUIET) as pool:
        assert isinstance(pool.members.channels[0]._sock, ChannelSocket)  # the SSH tunnel
        for seed in range(3):
            blob = _blob(seed)
            digest, owner, _ = inspect(blob) >> pool
            assert digest == hashlib.sha256(memoryview(blob)).hexdigest()
            assert owner == "mmap"  # a segment of the node's shared memory, not a socket's bytes
        # The other way: a large result leaves the worker through shared memory too, and the
        # agent sends its bytes (the client is on another host).
        back = make(7, SIZE) >> pool
        assert bytes(memoryview(back)) == hashlib.sha256(b"7").digest() * (SIZE // 32)
        assert len(_node_dirs() - before) == 1
    assert _node_dirs() - before == set()  # the agent removed its folder


def test_direct_connections_skip_the_tunnel_after_the_token_check(hosts: SSHHosts) -> None:
    with sky.Compute(provider=provider(hosts, direct=True), nodes=2, options=QUIET) as pool:
        socks = [ch._sock for ch in pool.members.channels]
        assert all(isinstance(s, socket.socket) for s in socks)
        peers = {s.getpeername()[0] for s in socks}
        assert peers == {h.address for h in hosts}
        # plain TCP that no SSH carries: every frame after the handshake is authenticated
        assert all(ch.facts.get("sealed") is True for ch in pool.members.channels)
        blob = _blob(1)
        digests = {d for d, _, _ in inspect(blob) @ pool}
        assert digests == {hashlib.sha256(memoryview(blob)).hexdigest()}
        # Anyone else on the network: the direct port wants a proof of the pool's key.
        address, port = socks[0].getpeername()[:2]
        with socket.create_connection((address, port), timeout=5) as intruder:
            FrameWriter(intruder).send_parts(Kind.HELLO, 0, 0, json.dumps({"token": "guess", "ttl": 5}).encode())
            reader = FrameReader(intruder)
            assert reader.read().kind == Kind.CHALLENGE  # the listener speaks first...
            with pytest.raises((EOFError, OSError)):
                reader.read()  # ...and closes on a HELLO without the proof
        assert (inspect(blob) >> pool)[0] == hashlib.sha256(memoryview(blob)).hexdigest()


def test_the_direct_rule() -> None:
    assert direct_address(Host(address="10.1.2.3"), "10.1.2.3") == "10.1.2.3"
    assert direct_address(Host(address="192.168.0.7"), "192.168.0.7") == "192.168.0.7"
    assert direct_address(Host(address="fd00::5"), "fd00::5") == "fd00::5"
    assert direct_address(Host(address="localhost"), "localhost") in ("127.0.0.1", "::1")
    assert direct_address(Host(address="8.8.8.8"), "8.8.8.8") is None  # public: the tunnel
    assert direct_address(Host(address="169.254.1.1"), "169.254.1.1") is None  # link-local
    assert direct_address(Host(address="10.1.2.3", jump="bastion"), "10.1.2.3") is None


def test_direct_is_checked() -> None:
    with pytest.raises(sky.ConfigError, match="direct='yes'"):
        sky.SSH(hosts=["10.0.0.1"], direct="yes")  # type: ignore[arg-type]
