"""Every listener is safe before authentication: the agent, a worker's
lane and the collections server admit a peer only through the challenge-response of
bootstrap/handshake.py, spend nothing on a stranger, and a Local pool has no TCP port at all.

Real Local pools, real agents and workers, real sockets; hypothesis throws arbitrary bytes at
each listener's first read."""

from __future__ import annotations

import hmac
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import flood_silently
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import skyward as sky
from skyward.bootstrap import handshake
from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import HEADER, Kind
from skyward.bootstrap.handshake import AGENT, COLLECTIONS, LANE, Refused, admit, derive, prove
from skyward.bootstrap.lane import ClientLane
from skyward.bootstrap.state import StateConnection
from skyward.errors import ProtocolError

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)
CHALLENGE = HEADER.pack(Kind.CHALLENGE, 0, 0, 0, handshake.NONCE)
MB = 1 << 20


@sky.function
def square(x: int) -> int:
    return x * x


@sky.function
def bump(name: str) -> int:
    return sky.counter(name).increment()


# -- the handshake itself -------------------------------------------------------------------------
def test_the_mac_is_hmac_sha256_and_keys_differ_by_purpose() -> None:
    for key, msg in ((b"k", b"m"), (b"x" * 64, b""), (b"y" * 200, b"z" * 1000)):
        assert handshake._hmac(key, msg) == hmac.digest(key, msg, "sha256")
    keys = {derive("secret", p) for p in (AGENT, LANE, COLLECTIONS)}
    assert len(keys) == 3 and derive("secret", AGENT) != derive("other", AGENT)


def _pair(server_key: bytes, client_key: bytes) -> tuple[object, object]:
    """One handshake over a socket pair: what each side ended with (facts/proof or an error)."""
    a, b = socket.socketpair()
    out: dict[str, object] = {}

    def server() -> None:
        try:
            out["server"] = admit(a, server_key)
        except (Refused, OSError) as exc:
            out["server"] = exc
        finally:
            a.close()

    t = threading.Thread(target=server)
    t.start()
    try:
        check = prove(b, client_key, {"ttl": 5})
        t.join(10)
        result = out["server"]
        if isinstance(result, tuple):  # the client checks the proof the WELCOME would carry
            out["client"] = check({"proof": result[1]})
        else:
            out["client"] = False
    except (Refused, OSError) as exc:
        out["client"] = exc
    finally:
        b.close()
        t.join(10)
    return out["server"], out["client"]


def test_both_sides_prove_the_key_and_a_wrong_key_fails_either_way() -> None:
    key = derive("secret", AGENT)
    server, client = _pair(key, key)
    assert isinstance(server, tuple) and server[0] == {"ttl": 5} and client is True
    server, client = _pair(key, derive("secret", LANE))  # a client with another purpose's key
    assert isinstance(server, Refused) and "proof is wrong" in str(server)


def test_a_server_without_the_key_cannot_pass_the_clients_check() -> None:
    """A process that took a dead agent's address: the client sees a wrong proof."""
    server, client = _pair(derive("guess", AGENT), derive("secret", AGENT))
    assert isinstance(server, Refused) and client is False


def test_the_secret_never_crosses_and_nothing_repeats() -> None:
    """What a sniffer sees of two connections: no secret, no key, no repeated proof."""
    secret = "the-pool-secret-" + os.urandom(8).hex()
    key = derive(secret, AGENT)
    seen = []
    # each connection through a tap: a server that records what crossed
    for _ in range(2):
        a, b = socket.socketpair()
        got: list[bytes] = []

        def tap(a: socket.socket = a, got: list[bytes] = got) -> None:
            nonce = os.urandom(handshake.NONCE)
            a.sendall(HEADER.pack(Kind.CHALLENGE, 0, 0, 0, len(nonce)) + nonce)
            head = a.recv(HEADER.size, socket.MSG_WAITALL)
            body = a.recv(HEADER.unpack(head)[4], socket.MSG_WAITALL)
            got.append(nonce + head + body)
            a.close()

        t = threading.Thread(target=tap)
        t.start()
        prove(b, key, {"ttl": 5})
        t.join(10)
        b.close()
        seen.append(got[0])
    for wire in seen:
        assert secret.encode() not in wire and key not in wire and key.hex().encode() not in wire
    hellos = [json.loads(w[handshake.NONCE + HEADER.size:]) for w in seen]
    assert hellos[0]["proof"] != hellos[1]["proof"] and hellos[0]["nonce"] != hellos[1]["nonce"]


# -- a real Local pool ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool() -> Iterator[sky.Pool]:
    with sky.Compute(nodes=1, options=QUIET) as p:
        bump("warm") >> p  # the collections are served (the head listens) once a task used them
        yield p


def _agent_pid(pool: sky.Pool) -> int:
    return int(pool.members.channels[0].facts["pid"])


def _agent_sock(pool: sky.Pool) -> str:
    node = pool.cluster.describe()["nodes"][0]
    return str(node["unix"])


def _lane(pool: sky.Pool) -> str:
    deadline = time.monotonic() + 10
    while pool.members.channels[0].lane is None:
        assert time.monotonic() < deadline, "the lane never opened"
        square(2) >> pool
    path = pool.members.channels[0].lane
    assert path is not None
    return path


def _collections(pool: sky.Pool) -> str:
    served = pool.shared.served
    assert served is not None and served[1] is not None
    return str(served[1]["host"])


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _worker_pid(pool: sky.Pool) -> int:
    agent = _agent_pid(pool)
    kids = [int(p) for p in Path(f"/proc/{agent}/task/{agent}/children").read_text().split()]
    assert kids, "the agent has no worker"
    return kids[0]


def _knock(path: str, data: bytes, *, close_write: bool = True, timeout: float = 10) -> tuple[bytes, float]:
    """Send ``data`` to the listener at ``path``; what came back before it closed, and when."""
    start = time.monotonic()
    got = b""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(path)
        try:
            s.sendall(data)
            if close_write:
                s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                got += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed with our bytes unread: refused just the same
    return got, time.monotonic() - start


def test_local_agents_listen_on_unix_sockets_in_0700_folders_only(pool: sky.Pool) -> None:
    node = pool.cluster.describe()["nodes"][0]
    assert node.get("port") is None
    for path in (_agent_sock(pool), _lane(pool), _collections(pool)):
        assert os.stat(os.path.dirname(path)).st_mode & 0o077 == 0, path
    # no TCP socket at all in the agent or its worker (every inet socket would be in /proc/net)
    inodes = set()
    for pid in (_agent_pid(pool), _worker_pid(pool)):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}") if os.path.exists(f"/proc/{pid}/fd/{fd}") else ""
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    tcp = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            tcp |= {line.split()[9] for line in list(f)[1:]}
    assert inodes and not inodes & tcp


def test_another_user_cannot_even_connect(pool: sky.Pool) -> None:
    if os.geteuid() != 0 or not _has("setpriv"):
        pytest.skip("acting as another user needs root and setpriv")
    code = ("import socket,sys\nfor p in sys.argv[1:]:\n s=socket.socket(socket.AF_UNIX)\n"
            " try:\n  s.connect(p); print('connected', p)\n except OSError as e: print('refused', e.errno)\n")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                          "-c", code, _agent_sock(pool), _lane(pool), _collections(pool)],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:3] == ["refused 13"] * 3, out.stdout + out.stderr


def _has(tool: str) -> bool:
    return subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode == 0


@pytest.mark.parametrize("kind", [Kind.HELLO, Kind.TASK])
def test_a_300_mb_claim_is_closed_at_once_and_costs_nothing(pool: sky.Pool, kind: int) -> None:
    before = _rss(_agent_pid(pool))
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(_agent_sock(pool))
        s.sendall(HEADER.pack(kind, 0, 0, 0, 300 * MB))  # and then nothing: the connection stays open
        got = b""
        start = time.monotonic()
        try:
            while chunk := s.recv(4096):
                got += chunk
        except ConnectionResetError:
            pass
        assert time.monotonic() - start < 2  # closed at once, not at the deadline
    assert got == CHALLENGE + got[len(CHALLENGE):] and len(got) == len(CHALLENGE) + handshake.NONCE
    assert _rss(_agent_pid(pool)) - before < 5 * MB
    assert square(7) >> pool == 49


def test_an_idle_stranger_is_closed_at_the_first_byte_deadline(pool: sky.Pool) -> None:
    got, took = _knock(_agent_sock(pool), b"", close_write=False)
    assert len(got) == len(CHALLENGE) + handshake.NONCE
    assert handshake.FIRST_BYTE - 0.5 < took < handshake.FIRST_BYTE + 2 < handshake.DEADLINE + 2


# -- a full gate closes the oldest silent handshake, not the newest -------------
def _pending(n: int) -> list[tuple[socket.socket, socket.socket]]:
    return [socket.socketpair() for _ in range(n)]


def _shut(sock: socket.socket, wait: float = 0.5) -> bool:
    """Whether the gate shut ``sock``'s server end (its peer reads the end at once)."""
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_a_full_gate_evicts_the_oldest_pending_handshake_not_the_newest() -> None:
    gate = handshake.Gate(limit=4, grace=0.3, per_source=4)
    pairs = _pending(7)
    try:
        for server, _ in pairs[:4]:
            assert gate.enter(server, "")
        # all four are younger than the grace: the newest is refused (a real client answers
        # the challenge in milliseconds, so the grace protects it from a reopening flood)
        assert not gate.enter(pairs[4][0], "")
        time.sleep(0.35)
        assert gate.enter(pairs[4][0], "")  # now the oldest silent one makes room
        assert gate.evicted == 1 and _shut(pairs[0][1])
        gate.leave(pairs[0][0])  # the evicted one's thread leaves later: nothing to give back
        assert gate.enter(pairs[5][0], "")  # the next oldest goes, never the newer ones
        assert gate.evicted == 2 and _shut(pairs[1][1])
        assert not any(_shut(client, 0.02) for _, client in pairs[2:6])
        gate.leave(pairs[2][0])
        assert gate.enter(pairs[6][0], "")  # a slot given back is taken without eviction
        assert gate.evicted == 2
        assert not any(_shut(client, 0.02) for _, client in pairs[3:7])
        assert gate.enter() is False  # counted entries (no socket) never evict
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_one_source_holds_only_its_share_of_the_gate() -> None:
    gate = handshake.Gate(limit=8, grace=0.0, per_source=2)
    pairs = _pending(6)
    try:
        flood = [("10.1.2.3", 40000 + i) for i in range(3)]
        for (server, _), peer in zip(pairs[:3], flood, strict=True):
            assert gate.enter(server, peer)
        assert gate.evicted == 1 and _shut(pairs[0][1])  # the third evicted its own oldest
        # another address, and the loopback addresses (one source), are not touched
        assert gate.enter(pairs[3][0], ("10.1.2.4", 5000))
        assert gate.enter(pairs[4][0], ("127.0.0.1", 5000)) and gate.enter(pairs[5][0], ("127.0.0.2", 5001))
        assert gate.evicted == 1
        assert handshake._source(("fd00::1", 1, 0, 0)) == handshake._source(("fd00::2", 9, 0, 0))
        assert handshake._source(("::ffff:127.0.0.5", 1, 0, 0)) == handshake._source("") == "local"
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_the_pools_own_addresses_and_peers_that_spoke_are_served_first() -> None:
    gate = handshake.Gate(limit=4, grace=10.0, per_source=2)
    gate.trust(["10.0.0.1", "", None])
    pairs = _pending(9)
    try:
        # strangers from four addresses fill the gate; all young, so a fifth is refused
        for (server, _), i in zip(pairs[:4], range(2, 6), strict=True):
            assert gate.enter(server, (f"10.0.0.{i}", 40000))
        gate.heard(pairs[0][0])  # the oldest sent a HELLO's header: the silent ones go first
        assert not gate.enter(pairs[4][0], ("10.0.0.6", 40000))
        # a node of the pool takes a stranger's slot at once: the oldest silent one
        assert gate.enter(pairs[5][0], ("::ffff:10.0.0.1", 5000, 0, 0))
        assert gate.evicted == 1 and _shut(pairs[1][1]) and not _shut(pairs[0][1], 0.02)
        assert gate.enter(pairs[6][0], ("10.0.0.1", 5001))
        assert gate.evicted == 2 and _shut(pairs[2][1])
        # its own share holds as any source's (its own oldest, after the grace: refused now)
        assert not gate.enter(pairs[7][0], ("10.0.0.1", 5002))
        # a stranger never evicts the pool's own
        gate.leave(pairs[3][0])
        assert gate.enter(pairs[7][0], ("10.0.0.7", 1)) and not gate.enter(pairs[8][0], ("10.0.0.8", 1))
        assert not any(_shut(client, 0.02) for _, client in pairs[5:7])
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_the_head_agent_tells_its_collections_the_pools_addresses_from_the_topology() -> None:
    from skyward.bootstrap.agent import Agent

    def topology(*ips: str) -> dict[str, object]:
        return {"topology": {"node": 0, "peers": [{"node": i, "private_ip": ip, "public_ip": None}
                                                  for i, ip in enumerate(ips)]}}

    agent = Agent("secret", 0)
    agent.config = topology("10.0.0.1", "10.0.0.2")  # the first CONFIGURE came before the serve
    state = agent._state()
    assert state.gate.trusted == {"10.0.0.1", "10.0.0.2"}
    agent._configure(topology("10.0.0.1", "10.0.0.2", "fd00::3"))  # a resize: a third node
    assert state.gate.trusted == {"10.0.0.1", "10.0.0.2", "fd00::3"}
    agent._configure(topology("10.0.0.1"))  # and back to one: the others are strangers again
    assert state.gate.trusted == {"10.0.0.1"}


def test_a_flood_from_several_addresses_leaves_the_pools_own_address_its_handshakes() -> None:
    from skyward.bootstrap.state import StateServer

    key = derive("s", COLLECTIONS)
    server = StateServer(key, lambda line: None)
    (tag, where), _ = server._serve("127.0.0.1")
    assert tag == "ok"
    server.trust({"peers": [{"node": 0, "private_ip": "127.0.0.1", "public_ip": None}]})
    stop = threading.Event()
    flood = threading.Thread(target=flood_silently,
                             args=("127.0.0.1", where["port"], [f"127.0.0.{i}" for i in range(2, 6)], 12, stop),
                             daemon=True)
    flood.start()
    try:
        time.sleep(1.5)  # every slot the strangers can take is taken, and reopened as it goes
        served = 0
        for _ in range(15):
            try:
                StateConnection("127.0.0.1", where["port"], key.hex(), 0).close()
                served += 1
            except ConnectionError:
                pass
            time.sleep(0.05)
        assert served == 15, f"the pool's own address completed {served} of 15 handshakes"
    finally:
        stop.set()
        flood.join(10)
        assert server.listener is not None
        server.listener.close()


def test_a_flood_of_idle_strangers_is_capped_and_the_pool_serves_on(pool: sky.Pool) -> None:
    agent = _agent_pid(pool)
    threads_before = len(os.listdir(f"/proc/{agent}/task"))
    rss_before = _rss(agent)
    socks = []
    try:
        for _ in range(60):
            s = socket.socket(socket.AF_UNIX)
            s.connect(_agent_sock(pool))
            socks.append(s)
        time.sleep(0.5)
        closed = 0
        for s in socks:  # the ones beyond the cap were closed without a challenge
            s.settimeout(0.2)
            try:
                first = s.recv(len(CHALLENGE) + handshake.NONCE, socket.MSG_PEEK)
            except TimeoutError:
                continue
            except ConnectionResetError:
                first = b""
            closed += first == b""
        assert closed >= 60 - 16
        assert len(os.listdir(f"/proc/{agent}/task")) - threads_before <= 16
        assert _rss(agent) - rss_before < 20 * MB
        # the pool's own connection was made before: it serves on, the collections too
        assert pool.map(square, range(20)) == [x * x for x in range(20)]
        assert bump("flood") >> pool == 1
    finally:
        for s in socks:
            s.close()
    # the strangers are gone: a new client is admitted again
    ch = NodeChannel(_connect(_agent_sock(pool)), node=0, token=pool.cluster.token, ttl=600,
                     on_output=lambda *a: None)
    ch.close()


def _connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return s


def _agent_turning_away(n: int) -> tuple[object, list[int]]:
    """``connect`` for a NodeChannel: an agent whose first ``n`` connections are closed before
    the challenge (a full gate), and which admits the next; the tries made, as a list."""
    from skyward.bootstrap.frames import HEADER

    tries: list[int] = []
    key = derive("secret", AGENT)

    def serve(sock: socket.socket) -> None:
        _, proof = admit(sock, key)
        body = json.dumps({"proof": proof, "pong": True}).encode()
        sock.sendall(HEADER.pack(Kind.WELCOME, 0, 0, 0, len(body)) + body)

    def connect() -> socket.socket:
        ours, theirs = socket.socketpair()
        tries.append(len(tries))
        if len(tries) <= n:
            theirs.close()
        else:
            threading.Thread(target=serve, args=(theirs,), daemon=True).start()
        return ours

    return connect, tries


def test_a_client_turned_away_before_the_handshake_tries_again_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skyward.bootstrap import channel

    monkeypatch.setattr(channel, "_RETRY_PAUSES", (0.01, 0.02, 0.04))
    connect, tries = _agent_turning_away(2)
    ch = NodeChannel(connect, node=0, token="secret", ttl=600, on_output=lambda *a: None)
    assert len(tries) == 3 and ch.facts["pong"] is True
    ch.close()
    connect, tries = _agent_turning_away(10)
    with pytest.raises(ProtocolError, match=r"refused the connection before the handshake \(busy or flooded"):
        NodeChannel(connect, node=0, token="secret", ttl=600, on_output=lambda *a: None)
    assert len(tries) == 4  # the first and three more, one after each pause
    connect, tries = _agent_turning_away(1)  # a socket, not a way to connect: no second try
    with pytest.raises(ProtocolError, match="busy or flooded"):
        NodeChannel(connect(), node=0, token="secret", ttl=600, on_output=lambda *a: None)


def test_each_key_opens_only_its_own_listener(pool: sky.Pool) -> None:
    secret = pool.cluster.token
    with pytest.raises(ProtocolError):  # the agent wants the agents' key: the secret itself does not do
        NodeChannel(_connect(_agent_sock(pool)), node=0, token=derive(secret, LANE).hex(), ttl=600,
                    on_output=lambda *a: None)
    ClientLane(_lane(pool), secret, 1).close()  # (the client derives the lane key itself)
    with pytest.raises((OSError, EOFError)):  # (the channel takes the agent's way on either)
        ClientLane(_lane(pool), "not-the-secret", 1, timeout=3)
    StateConnection(_collections(pool), 0, derive(secret, COLLECTIONS).hex(), node=0).close()
    with pytest.raises(ConnectionError):
        StateConnection(_collections(pool), 0, derive(secret, AGENT).hex(), node=0)


# -- hypothesis: arbitrary first bytes at each listener ------------------------------------------
_headers = st.builds(
    lambda kind, flags, nbufs, tid, size, rest: HEADER.pack(kind, flags, nbufs, tid, size) + rest,
    st.integers(0, 255), st.integers(0, 255), st.integers(0, 0xFFFF), st.integers(0, 2**64 - 1),
    st.one_of(st.integers(0, 8192), st.integers(0, 2**64 - 1)), st.binary(max_size=256),
)
_hellos = st.builds(
    lambda body: HEADER.pack(Kind.HELLO, 0, 0, 0, len(body)) + body,
    st.one_of(
        st.binary(max_size=5000),
        st.dictionaries(st.sampled_from(["nonce", "proof", "ttl", "token", "node", "pid"]),
                        st.one_of(st.text(max_size=70), st.integers(), st.none(),
                                  st.binary(min_size=32, max_size=32).map(bytes.hex)),
                        max_size=6).map(lambda d: json.dumps(d).encode()),
    ),
)
_first_bytes = st.one_of(st.binary(max_size=2048), _headers, _hellos)


@pytest.mark.parametrize("listener", ["agent", "lane", "collections"])
def test_arbitrary_first_bytes_are_refused(pool: sky.Pool, listener: str) -> None:
    path = {"agent": _agent_sock, "lane": _lane, "collections": _collections}[listener](pool)
    owner = _worker_pid(pool) if listener == "lane" else _agent_pid(pool)
    rss_before = _rss(owner)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(_first_bytes)
    def throw(data: bytes) -> None:
        got, took = _knock(path, data)
        # only the challenge came back (never a WELCOME), and the connection was closed
        assert got in (b"", CHALLENGE + got[len(CHALLENGE):]) and len(got) <= len(CHALLENGE) + handshake.NONCE
        assert took < handshake.DEADLINE + 2

    throw()
    assert _rss(owner) - rss_before < 10 * MB
    assert square(5) >> pool == 25
    assert bump(f"after-{listener}") >> pool == 1


# -- item 4: the collections listener binds a private or loopback address only ----------------------
@pytest.mark.parametrize("host", ["8.8.8.8", "2001:4860:4860::8888", "0.0.0.0", "no-such-host.invalid"])
def test_the_collections_refuse_a_public_address(host: str) -> None:
    from skyward.bootstrap.state import StateServer

    server = StateServer(derive("s", COLLECTIONS), lambda line: None)
    (tag, value), _ = server._serve(host)
    assert tag == "err" and isinstance(value, sky.CollectionError)
    assert server.listener is None  # nothing was bound
    if host == "8.8.8.8":
        assert "public" in str(value) and "private" in str(value)


def test_the_collections_serve_on_loopback_and_private_addresses() -> None:
    from skyward.bootstrap.state import StateServer

    server = StateServer(derive("s", COLLECTIONS), lambda line: None)
    (tag, value), _ = server._serve("localhost")  # a name: what it resolves to counts
    try:
        assert tag == "ok" and value["host"] == "localhost" and value["port"] > 0
    finally:
        assert server.listener is not None
        server.listener.close()
