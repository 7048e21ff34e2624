"""How two ends of a pool connection prove the pool's secret to each other without sending it.

Every listener of a pool (the agent, a worker's lane, the collections server) admits a peer
only through :func:`admit`, and every client connects through :func:`prove`::

    server -> client   CHALLENGE  body: 32 random bytes (the server's nonce)
    client -> server   HELLO      JSON: {"nonce": hex, "proof": hex, ...the client's facts}
    server -> client   WELCOME    JSON: {"proof": hex, ...the server's facts}

``proof`` is an HMAC-SHA256 over both nonces, under a key derived from the pool's secret for
one purpose (agents, lanes, collections), with the role in the message so that neither side's
proof can be replayed as the other's. A sniffer sees two nonces and two MACs, which open
nothing later (the next connection has fresh nonces); a process that re-bound a dead agent's
port cannot produce the server's proof, so the client sends it no task. A key that leaks opens
only its purpose (a worker holds the lane and collection keys, never the agents' one).

A link that SSH does not carry (an agent's direct listener, the collections over TCP) is then
*sealed*: both ends derive a session key from the purpose key, both nonces and hashes of the
HELLO and WELCOME bodies as each end sent or received them (``Proof.keys`` on the server,
``Check.keys`` on the client), one key per direction, and every later frame carries MACs under
it with a sequence number (frames.py). A relay that passed the handshake through untouched
can then neither write a frame of its own nor replay, reorder or drop one; one that changed a
HELLO or WELCOME fact makes the two ends' keys differ, so the first frame fails: that is why
neither end acts on a fact of the other's (the agent on the HELLO's ``ttl``, the client on the
WELCOME's package versions) before a first frame has passed.

Before the peer has proven the key, a listener spends almost nothing: it reads a fixed
20-byte header by hand, refuses any first frame that is not a HELLO of at most
``HELLO_MAX`` bytes without buffers, gives the peer ``FIRST_BYTE`` seconds to start its answer and the whole exchange ``DEADLINE``
seconds, and lets at most ``Gate``'s count of connections be in that state at once (a full gate
closes the oldest pending one, not the newest: see ``Gate``). The frame reader (256 KiB), shared memory and per-connection state come after.

Standard library only, and not ``hmac``/``hashlib``: they load OpenSSL, 4 ms of every node's
start; SHA-256 comes from the interpreter's own built-in module.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

from .frames import HEADER, Kind

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

try:  # what hmac.compare_digest is, without hmac's OpenSSL import
    from _operator import _compare_digest
except ImportError:  # pragma: no cover - an interpreter without it
    from hmac import compare_digest as _compare_digest  # type: ignore[no-redef]
from .digest import sha256 as _sha256

NONCE = 32
HELLO_MAX = 4096  # a HELLO's body: a few facts, never more
# A WELCOME's body, read before its proof is checked: an agent's facts with its installed
# packages' versions (tens of KiB in a large environment), never a payload.
WELCOME_MAX = 1 << 20
DEADLINE = 5.0  # seconds for the whole exchange, on the server's side
FIRST_BYTE = 2.0  # seconds from the challenge to the peer's first byte (a real client answers at once)
GRACE = 0.5  # seconds a pending handshake is safe from eviction by newer ones (Gate)
# The lease a client's HELLO may ask an agent for (``ttl``), when not 0 (none): seconds.
LEASE_MIN, LEASE_MAX = 1.0, 366 * 86400.0
# Purposes of the keys derived from a pool's secret.
AGENT, LANE, COLLECTIONS = "agent", "lane", "collections"
_BLOCK = 64
_IPAD = bytes(b ^ 0x36 for b in range(256))  # (bytes.translate tables: the key's pads in C)
_OPAD = bytes(b ^ 0x5C for b in range(256))


class Refused(ValueError):
    """The peer did not prove the key (or did not speak the handshake at all)."""


class TurnedAway(Refused):
    """The server closed the connection before its challenge: its gate was full, or it closed
    this pending handshake to make room for a newer one (busy, or flooded by strangers)."""


def _hmac(key: bytes, msg: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104), as ``hmac.digest(key, msg, "sha256")`` computes it."""
    if len(key) > _BLOCK:
        key = _sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    inner = _sha256(key.translate(_IPAD) + msg).digest()
    return bytes(_sha256(key.translate(_OPAD) + inner).digest())


def derive(secret: str | bytes, purpose: str) -> bytes:
    """The key for one purpose (``AGENT``, ``LANE``, ``COLLECTIONS``) from the pool's secret."""
    raw = secret.encode() if isinstance(secret, str) else secret
    return _hmac(raw, b"skyward/v1/" + purpose.encode())


def _mac(key: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return _hmac(key, role + b"\0" + server_nonce + client_nonce)


def _session(key: bytes, server_nonce: bytes, client_nonce: bytes, hello: bytes,
             welcome: bytes) -> tuple[bytes, bytes]:
    """A sealed link's keys, client -> server and server -> client: the whole handshake's
    transcript under the purpose key, so that both ends agree only on what both saw."""
    base = _hmac(key, b"session\0" + server_nonce + client_nonce + _sha256(hello).digest()
                 + _sha256(welcome).digest())
    return _hmac(base, b"client->server"), _hmac(base, b"server->client")


def _recv_exact(sock: socket.socket, n: int, deadline: float, closed: type[Exception] = Refused) -> bytes:
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Refused("the handshake took too long")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(data))
        except TimeoutError:
            raise Refused("the handshake took too long") from None
        if not chunk:
            raise closed("the peer closed the connection during the handshake")
        data += chunk
    return data


def _first_byte(sock: socket.socket, deadline: float) -> None:
    """Wait until the peer's first byte is there (peeked, not read), or refuse it: a peer that
    says nothing after the challenge only holds a handshake slot."""
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    try:
        if not sock.recv(1, socket.MSG_PEEK):
            raise Refused("the peer closed the connection during the handshake")
    except TimeoutError:
        raise Refused(f"the peer said nothing within {FIRST_BYTE:g} s of the challenge") from None


def _hex(value: object, what: str) -> bytes:
    try:
        raw = bytes.fromhex(str(value))
    except ValueError:
        raise Refused(f"the {what} is not hex") from None
    if len(raw) != NONCE:
        raise Refused(f"the {what} has {len(raw)} bytes, not {NONCE}")
    return raw


class Proof(str):
    """The server's proof of the key, to put in its WELCOME (a hex string), and what the server
    needs to seal the link afterwards (``sealing``, ``keys``)."""

    _key: bytes
    _nonces: tuple[bytes, bytes]
    _hello: bytes

    def sealing(self) -> str:
        """The proof to send instead on a link that will be sealed: it says so under the key,
        so that no one on the way can make the client think the link is plain."""
        return _mac(self._key, b"server-sealed", *self._nonces).hex()

    def keys(self, welcome: bytes) -> tuple[bytes, bytes]:
        """The server's (send, receive) session keys once it sent ``welcome`` (the WELCOME's
        body, with this proof in it) plain: see frames.py for the sealed frames."""
        to_server, to_client = _session(self._key, *self._nonces, self._hello, welcome)
        return to_client, to_server


def admit(sock: socket.socket, key: bytes, deadline: float = DEADLINE,
          gate: Gate | None = None) -> tuple[dict[str, object], Proof]:
    """The server's side: challenge the peer and check its HELLO. Returns the HELLO's facts and
    the proof to put in the WELCOME (``"proof"``); raises ``Refused`` (or OSError) otherwise.
    ``gate``: the one ``sock`` entered, told when the peer has sent a HELLO's header.
    Leaves the socket's timeout as it found it only on success (callers close it on failure)."""
    end = time.monotonic() + deadline
    server_nonce = os.urandom(NONCE)
    sock.settimeout(deadline)
    sock.sendall(HEADER.pack(Kind.CHALLENGE, 0, 0, 0, NONCE) + server_nonce)
    _first_byte(sock, min(end, time.monotonic() + FIRST_BYTE))
    kind, _, nbufs, _, body_len = HEADER.unpack(_recv_exact(sock, HEADER.size, end))
    if kind != Kind.HELLO or nbufs or body_len > HELLO_MAX:
        raise Refused(f"the first frame was not a HELLO of at most {HELLO_MAX} bytes "
                      f"(kind {kind}, {body_len} bytes, {nbufs} buffers)")
    if gate is not None:
        gate.heard(sock)
    raw = _recv_exact(sock, body_len, end)
    try:
        hello = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):  # (nested `[` x 4096: too deep)
        raise Refused("the HELLO is not JSON (or is nested too deep)") from None
    if not isinstance(hello, dict):
        raise Refused("the HELLO is not a JSON object")
    client_nonce = _hex(hello.pop("nonce", ""), "client's nonce")
    proof = _hex(hello.pop("proof", ""), "client's proof")
    if not _compare_digest(proof, _mac(key, b"client", server_nonce, client_nonce)):
        raise Refused("the client's proof is wrong (it does not hold this pool's key)")
    sock.settimeout(None)
    ours = Proof(_mac(key, b"server", server_nonce, client_nonce).hex())
    ours._key, ours._nonces, ours._hello = key, (server_nonce, client_nonce), raw
    return hello, ours


class Check:
    """What the client expects of the server's WELCOME (see ``prove``)."""

    __slots__ = ("_expected", "_hello", "_key", "_nonces", "sealed")

    def __init__(self, expected: bytes, key: bytes = b"", nonces: tuple[bytes, bytes] = (b"", b""),
                 hello: bytes = b"") -> None:
        self._expected = expected
        self._key, self._nonces, self._hello = key, nonces, hello
        # Whether the server's proof said the link will be sealed (Proof.sealing): set by a
        # check that passed, and only by the key, never by a fact of the WELCOME.
        self.sealed = False

    def __call__(self, welcome: dict[str, object]) -> bool:
        """True when the WELCOME carries the server's proof of the key (either kind)."""
        try:
            got = bytes.fromhex(str(welcome.get("proof", "")))
        except ValueError:
            return False
        if self._key and _compare_digest(got, _mac(self._key, b"server-sealed", *self._nonces)):
            self.sealed = True
            return True
        return bool(_compare_digest(got, self._expected))

    def keys(self, welcome: bytes) -> tuple[bytes, bytes]:
        """The client's (send, receive) session keys, given the WELCOME's body as received
        (call only once the WELCOME passed this check)."""
        return _session(self._key, *self._nonces, self._hello, welcome)


def prove(sock: socket.socket, key: bytes, facts: dict[str, object], timeout: float = 60.0) -> Check:
    """The client's side: read the server's challenge, send a HELLO with ``facts`` and the
    proof. Returns the check of the WELCOME that follows (read it with the caller's reader).
    Raises ``Refused`` when the server does not start the handshake in ``timeout`` s (an agent
    of another version, or not an agent at all). Leaves the socket blocking (no timeout)."""
    end = time.monotonic() + timeout
    try:
        kind, _, nbufs, _, body_len = HEADER.unpack(_recv_exact(sock, HEADER.size, end, TurnedAway))
        if kind != Kind.CHALLENGE or nbufs or body_len != NONCE:
            raise Refused(f"the server's first frame was not a challenge (kind {kind}, {body_len} bytes)")
        server_nonce = _recv_exact(sock, NONCE, end)
    finally:
        sock.settimeout(None)
    client_nonce = os.urandom(NONCE)
    proof = _mac(key, b"client", server_nonce, client_nonce)
    body = json.dumps({**facts, "nonce": client_nonce.hex(), "proof": proof.hex()}).encode()
    sock.sendall(HEADER.pack(Kind.HELLO, 0, 0, 0, len(body)) + body)
    return Check(_mac(key, b"server", server_nonce, client_nonce), key, (server_nonce, client_nonce), body)


def read_welcome(sock: socket.socket, who: str, timeout: float = 60.0,
                 limit: int = WELCOME_MAX) -> tuple[dict[str, object], bytes]:
    """Read the WELCOME that follows ``prove`` by hand (nothing of the stream after it is read
    ahead, for a caller that hands the socket to its own reader): its facts and its body as
    received, before anyone checked its proof, so at most ``limit`` bytes of it. Raises
    ``Refused`` for anything but a WELCOME of a JSON object within the limit (a header that
    claims more is refused before its body is read), ``EOFError`` when the server closed the
    connection (it refused our proof), OSError. Leaves the socket blocking."""
    end = time.monotonic() + timeout
    try:
        kind, _, nbufs, _, body_len = HEADER.unpack(_recv_exact(sock, HEADER.size, end, EOFError))
        if kind != Kind.WELCOME or nbufs or body_len > limit:
            raise Refused(f"{who} answered frame kind {kind} ({body_len} bytes, {nbufs} buffers) "
                          f"instead of a WELCOME of at most {limit} bytes")
        raw = _recv_exact(sock, body_len, end, EOFError)
    finally:
        sock.settimeout(None)
    try:
        facts = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Refused(f"{who} answered a WELCOME that is not JSON") from None
    if not isinstance(facts, dict):
        raise Refused(f"{who} answered a WELCOME that is not a JSON object")
    return facts, raw


def welcome(sock: socket.socket, check: Check, who: str, timeout: float = 60.0) -> dict[str, object]:
    """Read the WELCOME that follows ``prove`` (see ``read_welcome``; small: a launched
    worker's) and check the server's proof."""
    try:
        facts, _ = read_welcome(sock, who, timeout, HELLO_MAX)
    except EOFError as exc:
        raise Refused(f"{who} closed the connection during the handshake") from exc
    if not check(facts):
        raise Refused(f"{who} did not prove the key")
    return facts


class _Pending:
    """A connection in its handshake, as ``Gate`` holds it."""

    __slots__ = ("heard", "ours", "since", "sock", "source")

    def __init__(self, since: float, source: str, sock: socket.socket, ours: bool) -> None:
        self.since, self.source, self.sock, self.ours = since, source, sock, ours
        self.heard = False  # the peer sent a HELLO's header


class Gate:
    """The connections in their handshake, few at once, and a log of the refused ones that
    stays short under a flood (one line per ``quiet`` seconds, with the count).

    A full gate does not refuse the newest connection: it closes the oldest pending one that
    has had ``grace`` seconds to answer (a real peer answers the challenge in milliseconds; a
    stranger holding slots open says nothing), so a flood that keeps every slot taken, and
    reopens each one it loses, cannot keep a real client out. Of those, one that has sent
    nothing goes before one that has sent a HELLO's header (``heard``). Each source address
    (every loopback address counts as one, an IPv6 one by its /64) holds at most
    ``per_source`` slots, evicting its own oldest beyond that: a flood from one place leaves
    the other slots to everyone else.

    A flood from several addresses (a LAN machine, a container bridge) can still take every
    slot: the pool's own addresses (``trust``: its nodes', from the topology) are then served
    first. A connection from one of them takes the slot of a stranger's pending handshake at
    once (no grace), and a stranger's connection never evicts theirs. Each of the pool's
    addresses is a source of its own, with its share (another user on a node can only flood
    that node's share). Connections entered without a socket (``enter()``) are only counted."""

    def __init__(self, limit: int = 16, quiet: float = 10.0, *, per_source: int | None = None,
                 grace: float = GRACE) -> None:
        self._limit = limit
        self._per_source = per_source or max(1, limit // 4)
        self._grace = grace
        self._pending: dict[int, _Pending] = {}  # id(sock): oldest first
        self._ours: frozenset[str] = frozenset()
        self._counted = 0  # entered without a socket: never evicted
        self._lock = threading.Lock()
        self._quiet = quiet
        self._last = -quiet
        self._unsaid = 0
        self.evicted = 0  # how many pending handshakes were closed to let newer ones in

    def trust(self, addresses: Iterable[object]) -> None:
        """The pool's own addresses (its nodes' IP addresses), served before any stranger's."""
        found = frozenset(host for host in map(_host, addresses) if host)
        with self._lock:
            self._ours = found

    @property
    def trusted(self) -> frozenset[str]:
        """The pool's own addresses, as ``trust`` was last told them."""
        return self._ours

    def enter(self, sock: socket.socket | None = None, peer: object = None) -> bool:
        """Take a handshake slot for ``sock`` (whose address is ``peer``, as ``accept`` gave it);
        False when none can be had (close the connection). To make room it may close an older
        pending connection (shut down: the thread serving it sees the end and leaves)."""
        now = time.monotonic()
        with self._lock:
            if sock is None:
                if len(self._pending) + self._counted >= self._limit:
                    return False
                self._counted += 1
                return True
            host = _host(peer)
            ours = bool(host) and host in self._ours
            source = "pool " + host if ours else _source(peer)
            victim: int | None = None
            if sum(1 for e in self._pending.values() if e.source == source) >= self._per_source:
                victim = self._victim(lambda e: e.source == source, now, self._grace)
                if victim is None:
                    return False
            elif len(self._pending) + self._counted >= self._limit:
                # a stranger's pending handshake first (at once for one of ours); ours only
                # make room for ours, and only after their grace
                victim = self._victim(lambda e: not e.ours, now, 0.0 if ours else self._grace)
                if victim is None and ours:
                    victim = self._victim(lambda e: True, now, self._grace)
                if victim is None:
                    return False
            if victim is not None:
                old = self._pending.pop(victim).sock
                self.evicted += 1
                with contextlib.suppress(OSError):
                    old.shutdown(socket.SHUT_RDWR)
            self._pending[id(sock)] = _Pending(now, source, sock, ours)
            return True

    def heard(self, sock: socket.socket) -> None:
        """``sock``'s peer sent a HELLO's header: evicted only after those that sent nothing."""
        with self._lock:
            entry = self._pending.get(id(sock))
            if entry is not None:
                entry.heard = True

    def _victim(self, which: Callable[[_Pending], bool], now: float, grace: float) -> int | None:
        """The pending handshake to close for a newer one, of those ``which`` selects that have
        had ``grace`` seconds: the oldest silent one, else the oldest heard one; None if none."""
        heard: int | None = None
        for key, entry in self._pending.items():
            if not which(entry) or now - entry.since < grace:
                continue
            if not entry.heard:
                return key
            if heard is None:
                heard = key
        return heard

    def leave(self, sock: socket.socket | None = None) -> None:
        """Give the slot back (``sock``: as entered; after an eviction, nothing is left to give)."""
        with self._lock:
            if sock is None:
                self._counted = max(0, self._counted - 1)
            else:
                self._pending.pop(id(sock), None)

    def refused(self, why: str) -> str | None:
        """The line to log for a refused connection, or None while the last one is recent."""
        now = time.monotonic()
        with self._lock:
            self._unsaid += 1
            if now - self._last < self._quiet:
                return None
            count, self._unsaid, self._last = self._unsaid, 0, now
        more = f" ({count - 1} more since the last such line)" if count > 1 else ""
        return f"refused a connection: {why}{more}"


def _host(peer: object) -> str:
    """The IP address of ``peer`` (as ``accept`` gave it, or an address alone), IPv4-mapped
    IPv6 and scope ids taken off; "" for a Unix socket's peer."""
    if isinstance(peer, tuple):
        peer = peer[0] if peer else ""
    if not isinstance(peer, str):
        return ""
    return peer.removeprefix("::ffff:").partition("%")[0]


def _source(peer: object) -> str:
    """Whose connection this is, for ``Gate``'s share per source: the peer's IP address (a Unix
    socket's peers, and all loopback addresses, are one source; IPv6 by its /64)."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return "local"
    host = peer[0].removeprefix("::ffff:")
    if host.startswith("127.") or host == "::1":
        return "local"
    if ":" in host:
        try:
            return socket.inet_pton(socket.AF_INET6, host.partition("%")[0])[:8].hex()
        except OSError:
            return host
    return host
