"""Frames after the handshake are authenticated where no SSH carries them, and a client checks
a WELCOME before it reads much of it.

* A relay on loopback between a direct-TCP client and an agent (``--direct``, as
  ``sky.SSH(direct=True)`` and Slurm run it) passes the handshake through untouched, then
  writes a frame of its own, replays, reorders or drops one: the agent drops the connection
  and runs nothing. The same for the collections over TCP, and toward the client.
* A HELLO of 4 KiB of nested ``[`` is refused like any bad HELLO at every listener.
* A server that claims a 1 GB WELCOME is refused from the header; one that accepts any client
  and answers with a wrong proof is refused by every client (and only by its proof check).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

import skyward as sky
from skyward.bootstrap import handshake, serialize
from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import (
    BUFLEN,
    HEADER,
    SEAL_CHUNK,
    TAG,
    Frame,
    FrameReader,
    FrameWriter,
    Kind,
    Tampered,
    _Seal,
)
from skyward.bootstrap.handshake import AGENT, COLLECTIONS, Refused, admit, derive, prove
from skyward.bootstrap.lane import ClientLane
from skyward.bootstrap.state import StateConnection, StateServer, call_sync, encode_request
from skyward.errors import ProtocolError

pytestmark = pytest.mark.timeout(300)
TOKEN = "the-pool-secret"
MB = 1 << 20


class _Touch:
    """A pickle that creates a file when it is loaded: what an injected frame would run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def _evil(path: Path) -> bytes:
    return pickle.dumps(_Touch(path))


# -- the sealed frames themselves ---------------------------------------------------------------
def _sealed_pair() -> tuple[socket.socket, socket.socket, FrameWriter, FrameReader]:
    a, b = socket.socketpair()
    writer, reader = FrameWriter(a), FrameReader(b)
    writer.seal(b"k" * 32)
    reader.seal(b"k" * 32)
    return a, b, writer, reader


def test_sealed_frames_round_trip() -> None:
    a, b, writer, reader = _sealed_pair()
    big = os.urandom(3 * MB)
    frames = [Frame(Kind.TASK, 1, b"hello"), Frame(Kind.RESULT, 2**40, b"", 3, [(0, b"x" * 10), (1, big)]),
              Frame(Kind.OUTPUT, 7, big), *[Frame(Kind.PING, i, bytes([i % 256]) * i) for i in range(100)]]
    t = threading.Thread(target=lambda: [writer.send(f) for f in frames])
    t.start()
    try:
        for sent in frames:
            got = reader.read()
            assert (got.kind, got.task_id, got.flags, bytes(got.body)) == (sent.kind, sent.task_id, sent.flags, bytes(sent.body))
            assert [(c, bytes(d)) for c, d in got.buffers] == [(c, bytes(d)) for c, d in sent.buffers]
    finally:
        t.join()
        a.close()
        b.close()


@pytest.mark.parametrize("buffers", [[], [(0, b"y" * 100)]], ids=["small", "with a buffer"])
def test_a_frame_that_waited_while_the_link_was_sealed_goes_sealed(buffers: list[tuple[int, bytes]]) -> None:
    """A thread that found the link plain (the agent's METRIC to every client) and waited for the
    writer's lock while ``seal`` sent the WELCOME must not send its frame plain after it: the peer
    reads sealed frames from there on, and took its bytes for a tampered frame."""
    a, b = socket.socketpair()
    writer, reader = FrameWriter(a), FrameReader(b)
    key = b"k" * 32
    with a, b:
        with writer._lock:  # what seal() does under the lock, with a sender waiting for it
            t = threading.Thread(target=writer.send_parts, args=(Kind.METRIC, 0, 0, b"[]", buffers))
            t.start()
            time.sleep(0.2)  # it saw no seal and waits for the lock
            a.sendall(HEADER.pack(Kind.WELCOME, 0, 0, 0, 2) + b"{}")
            writer._seal = _Seal(key)
        t.join(10)
        b.settimeout(5)  # (a plain frame read as a sealed one waits for a MAC that never comes)
        welcome = reader.read()  # plain: the handshake covers it
        reader.seal(key)
        got = reader.read()  # sealed, or Tampered
    assert welcome.kind == Kind.WELCOME and (got.kind, bytes(got.body)) == (Kind.METRIC, b"[]")
    assert [bytes(d) for _, d in got.buffers] == [d for _, d in buffers]


def _wire(frames: list[Frame], key: bytes = b"k" * 32) -> list[bytes]:
    """Each frame as a sealed writer puts it on the wire, in order."""
    a, b = socket.socketpair()
    writer = FrameWriter(a)
    writer.seal(key)
    out = []
    with a, b:
        for f in frames:
            t = threading.Thread(target=writer.send, args=(f,))
            t.start()
            payload = len(f.body) + sum(len(d) for _, d in f.buffers)
            size = HEADER.size + BUFLEN.size * len(f.buffers) + payload + TAG * (2 if payload > SEAL_CHUNK else 1)
            out.append(_recv(b, size) or b"")
            t.join()
    return out


def _read_all(wire: bytes, key: bytes = b"k" * 32, abort: Callable[[bytes], None] | None = None,
              reserve: Any = None) -> list[Frame | BaseException]:
    a, b = socket.socketpair()
    reader = FrameReader(b, reserve, abort)
    reader.seal(key)
    got: list[Frame | BaseException] = []

    def send() -> None:
        with contextlib.suppress(OSError):
            a.sendall(wire)
            a.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=send)
    t.start()
    with a, b:
        try:
            while True:
                try:
                    got.append(reader.read())
                except EOFError:
                    return got
                except Tampered as exc:
                    got.append(exc)
                    return got
        finally:
            b.shutdown(socket.SHUT_RDWR)
            t.join()


def test_a_changed_replayed_reordered_or_dropped_frame_fails() -> None:
    f0, f1, f2 = _wire([Frame(Kind.PING, 0), Frame(Kind.TASK, 5, b"payload"), Frame(Kind.CANCEL, 5)])
    assert [type(g) for g in _read_all(f0 + f1 + f2)] == [Frame, Frame, Frame]
    for wire, ok in ((f0 + f0, 1), (f1 + f0, 0), (f0 + f2, 1), (f0 + f1[:-1] + b"X" + f2, 1),
                     (f0 + f1[:HEADER.size] + b"Payload" + f1[-TAG:], 1)):
        got = _read_all(wire)
        assert len(got) == ok + 1 and isinstance(got[-1], Tampered), wire
    # another key (the other direction, or another session) opens nothing
    assert isinstance(_read_all(f0, key=b"j" * 32)[0], Tampered)
    # a plain frame (what a stranger can write) is never taken
    assert isinstance(_read_all(HEADER.pack(Kind.PING, 0, 0, 0, 0) + b"\0" * TAG)[0], Tampered)
    # a large frame's header has a MAC of its own, and a changed one fails before its body
    (big,) = _wire([Frame(Kind.TASK, 1, b"", 0, [(0, b"z" * (SEAL_CHUNK + 1))])])
    assert isinstance(_read_all(big)[0], Frame)
    forged = big[:4] + bytes([big[4] ^ 1]) + big[5:]  # another task id
    assert isinstance(_read_all(forged)[0], Tampered)


def test_a_forged_header_allocates_nothing() -> None:
    """A header that claims 1 GB fails its MAC before anything is allocated for it."""
    claim = HEADER.pack(Kind.TASK, 0, 1, 1, 1 << 30) + BUFLEN.pack(1 << 30) + b"\0" * TAG
    tracemalloc.start()
    try:
        got = _read_all(claim + b"\0" * 4096)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(got[0], Tampered) and peak < 4 * MB


def test_a_frame_that_fails_gives_back_its_shared_memory() -> None:
    """A buffer received into a reserved place (an agent's shared memory) is given back when
    the frame's MAC fails; the frame never reaches anyone."""
    (wire,) = _wire([Frame(Kind.TASK, 1, b"b", 0, [(0, b"z" * (3 * MB + 5))])])
    places: list[bytearray] = []
    aborted: list[bytes] = []

    def reserve(kind: int, n: int) -> tuple[memoryview, bytes]:
        places.append(bytearray(n))
        return memoryview(places[-1]), b"ref%d" % len(places)

    ok = _read_all(wire, reserve=reserve, abort=aborted.append)
    assert isinstance(ok[0], Frame) and ok[0].buffers == [(2, b"ref1")] and aborted == []
    bad = _read_all(wire[:-1] + bytes([wire[-1] ^ 1]), reserve=reserve, abort=aborted.append)
    assert isinstance(bad[0], Tampered) and aborted == [b"ref2"]


def test_session_keys_agree_only_on_the_same_transcript() -> None:
    key = derive(TOKEN, AGENT)
    a, b = socket.socketpair()
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("server", admit(a, key)))
    t.start()
    check = prove(b, key, {"ttl": 5})
    t.join(10)
    a.close()
    b.close()
    _, proof = out["server"]
    welcome = json.dumps({"proof": proof, "sealed": True}).encode()
    server_send, server_receive = proof.keys(welcome)
    client_send, client_receive = check.keys(welcome)
    assert (client_send, client_receive) == (server_receive, server_send) and client_send != client_receive
    assert check.keys(welcome.replace(b"true", b"True")) != (client_send, client_receive)


# -- a relay between a direct-TCP client and an agent --------------------------------------------
def _recv(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


class Relay:
    """A man in the middle on loopback: passes the handshake through untouched (or changed by
    ``edit_hello``), then every frame, whole, and can write, replay, hold or reorder frames."""

    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1",
                 edit_hello: Callable[[bytes], bytes] | None = None,
                 edit_welcome: Callable[[bytes], bytes] | None = None) -> None:
        self._listener = socket.create_server((host, 0))
        self.address = self._listener.getsockname()[:2]
        self._upstream, self._edit_hello, self._edit_welcome = upstream, edit_hello, edit_welcome
        self.welcomed = threading.Event()
        self.upstream_closed = threading.Event()  # the server closed its side
        self.sealed = False
        self.up: list[bytes] = []  # client -> server frames after the handshake, as they came
        self.hold = False
        self.held: list[bytes] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        self.client, _ = self._listener.accept()
        self.server = socket.create_connection(self._upstream)
        threading.Thread(target=self._down, daemon=True).start()
        self._up_loop()

    def _down(self) -> None:
        challenge = _recv(self.server, HEADER.size + handshake.NONCE)
        if challenge:
            self.client.sendall(challenge)
        head = _recv(self.server, HEADER.size) if challenge else None
        body = _recv(self.server, HEADER.unpack(head)[4]) if head else None
        if head and body is not None:
            self.sealed = json.loads(body).get("sealed") is True
            if self._edit_welcome is not None:
                body = self._edit_welcome(body)
                head = HEADER.pack(Kind.WELCOME, 0, 0, 0, len(body))
            self.client.sendall(head + body)
            self.welcomed.set()
            while True:
                try:
                    chunk = self.server.recv(1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                with contextlib.suppress(OSError):
                    self.client.sendall(chunk)
        self.upstream_closed.set()
        with contextlib.suppress(OSError):
            self.client.shutdown(socket.SHUT_RDWR)

    def _up_loop(self) -> None:
        head = _recv(self.client, HEADER.size)
        body = _recv(self.client, HEADER.unpack(head)[4]) if head else None
        if head is None or body is None:
            return
        if self._edit_hello is not None:
            body = self._edit_hello(body)
            head = HEADER.pack(Kind.HELLO, 0, 0, 0, len(body))
        self.up_raw(head + body)
        self.welcomed.wait(10)
        tag = TAG if self.sealed else 0
        while True:
            head = _recv(self.client, HEADER.size)
            if head is None:
                return
            _, _, nbufs, _, body_len = HEADER.unpack(head)
            lengths = _recv(self.client, BUFLEN.size * nbufs) or b""
            payload = body_len + sum(BUFLEN.unpack_from(lengths, i * BUFLEN.size)[0] & ((1 << 62) - 1)
                                     for i in range(nbufs))
            rest = _recv(self.client, payload + tag * (2 if payload > SEAL_CHUNK else 1))
            if rest is None:
                return
            frame = head + lengths + rest
            self.up.append(frame)
            if self.hold:
                self.held.append(frame)
            else:
                self.up_raw(frame)

    def up_raw(self, data: bytes) -> None:
        with self._lock, contextlib.suppress(OSError):
            self.server.sendall(data)

    def down_raw(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.client.sendall(data)

    def close(self) -> None:
        for s in ("client", "server"):
            with contextlib.suppress(AttributeError, OSError):
                getattr(self, s).close()
        self._listener.close()


@pytest.fixture
def agent() -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """An agent as sky.SSH(direct=True) starts it: its loopback port plus a direct listener."""
    env = dict(os.environ, SKYWARD_AGENT_TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "skyward.bootstrap.agent_start", "--ttl", "60", "--direct", "127.0.0.1"],
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    hello = json.loads(proc.stdout.readline())
    assert hello.get("direct"), hello
    yield proc, hello
    proc.kill()
    proc.wait()


def _channel(address: tuple[str, int], outputs: list[Any] | None = None) -> NodeChannel:
    return NodeChannel(socket.create_connection(address), node=0, token=TOKEN, ttl=60,
                       on_output=lambda *a: outputs.append(a) if outputs is not None else None)


def _health(ch: NodeChannel, fn: Callable[..., Any]) -> Future[Frame]:
    """Run ``fn(info)`` in the agent (a HEALTH frame: no workers needed)."""
    fut: Future[Frame] = Future()
    flags, body, buffers = serialize.dumps(fn)
    ch.submit(Kind.HEALTH, flags, body, list(buffers),
              lambda r: fut.set_exception(r) if isinstance(r, BaseException) else fut.set_result(r))
    return fut


def _const(value: int) -> Callable[[Any], int]:
    """A health check that answers ``value`` (a lambda: it travels by value to the agent)."""
    return functools.partial(lambda v, _info: v, value)


def _value(fut: Future[Frame]) -> Any:
    frame = fut.result(30)
    tag, value, *_ = serialize.loads(frame.flags, frame.body, frame.buffers)
    assert tag == "ok", value
    return value


def _serves(hello: dict[str, Any]) -> None:
    """The agent still admits a client on its direct listener and answers it."""
    ch = _channel(("127.0.0.1", hello["direct"]))
    try:
        assert _value(_health(ch, _const(3))) == 3
    finally:
        ch.close()


def test_a_relay_cannot_write_a_frame_of_its_own(agent: Any, tmp_path: Path) -> None:
    """The attack as the review ran it: the handshake passed through untouched, then a HEALTH
    frame carrying a pickle. The agent must drop the connection without unpickling it."""
    _, hello = agent
    relay = Relay(("127.0.0.1", hello["direct"]))
    ch = _channel(relay.address)
    try:
        assert _value(_health(ch, _const(2))) == 2  # the relay passes real traffic
        target = tmp_path / "pwned"
        body = _evil(target)
        relay.up_raw(HEADER.pack(Kind.HEALTH, 0, 0, 99, len(body)) + body + os.urandom(TAG))  # a guessed MAC
        relay.upstream_closed.wait(10)
        time.sleep(0.3)
        assert not target.exists(), "the agent ran a frame the relay wrote"
        assert relay.upstream_closed.is_set(), "the agent kept the connection after a forged frame"
        assert ch.facts.get("sealed") is True
        _serves(hello)
    finally:
        ch.close()
        relay.close()


@pytest.mark.parametrize("how", ["replay", "reorder", "drop"])
def test_a_relay_cannot_replay_reorder_or_drop_frames(agent: Any, how: str) -> None:
    _, hello = agent
    relay = Relay(("127.0.0.1", hello["direct"]))
    ch = _channel(relay.address)
    try:
        assert _value(_health(ch, _const(1))) == 1
        if how == "replay":
            relay.up_raw(relay.up[-1])  # the client's last frame (a HEALTH), again
        else:
            relay.hold = True
            futs = [_health(ch, _const(10 + i)) for i in range(2)]
            deadline = time.monotonic() + 10
            while len(relay.held) < 2:
                assert time.monotonic() < deadline, "the client's frames never came"
                time.sleep(0.01)
            relay.up_raw(relay.held[1] + (relay.held[0] if how == "reorder" else b""))
        assert relay.upstream_closed.wait(10), f"the agent took the frames after a {how}"
        if how != "replay":
            with pytest.raises(BaseException):  # noqa: B017 - the node is lost, whatever the error
                futs[1].result(10)
        _serves(hello)
    finally:
        ch.close()
        relay.close()


def test_a_relay_cannot_write_to_the_client(agent: Any) -> None:
    """Toward the client too: a frame the relay wrote loses the node, and is not handled."""
    _, hello = agent
    relay = Relay(("127.0.0.1", hello["direct"]))
    outputs: list[Any] = []
    ch = _channel(relay.address, outputs)
    try:
        assert _value(_health(ch, _const(4))) == 4
        relay.down_raw(HEADER.pack(Kind.OUTPUT, 1, 0, 1, 5) + b"hello" + os.urandom(TAG))
        deadline = time.monotonic() + 10
        while ch.lost is None:
            assert time.monotonic() < deadline, "the client took a frame the relay wrote"
            time.sleep(0.02)
        assert outputs == []
    finally:
        ch.close()
        relay.close()


def test_a_relay_cannot_talk_the_client_out_of_sealing(agent: Any) -> None:
    """The agent's proof says that it seals, under the key: a relay that turns the WELCOME's
    "sealed" to false still meets a sealed client, which takes no frame the relay writes."""
    _, hello = agent
    relay = Relay(("127.0.0.1", hello["direct"]),
                  edit_welcome=lambda body: body.replace(b'"sealed": true', b'"sealed": false'))
    outputs: list[Any] = []
    ch = _channel(relay.address, outputs)
    try:
        assert ch.facts.get("sealed") is False  # what the relay made it say...
        relay.down_raw(HEADER.pack(Kind.OUTPUT, 1, 0, 1, 5) + b"hello" + os.urandom(TAG))
        deadline = time.monotonic() + 10
        while ch.lost is None:
            assert time.monotonic() < deadline, "the client took a frame the relay wrote"
            time.sleep(0.02)
        assert outputs == []  # ...did not make the client read plain frames
    finally:
        ch.close()
        relay.close()


def test_a_relay_that_changes_the_hello_gets_nothing_through(agent: Any) -> None:
    """The HELLO's facts are not under the proof, but they are under the session keys: a relay
    that changed the lease's ttl makes the first frame fail."""
    _, hello = agent
    relay = Relay(("127.0.0.1", hello["direct"]), edit_hello=lambda body: body.replace(b'"ttl": 60', b'"ttl": 61'))
    ch = _channel(relay.address)
    try:
        _nothing_gets_through(ch, relay)
    finally:
        ch.close()
        relay.close()


def _nothing_gets_through(ch: NodeChannel, relay: Relay) -> None:
    """A task sent on ``ch`` fails and the agent behind ``relay`` drops the connection: the
    first sealed frame did not pass (the client's PING may have lost the node already)."""
    try:
        fut: Future[Frame] | None = _health(ch, _const(5))
    except sky.NodeLostError:
        fut = None
    assert relay.upstream_closed.wait(10)
    if fut is not None:
        with pytest.raises(BaseException):  # noqa: B017
            fut.result(10)


# -- which node answered ----------------------------------------------------------------------------
def test_a_relay_to_another_node_of_the_pool_is_refused(agent: Any, tmp_path: Path) -> None:
    """Two agents of one pool hold the same key, so either proves it; the client expects node 0's
    own agent (the identity its start-up line named) and refuses node 1's, which a relay in
    between handed it, before sending anything. Without an expected identity it would run there."""
    _, hello0 = agent
    proc1, hello1 = _agent_with_lease(60, tmp_path / "agent1.log")
    try:
        assert hello0["id"] != hello1["id"] and len(hello0["id"]) == 24
        relay = Relay(("127.0.0.1", hello1["direct"]))  # the connection meant for node 0 reaches node 1
        try:
            with pytest.raises(ProtocolError, match="another agent of this pool"):
                NodeChannel(lambda: socket.create_connection(relay.address), node=0, token=TOKEN, ttl=60,
                            on_output=lambda *a: None, agent_id=hello0["id"])
            assert not relay.up  # not a frame reached node 1
        finally:
            relay.close()
        ch = NodeChannel(socket.create_connection(("127.0.0.1", hello0["direct"])), node=0, token=TOKEN, ttl=60,
                         on_output=lambda *a: None, agent_id=hello0["id"])  # the right one is admitted
        try:
            assert ch.facts["id"] == hello0["id"]
            assert _value(_health(ch, _const(4))) == 4
        finally:
            ch.close()
        plain = NodeChannel(socket.create_connection(("127.0.0.1", hello1["direct"])), node=0, token=TOKEN, ttl=60,
                            on_output=lambda *a: None)  # no identity to hold it to (what it was before)
        try:
            assert _value(_health(plain, _const(6))) == 6
        finally:
            plain.close()
    finally:
        _stop(proc1)


def test_a_relay_that_rewrites_the_identity_gets_nothing_through(agent: Any, tmp_path: Path) -> None:
    """A relay that sends node 0's connection to node 1 and writes node 0's identity into the
    WELCOME passes the fact check, but the WELCOME's body is under the session keys: the
    client's first frame fails at node 1, and node 1 runs nothing."""
    _, hello0 = agent
    proc1, hello1 = _agent_with_lease(60, tmp_path / "agent1.log")
    try:
        relay = Relay(("127.0.0.1", hello1["direct"]),
                      edit_welcome=lambda body: body.replace(hello1["id"].encode(), hello0["id"].encode()))
        try:
            ch = NodeChannel(socket.create_connection(relay.address), node=0, token=TOKEN, ttl=60,
                             on_output=lambda *a: None, agent_id=hello0["id"])
            try:
                _nothing_gets_through(ch, relay)
            finally:
                ch.close()
        finally:
            relay.close()
    finally:
        _stop(proc1)


# -- the HELLO's and WELCOME's facts count only once proven --------------------------------------
def _agent_with_lease(ttl: float, log: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    env = dict(os.environ, SKYWARD_AGENT_TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "skyward.bootstrap.agent_start", "--ttl", str(ttl),
                             "--direct", "127.0.0.1", "--log", str(log)], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _ttl_to(value: str) -> Callable[[bytes], bytes]:
    def edit(body: bytes) -> bytes:
        assert b'"ttl": 60' in body
        return body.replace(b'"ttl": 60', b'"ttl": ' + value.encode())

    return edit


@pytest.mark.parametrize("value", ["0.01", "1"])
def test_a_relay_that_shortens_the_lease_stops_nothing(agent: Any, value: str) -> None:
    """The review's relay set the HELLO's ttl to 0.01: the agent took it before any frame was
    checked, shut down and dropped another, legitimate client. Such a ttl is no lease (refused);
    a plausible one (1 s) is taken only once the first frame proved the HELLO, which a changed
    HELLO never does."""
    proc, hello = agent
    other = _channel(("127.0.0.1", hello["direct"]))
    relay = Relay(("127.0.0.1", hello["direct"]), edit_hello=_ttl_to(value))
    try:
        with contextlib.suppress(ProtocolError):  # 0.01: refused before its WELCOME
            _channel(relay.address).close()
        assert relay.upstream_closed.wait(10), "the agent kept a connection whose HELLO was changed"
        time.sleep(2)  # eight looks of the lease's watchdog, while the other client says nothing
        assert proc.poll() is None, "the agent stopped on a ttl that nothing proved"
        assert _value(_health(other, _const(7))) == 7 and other.lost is None
    finally:
        relay.close()
        other.close()


@pytest.mark.parametrize("value", ["-1", "NaN", "Infinity", "1e999", '"soon"'])
def test_a_relay_cannot_stop_the_lease(value: str, tmp_path: Path) -> None:
    """Set to -1 or NaN (JSON says NaN too) by a relay, the HELLO's ttl stopped the agent's lease
    for ever: it never exited. Now such a HELLO is refused, and the agent's own lease runs out."""
    proc, hello = _agent_with_lease(2, tmp_path / "agent.log")
    try:
        relay = Relay(("127.0.0.1", hello["direct"]), edit_hello=_ttl_to(value))
        try:
            with contextlib.suppress(ProtocolError):  # refused before its WELCOME
                _channel(relay.address).close()
            assert relay.upstream_closed.wait(10)
            assert proc.wait(timeout=15) == 0, "the agent's lease stopped"
        finally:
            relay.close()
    finally:
        _stop(proc)
    assert "is not a lease" in (tmp_path / "agent.log").read_text()


@pytest.mark.parametrize("ttl", [float("nan"), float("inf"), -1, 0.01, 10 ** 9, "60", True])
def test_a_hello_whose_ttl_is_no_lease_is_refused_with_the_reason(ttl: Any, tmp_path: Path) -> None:
    """Even from a client that holds the key: the agent says why in its log, and no WELCOME."""
    proc, hello = _agent_with_lease(60, tmp_path / "agent.log")
    try:
        with socket.create_connection(("127.0.0.1", hello["port"])) as sock:
            prove(sock, derive(TOKEN, AGENT), {"ttl": ttl})
            with pytest.raises(EOFError):
                handshake.read_welcome(sock, "the agent", 10)
        with socket.create_connection(("127.0.0.1", hello["port"])) as sock:  # 0 and plain seconds do
            check = prove(sock, derive(TOKEN, AGENT), {"ttl": 0})
            assert check(handshake.read_welcome(sock, "the agent", 10)[0])
    finally:
        _stop(proc)
    assert f"the HELLO's ttl {ttl!r:.40} is not a lease" in (tmp_path / "agent.log").read_text()


def test_the_welcomes_versions_count_only_once_proven(agent: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A relay that changed a package's version in the WELCOME made the client warn of a
    difference that is not there. The client now waits for the first sealed frame from the
    agent, which a changed WELCOME never lets pass."""
    from types import SimpleNamespace

    import pytest as pytest_module

    from skyward.core.membership import Membership
    from skyward.spec import Spec

    _, hello = agent

    def older_pytest(body: bytes) -> bytes:
        facts = json.loads(body)
        facts["packages"]["pytest"] = "0.0.1"
        return json.dumps(facts).encode()

    # a proven link: the check runs
    direct = _channel(("127.0.0.1", hello["direct"]))
    proven: list[bool] = []
    try:
        direct.when_proven(lambda: proven.append(True))
        deadline = time.monotonic() + 10
        while not proven:
            assert time.monotonic() < deadline, "a real agent's first frame never proved its WELCOME"
            time.sleep(0.02)
    finally:
        direct.close()
    assert pytest_module.__version__ != "0.0.1"
    relay = Relay(("127.0.0.1", hello["direct"]), edit_welcome=older_pytest)
    members = Membership("p-relay", None, Spec(ttl=60), sky.Options(console="silent"), sky.Worker(),
                         lambda event: None)
    members.cluster = SimpleNamespace(token=TOKEN)  # type: ignore[assignment]
    caplog.set_level("WARNING", logger="skyward")
    ch = members.connect(SimpleNamespace(connect=lambda: socket.create_connection(relay.address), index=0,
                                         agent_id=""))
    try:
        assert ch.facts["packages"]["pytest"] == "0.0.1"  # what the relay made it say...
        assert relay.upstream_closed.wait(10)
        time.sleep(0.5)
        assert not members.drift and "other versions of packages" not in caplog.text  # ...counts for nothing
    finally:
        ch.close()
        relay.close()


def test_a_frame_that_fails_its_mac_is_logged_and_named_in_the_loss(tmp_path: Path) -> None:
    """A forged frame used to end the connection in silence on the agent's side, and the client
    said "the node or its agent stopped". The agent's log now says a frame failed its MAC, and
    the client's error says that the link, not the node, failed."""
    proc, hello = _agent_with_lease(60, tmp_path / "agent.log")
    try:
        relay = Relay(("127.0.0.1", hello["direct"]))
        ch = _channel(relay.address)
        try:
            assert _value(_health(ch, _const(1))) == 1
            relay.up_raw(HEADER.pack(Kind.PING, 0, 0, 0, 0) + os.urandom(TAG))
            assert relay.upstream_closed.wait(10)
            deadline = time.monotonic() + 10
            while "failed its MAC" not in (tmp_path / "agent.log").read_text():
                assert time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
                time.sleep(0.05)
        finally:
            ch.close()
            relay.close()
        relay = Relay(("127.0.0.1", hello["direct"]))
        ch = _channel(relay.address)
        try:
            assert _value(_health(ch, _const(2))) == 2
            relay.down_raw(HEADER.pack(Kind.OUTPUT, 1, 0, 1, 5) + b"hello" + os.urandom(TAG))
            with pytest.raises(sky.NodeLostError) as lost:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    _health(ch, _const(3))
                    time.sleep(0.05)
            assert "failed its MAC" in str(lost.value) and "agent stopped" not in str(lost.value)
        finally:
            ch.close()
            relay.close()
        assert proc.poll() is None  # the agent itself was never the problem
    finally:
        _stop(proc)


def test_local_links_stay_plain_and_a_tcp_client_insists_on_sealing(agent: Any) -> None:
    """The loopback port (the end of an SSH tunnel) is not sealed; a client on TCP to another
    host refuses an agent that does not seal (an old agent, or a WELCOME someone changed)."""
    _, hello = agent
    ch = _channel(("127.0.0.1", hello["port"]))
    try:
        assert ch.facts.get("sealed") is False and _value(_health(ch, _const(6))) == 6
    finally:
        ch.close()
    address = _non_loopback_address()
    if address is None:
        pytest.skip("no non-loopback address on this host")
    relay = Relay(("127.0.0.1", hello["port"]), host=address)  # looks like another host to the client
    try:
        with pytest.raises(ProtocolError, match="without authenticating its frames"):
            _channel(relay.address)
    finally:
        relay.close()


def _non_loopback_address() -> str | None:
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: the address the route would use
        address = str(s.getsockname()[0])
        if not address.startswith("127."):
            with contextlib.suppress(OSError), socket.create_server((address, 0)):
                return address
    return None


# -- the collections over TCP ----------------------------------------------------------------------
@pytest.fixture
def collections() -> Iterator[StateServer]:
    server = StateServer(derive(TOKEN, COLLECTIONS), lambda line: None)
    (tag, value), _ = server._serve("127.0.0.1")
    assert tag == "ok", value
    yield server
    assert server.listener is not None
    server.listener.close()


def _add(conn: StateConnection, name: str) -> int:
    frame = call_sync(conn, encode_request([("add", "counter", name, (1,), 0)], []), [])
    tag, value = pickle.loads(frame.body)
    assert tag == "ok", value
    return int(value)


def test_a_relay_cannot_write_or_replay_a_collections_request(collections: StateServer, tmp_path: Path) -> None:
    assert collections.address is not None
    key = derive(TOKEN, COLLECTIONS).hex()
    for attack in ("write", "replay"):
        relay = Relay(collections.address)
        conn = StateConnection(*relay.address, key, node=1)
        try:
            assert _add(conn, attack) == 1
            target = tmp_path / "pwned"
            body = _evil(target)
            relay.up_raw(HEADER.pack(Kind.STATE, 0, 0, 7, len(body)) + body + os.urandom(TAG)
                         if attack == "write" else relay.up[-1])
            assert relay.upstream_closed.wait(10), f"the collections took a frame the relay could {attack}"
            assert not target.exists()
        finally:
            conn.close()
            relay.close()
        direct = StateConnection(*collections.address, key, node=1)
        try:
            assert _add(direct, attack) == 2  # the replayed increment was not applied
        finally:
            direct.close()


# -- item 4: a HELLO nested too deep, at every listener of a real Local pool -----------------------
DEEP = HEADER.pack(Kind.HELLO, 0, 0, 0, handshake.HELLO_MAX) + b"[" * handshake.HELLO_MAX


@sky.function
def square(x: int) -> int:
    return x * x


@sky.function
def bump(name: str) -> int:
    return sky.counter(name).increment()


def _knock(path: str, data: bytes) -> bytes:
    got = b""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                got += chunk
    return got


def test_a_hello_nested_too_deep_is_refused_quietly_everywhere(capfd: pytest.CaptureFixture[str]) -> None:
    """The agent's and the collections' refusals go to the node's log; the lane's worker
    prints to the client (its stderr is the tasks' output): neither may fill up."""
    with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
        bump("warm") >> pool  # the collections are served once a task used them
        ch = pool.members.channels[0]
        deadline = time.monotonic() + 10
        while ch.lane is None:
            assert time.monotonic() < deadline, "the lane never opened"
            square(2) >> pool
        node = pool.cluster.describe()["nodes"][0]
        served = pool.shared.served
        assert served is not None and served[1] is not None
        log = Path(node["log"])
        assert ch.facts.get("sealed") is False  # a Local node's Unix socket: its folder protects it
        for path in (str(node["unix"]), ch.lane, str(served[1]["host"])):
            assert path is not None
            before = log.stat().st_size
            for _ in range(30):
                got = _knock(path, DEEP)
                assert len(got) <= HEADER.size + handshake.NONCE  # a challenge at most, never a WELCOME
            time.sleep(0.5)
            grew = log.stat().st_size - before
            assert grew < 2000, f"{path}: the log grew by {grew} bytes:\n{log.read_text()[-3000:]}"
            printed = "".join(capfd.readouterr())
            assert len(printed) < 2000, f"{path}: the client printed {len(printed)} bytes:\n{printed[-3000:]}"
        assert square(9) >> pool == 81
        assert bump("after") >> pool == 1


def test_admit_refuses_a_deep_hello_as_not_json() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall(DEEP)
        with pytest.raises(Refused, match="not JSON"):
            admit(a, derive(TOKEN, AGENT))


# -- item 4 and 5: what the clients check of a WELCOME --------------------------------------------
def _fake_server(answer: Callable[[socket.socket], None], unix: str | None = None) -> tuple[Any, threading.Thread]:
    """A server that takes any client: a challenge, then the client's HELLO is read and not
    checked, then ``answer`` writes what follows."""
    if unix:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(unix)
        listener.listen(1)
        where: Any = unix
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        where = listener.getsockname()[:2]

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
        with conn:
            conn.sendall(HEADER.pack(Kind.CHALLENGE, 0, 0, 0, handshake.NONCE) + os.urandom(handshake.NONCE))
            head = _recv(conn, HEADER.size)
            assert head is not None and _recv(conn, HEADER.unpack(head)[4]) is not None
            with contextlib.suppress(OSError):
                answer(conn)
                time.sleep(1)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return where, t


def _claim_a_gigabyte(conn: socket.socket) -> None:
    conn.sendall(HEADER.pack(Kind.WELCOME, 0, 0, 0, 1 << 30))
    for _ in range(64):  # 64 MB of it, then the connection ends
        conn.sendall(b"\0" * MB)


def _wrong_proof(conn: socket.socket) -> None:
    body = json.dumps({"proof": os.urandom(32).hex(), "pong": True, "sealed": True, "lane": 1, "pid": 1}).encode()
    conn.sendall(HEADER.pack(Kind.WELCOME, 0, 0, 0, len(body)) + body)


def _clients(tmp_path: Path) -> dict[str, Callable[[Callable[[socket.socket], None]], Any]]:
    """Each client of a pool listener, connecting to a fake server that answers with ``answer``."""

    def channel(answer: Callable[[socket.socket], None]) -> Any:
        where, _ = _fake_server(answer)
        return NodeChannel(socket.create_connection(where), node=0, token=TOKEN, ttl=60, on_output=lambda *a: None)

    def lane(answer: Callable[[socket.socket], None]) -> Any:
        path = str(tmp_path / f"lane-{os.urandom(4).hex()}.sock")
        _fake_server(answer, unix=path)
        return ClientLane(path, TOKEN, 1, timeout=10)

    def state(answer: Callable[[socket.socket], None]) -> Any:
        where, _ = _fake_server(answer)
        return StateConnection(*where, derive(TOKEN, COLLECTIONS).hex(), node=1)

    def launched(answer: Callable[[socket.socket], None]) -> Any:  # a launched worker calling back
        where, _ = _fake_server(answer)
        with socket.create_connection(where) as sock:
            return handshake.welcome(sock, prove(sock, os.urandom(32), {"pid": 1}), "the agent")

    return {"channel": channel, "lane": lane, "state": state, "launched": launched}


CLIENTS = ["channel", "lane", "state", "launched"]
REFUSED = (ProtocolError, OSError, EOFError, Refused)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_gigabyte_welcome_is_refused_from_its_header(client: str, tmp_path: Path) -> None:
    connect = _clients(tmp_path)[client]
    start = time.monotonic()
    tracemalloc.start()
    try:
        with pytest.raises(REFUSED) as caught:
            connect(_claim_a_gigabyte)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * MB, f"the client took {peak / MB:.0f} MB for an unproven WELCOME"
    assert time.monotonic() - start < 5
    assert "WELCOME" in str(caught.value) and str(1 << 30) in str(caught.value), caught.value


@pytest.mark.parametrize("client", CLIENTS)
def test_a_server_that_admits_anyone_is_refused_for_its_wrong_proof(client: str, tmp_path: Path) -> None:
    """The server skips its own check and answers a WELCOME with a wrong
    proof; only the client's check of that proof stands between it and the client's tasks."""
    with pytest.raises(REFUSED, match="prove"):
        _clients(tmp_path)[client](_wrong_proof)


@pytest.mark.parametrize("client", CLIENTS)
def test_without_the_proof_check_that_server_would_pass(client: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above sees the check fail: with ``Check`` answering True, the same server
    gets through (so that test cannot pass on an earlier refusal, as the old one did)."""
    def anything(self: handshake.Check, welcome: dict[str, object]) -> bool:
        self.sealed = True  # (a check that takes anything takes a sealing proof too)
        return True

    monkeypatch.setattr(handshake.Check, "__call__", anything)
    got = _clients(tmp_path)[client](_wrong_proof)
    with contextlib.suppress(AttributeError, OSError):
        got.close()


def test_a_pool_cannot_ask_for_a_lease_its_agents_refuse() -> None:
    """The longest ttl a Spec takes is the longest lease an agent takes: a longer one is a
    ConfigError on the client, not a handshake the agents refuse."""
    from skyward.bootstrap.agent import lease_ttl
    from skyward.spec import TTL_MAX, Spec

    assert TTL_MAX == handshake.LEASE_MAX and lease_ttl(Spec(ttl=TTL_MAX).ttl) == TTL_MAX
    with pytest.raises(sky.ConfigError, match="from 0 to"):
        Spec(ttl=TTL_MAX + 1)
