"""Distributed collections on the wire: the head node's collection server and a node's
connection to it.

The state of a pool's ``sky.dict/set/counter/queue/barrier/lock`` lives in one place, the
agent of the head node (node 0), so that an operation from a cloud node never crosses the
client's link. Requests reach it two ways:

* from the client, as STATE frames on its existing channel to the head's agent;
* from workers on any node, over a listener the head's agent opens on the pool's private
  address (asked for by the client with a ``serve`` request before it configures the nodes;
  a Local pool's on a Unix socket in the head's 0700 folder). The listener binds a private or
  loopback address only, never a public one, and admits a peer only after both proved the
  pool's collections key (handshake.py: a capped, deadline-bound exchange, so a stranger can
  neither stall it nor make it allocate); the stack's members-only firewall rule covers it on
  clouds.

A request is one frame: ``pickle((ops, vals))`` plus the values' out-of-band buffers. ``ops``
is a list of ``(op, kind, name, args, nvals)`` applied in order under one lock (a single op
for strong consistency; a node's batched writes plus an optional read for eventual), and the
answer is the last op's. Values (dict values, queue items) are cloudpickled by the caller and
stored here as opaque blobs ``(flags, body, buffers)``: the server never unpickles them, so it
needs none of the user's packages and large values pass through without a copy into a pickle.
Keys and set members are unpickled here (they must hash as they do on the caller).

Operations that wait (``queue.get``, ``lock.acquire``, ``barrier.wait``) never block a reader
thread: they park a waiter that is answered later, or by the timer when its deadline passes.
When a peer's connection ends (its worker process died) or the client reports its node lost,
the locks it held are released (with a log line that reaches the client as a Log event), its
waiters are dropped and the barriers it takes part in break.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import json
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable

from skyward.errors import CollectionError, CollectionTimeoutError

from .frames import Frame, FrameReader, FrameWriter, Kind, tune
from .handshake import Gate, Refused, admit, prove, read_welcome

# Plain slotted classes and no typing at run time: the head node's agent imports this module
# on the way to the pool's first task (its CONFIGURE carries the collections' address), and
# dataclasses and typing would double what that import costs.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Blob = tuple[int, bytes, list[tuple[int, Any]]]  # a value as the caller pickled it
if TYPE_CHECKING:
    Reply = tuple[tuple[Any, ...], list[tuple[int, Any]]]  # (tag...), buffers


def encode_request(ops: list[tuple[Any, ...]], vals: list[tuple[int, bytes, int]]) -> bytes:
    try:
        return pickle.dumps((ops, vals), protocol=5)
    except Exception:  # keys of types plain pickle cannot handle (defined in __main__...)
        import cloudpickle

        return cloudpickle.dumps((ops, vals), protocol=5)


# -- the server ---------------------------------------------------------------------------------
class Peer:
    """One connection that sends requests: a worker process, or the client's channel."""

    __slots__ = ("alive", "gone", "label", "node", "pid", "sock", "told", "writer")

    def __init__(self, writer: FrameWriter, node: int, pid: int, label: str,
                 sock: socket.socket | None = None) -> None:
        self.writer, self.node, self.pid, self.label = writer, node, pid, label
        self.sock = sock  # state-listener peers only (closed on node loss)
        self.alive = True
        self.gone = False  # its locks were released and its waits dropped
        self.told = False  # it was told that the state before a head loss is gone

    def send(self, rid: int, reply: Reply) -> None:
        if not self.alive:
            return
        head, buffers = reply
        try:
            body = pickle.dumps(head, protocol=5)
        except Exception:  # an exception type plain pickle cannot carry
            import cloudpickle

            body = cloudpickle.dumps(head, protocol=5)
        try:
            self.writer.send_parts(Kind.RESULT, rid, 0, body, buffers)
        except OSError:
            self.alive = False


class _Waiter:
    __slots__ = ("deadline", "done", "kind", "name", "peer", "rid", "who")

    def __init__(self, peer: Peer, rid: int, kind: str, name: str, deadline: float | None, who: Any = None) -> None:
        self.peer, self.rid, self.kind, self.name, self.deadline, self.who = peer, rid, kind, name, deadline, who
        self.done = False


class _Queue:
    __slots__ = ("getters", "items")

    def __init__(self) -> None:
        self.items: collections.deque[Blob] = collections.deque()
        self.getters: collections.deque[_Waiter] = collections.deque()


class _Lock:
    __slots__ = ("holder", "peer", "waiters")

    def __init__(self) -> None:
        self.holder: Any = None  # (node, pid, thread id) of the holding task
        self.peer: Peer | None = None
        self.waiters: collections.deque[_Waiter] = collections.deque()


class _Barrier:
    __slots__ = ("broken", "n", "participants", "waiting")

    def __init__(self, n: int) -> None:
        self.n = n
        self.waiting: list[_Waiter] = []
        self.participants: set[Peer] = set()
        self.broken: str | None = None


def _ok(value: Any = None) -> Reply:
    return ("ok", value), []


def _err(exc: BaseException) -> Reply:
    return ("err", exc), []


_MISS: Reply = (("miss",), [])


def _blob_reply(blob: Blob) -> Reply:
    return ("v", blob[0], blob[1]), blob[2]


def _who(who: Any) -> str:
    try:
        node, pid = who[0], who[1]
    except (TypeError, IndexError):
        return "an unknown holder"
    return "the client" if node < 0 else f"a task on node {node} (pid {pid})"


class StateServer:
    """The collections of one pool. Lives in the head node's agent for the agent's lifetime,
    so a named pool's collections outlive the programs that attach to it."""

    def __init__(self, key: bytes, log: Callable[[str], None], unix_dir: str | None = None,
                 local_dir: str | None = None) -> None:
        self.key = key  # the pool's collections key (handshake.derive), not the agents' one
        self.log = log
        self.unix_dir = unix_dir  # a Local head: listen on a Unix socket there, no TCP
        # A head reached over SSH: its own node's workers use a Unix socket there (no other
        # user, nor another address, shares their handshake slots); the other nodes use TCP.
        self.local_dir = local_dir
        self.local_path: str | None = None
        # Connections in their handshake: on TCP each address gets a share of the slots (a flood
        # from one leaves the rest to the other nodes) and the pool's own nodes' addresses
        # (trust) are served before strangers'; the Unix socket has its own gate.
        self.gate = Gate(limit=32, per_source=8)
        self.local_gate = Gate(limit=32, per_source=32)
        self.lock = threading.Lock()
        self.counters: dict[str, int] = {}
        self.dicts: dict[str, dict[Any, Blob]] = {}
        self.sets: dict[str, set[Any]] = {}
        self.queues: dict[str, _Queue] = {}
        self.locks: dict[str, _Lock] = {}
        self.barriers: dict[str, _Barrier] = {}
        self.clients: dict[int, Peer] = {}  # id(agent connection) -> peer
        self.peers: set[Peer] = set()
        self.listener: socket.socket | None = None
        self.address: tuple[str, int] | None = None
        self.lost: str | None = None  # why the state of an earlier head is gone (a replaced head)
        self._timers: list[tuple[float, int, _Waiter]] = []
        self._seq = itertools.count()
        self._wake = threading.Condition(self.lock)
        threading.Thread(target=self._timer, name="skyward-state-timer", daemon=True).start()

    # -- entry points ------------------------------------------------------------------------
    def handle_client(self, key: int, writer: FrameWriter, frame: Frame) -> None:
        """A STATE frame from a client connection of the agent (``key``: the connection)."""
        peer = self.clients.get(key)
        if peer is None:
            peer = self.clients.setdefault(key, Peer(writer, -1, 0, "the client"))
        self.handle(peer, frame)

    def client_gone(self, key: int) -> None:
        peer = self.clients.pop(key, None)
        if peer is not None:
            self.peer_gone(peer, "disconnected")

    def handle(self, peer: Peer, frame: Frame) -> None:
        try:
            ops, vals = pickle.loads(frame.body)
        except Exception as exc:
            peer.send(frame.task_id, _err(CollectionError(
                f"the collection server on the head node could not read a request "
                f"({type(exc).__name__}: {exc}). Keys and set members must be plain values "
                f"(str, int, tuples of them) that the head node can unpickle."
            )))
            return
        if ops and ops[0][0] == "serve":
            peer.send(frame.task_id, self._serve(*ops[0][3]))
            return
        if self.lost is not None and not peer.told and ops and ops[0][1] != "pool":
            # A replaced head starts empty: each process hears so once, never silently.
            peer.told = True
            peer.send(frame.task_id, _err(CollectionError(
                f"the pool's collections were lost: {self.lost}. There is no replica, so every "
                f"dict, set, counter, queue, barrier and lock starts again empty on the new head "
                f"node; this operation was not applied (the next one is, on the empty state).")))
            return
        blobs = _split_values(vals, frame.buffers)
        replies: list[tuple[Peer, int, Reply]] = []
        with self.lock:
            answer: Reply | None = _ok()
            for i, (op, kind, name, args, nvals) in enumerate(ops):
                mine, blobs = blobs[:nvals], blobs[nvals:]
                last = i == len(ops) - 1
                try:
                    answer = self._apply(peer, frame.task_id if last else 0, op, kind, name, args, mine, replies)
                except Exception as exc:
                    answer = _err(exc if isinstance(exc, CollectionError) else CollectionError(
                        f"{kind} {name!r}: {op} failed on the head node ({type(exc).__name__}: {exc})"))
        if answer is not None:
            peer.send(frame.task_id, answer)
        for p, rid, reply in replies:
            p.send(rid, reply)

    # -- operations (lock held) ----------------------------------------------------------------
    def _apply(self, peer: Peer, rid: int, op: str, kind: str, name: str, args: tuple[Any, ...],
               blobs: list[Blob], replies: list[tuple[Peer, int, Reply]]) -> Reply | None:
        if kind == "counter":
            value = self.counters.get(name, 0)
            if op == "add":
                value = self.counters[name] = value + args[0]
            elif op == "set":
                self.counters[name] = value = args[0]
            return _ok(value)
        if kind == "dict":
            d = self.dicts.setdefault(name, {})
            if op == "get":
                blob = d.get(args[0])
                return _MISS if blob is None else _blob_reply(blob)
            if op == "set":
                d[args[0]] = blobs[0]
                return _ok()
            if op == "has":
                return _ok(args[0] in d)
            if op in ("del", "pop"):
                blob = d.pop(args[0], None)
                if blob is None:
                    return _MISS
                return _ok() if op == "del" else _blob_reply(blob)
            if op == "update":
                d.update(zip(args[0], blobs, strict=True))
                return _ok()
        if kind == "set":
            s = self.sets.setdefault(name, set())
            if op == "add":
                s.add(args[0])
            elif op == "discard":
                s.discard(args[0])
            elif op == "has":
                return _ok(args[0] in s)
            elif op == "len":
                return _ok(len(s))
            return _ok()
        if kind == "queue":
            q = self.queues.setdefault(name, _Queue())
            if op == "put":
                while q.getters:
                    w = q.getters.popleft()
                    if not w.done:
                        w.done = True
                        replies.append((w.peer, w.rid, _blob_reply(blobs[0])))
                        return _ok()
                q.items.append(blobs[0])
                return _ok()
            if op == "len":
                return _ok(len(q.items))
            if op == "get":
                if q.items:
                    return _blob_reply(q.items.popleft())
                timeout = args[0]
                if timeout is not None and timeout <= 0:
                    return _err(CollectionTimeoutError(
                        f"queue {name!r} is empty and get(timeout={timeout!r}) does not wait."))
                q.getters.append(self._park(peer, rid, kind, name, timeout))
                return None
        if kind == "lock":
            lk = self.locks.setdefault(name, _Lock())
            who = args[0]
            if op == "acquire":
                if lk.holder is None:
                    lk.holder, lk.peer = who, peer
                    return _ok(True)
                if lk.holder == who:
                    return _err(CollectionError(
                        f"lock {name!r} is already held by this task; sky.lock is not reentrant: "
                        f"release it before acquiring it again."))
                lk.waiters.append(self._park(peer, rid, kind, name, args[1], who))
                return None
            if op == "release":
                if lk.holder != who:
                    held = "nobody" if lk.holder is None else _who(lk.holder)
                    return _err(CollectionError(
                        f"lock {name!r} is not held by this task (held by {held}); release() "
                        f"only after acquire() returned, in the same task."))
                self._hand_over(name, lk, replies)
                return _ok()
        if kind == "barrier":
            n = args[0]
            b = self.barriers.get(name)
            if b is None:
                b = self.barriers[name] = _Barrier(n)
            elif b.n != n:
                return _err(CollectionError(
                    f"barrier {name!r} was created for n={b.n} participants, not n={n}: use the same "
                    f"n everywhere, or another name."))
            if op == "declare":
                if b.broken is not None and not b.waiting:
                    b.broken = None  # a fresh start after a participant died
                b.participants.add(peer)
                return _ok()
            if op == "wait":
                b.participants.add(peer)
                if b.broken is not None:
                    return _err(CollectionError(f"barrier {name!r} is broken: {b.broken}"))
                b.waiting.append(self._park(peer, rid, kind, name, args[1]))
                if len(b.waiting) >= b.n:
                    for i, w in enumerate(b.waiting):
                        w.done = True
                        replies.append((w.peer, w.rid, _ok(i)))
                    b.waiting = []
                return None
        if kind == "pool" and op == "node_lost":
            for p in [p for p in self.peers if p.node == args[0]]:
                self._gone(p, f"was on node {args[0]}, which the client lost", replies)
                if p.sock is not None:
                    _close(p.sock)
            return _ok()
        raise CollectionError(f"unknown collection operation {kind}.{op} (client and head node of different versions?)")

    def _park(self, peer: Peer, rid: int, kind: str, name: str, timeout: float | None, who: Any = None) -> _Waiter:
        deadline = None if timeout is None else time.monotonic() + timeout
        w = _Waiter(peer, rid, kind, name, deadline, who)
        if deadline is not None:
            heapq.heappush(self._timers, (deadline, next(self._seq), w))
            self._wake.notify()
        return w

    def _hand_over(self, name: str, lk: _Lock, replies: list[tuple[Peer, int, Reply]]) -> None:
        lk.holder, lk.peer = None, None
        while lk.waiters:
            w = lk.waiters.popleft()
            if not w.done and w.peer.alive:
                w.done = True
                lk.holder, lk.peer = w.who, w.peer
                replies.append((w.peer, w.rid, _ok(True)))
                return

    # -- deadlines -------------------------------------------------------------------------------
    def _timer(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                replies: list[tuple[Peer, int, Reply]] = []
                while self._timers and self._timers[0][0] <= now:
                    _, _, w = heapq.heappop(self._timers)
                    if not w.done:
                        w.done = True
                        self._expire(w, replies)
                if replies:
                    self.lock.release()
                    try:
                        for p, rid, reply in replies:
                            p.send(rid, reply)
                    finally:
                        self.lock.acquire()
                    continue
                wait = self._timers[0][0] - now if self._timers else None
                self._wake.wait(wait)

    def _expire(self, w: _Waiter, replies: list[tuple[Peer, int, Reply]]) -> None:
        if w.kind == "queue":
            q = self.queues[w.name]
            _remove(q.getters, w)
            replies.append((w.peer, w.rid, _err(CollectionTimeoutError(
                f"queue {w.name!r} stayed empty for the whole get() timeout; nothing was taken."))))
        elif w.kind == "lock":
            lk = self.locks[w.name]
            _remove(lk.waiters, w)
            replies.append((w.peer, w.rid, _err(CollectionTimeoutError(
                f"lock {w.name!r} was not acquired within its timeout: {_who(lk.holder)} held it "
                f"the whole time. Raise sky.lock(..., timeout=) or hold the lock for less time."))))
        elif w.kind == "barrier":
            b = self.barriers[w.name]
            why = (f"a participant waited past its timeout with {len(b.waiting)} of {b.n} arrived")
            self._break(w.name, b, why, replies, timed_out=w)

    def _break(self, name: str, b: _Barrier, why: str, replies: list[tuple[Peer, int, Reply]],
               timed_out: _Waiter | None = None) -> None:
        b.broken = why
        for w in b.waiting:
            w.done = True
            cls = CollectionTimeoutError if w is timed_out else CollectionError
            replies.append((w.peer, w.rid, _err(cls(
                f"barrier {name!r} is broken: {why}. Tasks waiting in it were released with this "
                f"error; calling sky.barrier({name!r}, {b.n}) again with nobody waiting starts it afresh."))))
        b.waiting = []

    # -- peers that go away --------------------------------------------------------------------
    def peer_gone(self, peer: Peer, why: str) -> None:
        replies: list[tuple[Peer, int, Reply]] = []
        with self.lock:
            self._gone(peer, why, replies)
        for p, rid, reply in replies:
            p.send(rid, reply)

    def _gone(self, peer: Peer, why: str, replies: list[tuple[Peer, int, Reply]]) -> None:
        if peer.gone:
            return
        peer.gone = True
        peer.alive = False
        self.peers.discard(peer)
        for name, lk in self.locks.items():
            for w in lk.waiters:
                if w.peer is peer:
                    w.done = True
            if lk.peer is peer:
                self.log(f"skyward: lock {name!r} released: its holder, {_who(lk.holder)}, {why}")
                self._hand_over(name, lk, replies)
        for q in self.queues.values():
            for w in q.getters:
                if w.peer is peer:
                    w.done = True
        for name, b in self.barriers.items():
            if peer in b.participants:
                b.participants.discard(peer)
                b.waiting = [w for w in b.waiting if w.peer is not peer]
                self._break(name, b, f"a participant ({peer.label}) {why}", replies)

    # -- the listener for the pool's nodes -------------------------------------------------------
    def _serve(self, host: str, lost: str | None = None) -> Reply:
        with self.lock:
            # Set by the program that replaced the head; a program attaching later clears it.
            self.lost = lost or None
            if self.address is not None:
                return _ok(self._where())
            if self.unix_dir is not None:
                host = os.path.join(self.unix_dir, "state.sock")
            else:
                refusal = _not_private(host)
                if refusal is not None:
                    return _err(CollectionError(refusal))
            try:
                listener = _listen(host)
            except OSError as exc:
                return _err(CollectionError(
                    f"the head node could not listen for collection requests on its private "
                    f"address {host} ({exc}); the collections of this pool are unavailable. "
                    f"Check the node's private_ip, or use Options(cluster=False)."))
            self.listener = listener
            self.address = (host, 0 if self.unix_dir is not None else listener.getsockname()[1])
            local = None
            if self.unix_dir is None and self.local_dir is not None:
                path = os.path.join(self.local_dir, "state.sock")
                try:
                    local = _listen(path)
                    self.local_path = path
                except OSError as exc:  # the node's workers take TCP as the others do
                    self.log_line(f"collections: no Unix socket for this node's workers ({exc})")
        threading.Thread(target=self._accept, args=(listener, self.gate), name="skyward-state-accept",
                         daemon=True).start()
        if local is not None:
            threading.Thread(target=self._accept, args=(local, self.local_gate), name="skyward-state-accept",
                             daemon=True).start()
        self.log_line(f"collections served on {host}" + (f":{self.address[1]}" if self.address[1] else "")
                      + (f" and {self.local_path}" if self.local_path else ""))
        return _ok(self._where())

    def _where(self) -> dict[str, Any]:
        """Where the nodes reach the collections: the head's address and port, and for the
        head's own workers (``"unix"``) the Unix socket beside its agent's, when there is one."""
        assert self.address is not None
        where: dict[str, Any] = {"host": self.address[0], "port": self.address[1]}
        if self.local_path:
            where["unix"] = self.local_path
        return where

    def trust(self, topology: dict[str, Any] | None) -> None:
        """The pool's nodes as the topology lists them: their private addresses are served
        before any stranger's when a flood takes every handshake slot (Gate.trust)."""
        peers = (topology or {}).get("peers") or []
        self.gate.trust(p.get("private_ip") for p in peers if isinstance(p, dict))

    def log_line(self, text: str) -> None:
        import sys

        print(time.strftime("%H:%M:%S"), "agent:", text, file=sys.stderr, flush=True)

    def _accept(self, listener: socket.socket, gate: Gate) -> None:
        while True:
            try:
                sock, peer = listener.accept()
            except OSError:
                return
            # A flood of strangers: no thread for them (a full gate closes its oldest silent
            # handshake for this one, or this one when all are recent: see Gate).
            if not gate.enter(sock, peer):
                self._refused(sock, "too many connections in their handshake", gate)
                continue
            threading.Thread(target=self._serve_peer, args=(sock, gate), daemon=True).start()

    def _refused(self, sock: socket.socket, why: str, gate: Gate | None = None) -> None:
        _close(sock)
        line = (gate or self.gate).refused(why)
        if line is not None:
            self.log_line(f"collections: {line}")

    def _serve_peer(self, sock: socket.socket, gate: Gate) -> None:
        try:
            info, proof = admit(sock, self.key, gate=gate)
            node, pid = int(info.get("node", -1)), int(info.get("pid", 0))  # type: ignore[call-overload]
        except (Refused, OSError, TypeError, ValueError) as exc:
            self._refused(sock, str(exc), gate)
            return
        finally:
            gate.leave(sock)
        tune(sock)
        keepalive(sock)
        writer = FrameWriter(sock)
        peer = Peer(writer, node, pid, f"node {node} (pid {pid})", sock)
        with self.lock:
            self.peers.add(peer)
        try:
            reader = FrameReader(sock)
            if sock.family == socket.AF_UNIX:
                writer.send_parts(Kind.WELCOME, 0, 0, json.dumps({"proof": proof}).encode())
            else:  # TCP between nodes, which no SSH carries: every later frame sealed (frames.py)
                body = json.dumps({"proof": proof.sealing(), "sealed": True}).encode()
                send, receive = proof.keys(body)
                writer.seal(send, Frame(Kind.WELCOME, 0, body))
                reader.seal(receive)
            while True:
                frame = reader.read()
                if frame.kind == Kind.STATE:
                    self.handle(peer, frame)
        except (EOFError, OSError):
            pass
        finally:
            _close(sock)
            self.peer_gone(peer, "exited (its worker process died or its node was lost)")


def _split_values(vals: list[tuple[int, bytes, int]], buffers: list[tuple[int, Any]]) -> list[Blob]:
    out: list[Blob] = []
    at = 0
    for vflags, vbody, nbufs in vals:
        out.append((vflags, vbody, buffers[at : at + nbufs]))
        at += nbufs
    return out


def _remove(dq: collections.deque[_Waiter], w: _Waiter) -> None:
    try:
        dq.remove(w)
    except ValueError:
        pass


def _not_private(host: str) -> str | None:
    """Why the collections may not listen on ``host`` (None when they may): only private and
    loopback addresses, as the agent's direct listener."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:  # a host name (an SSH host given by name): what it resolves to here
            ip = ipaddress.ip_address(socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0])
        except (OSError, ValueError, IndexError):
            return (f"the head node was asked to serve the collections on {host!r}, which is neither "
                    f"an IP address nor a name it can resolve; they are unavailable to tasks on "
                    f"other nodes. Give the hosts their private addresses.")
    if (ip.is_private or ip.is_loopback) and not ip.is_unspecified:
        return None
    return (f"the head node's address {host} is public, and the collections listener binds a "
            f"private or loopback address only (its traffic is not encrypted): the pool's "
            f"collections are unavailable to tasks on other nodes. Give the hosts their private "
            f"addresses (sky.SSH(hosts=[...]) with the address of the network they share), or "
            f"keep collections to the client and the head node.")


def _listen(where: str) -> socket.socket:
    """A listener on a Unix socket path (only this user may connect) or on a TCP address."""
    if where.startswith("/"):
        from .listeners import unix_listener

        unix = unix_listener(where, backlog=128)
        if isinstance(unix, str):
            raise OSError(unix)
        return unix
    sock = socket.socket(socket.AF_INET6 if ":" in where else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((where, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def keepalive(sock: socket.socket) -> None:
    """Notice a peer whose host vanished (no FIN) in about 15 s instead of hours."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 3)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    except (OSError, AttributeError):
        pass


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


# -- a node's connection to the server ----------------------------------------------------------
class StateConnection:
    """A worker process's connection to the collection server (shared by its threads).

    ``host`` is an address, or the path of a Unix socket (a Local pool; ``port`` is then 0);
    ``token`` is the pool's collections key in hex, as the agent hands it to its workers."""

    def __init__(self, host: str, port: int, token: str, node: int) -> None:
        self.where = host if host.startswith("/") else f"{host}:{port}"
        if host.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            try:
                sock.connect(host)
            except OSError:
                sock.close()
                raise
        else:
            sock = socket.create_connection((host, port), timeout=10)
        self._sock = sock
        reader = FrameReader(sock)
        try:  # the WELCOME by hand and capped: an impostor's body is not read before its proof
            check = prove(sock, bytes.fromhex(token), {"node": node, "pid": os.getpid()}, timeout=10)
            facts, raw = read_welcome(sock, f"the collection server at {self.where}", 10)
        except (Refused, EOFError, OSError) as exc:
            _close(sock)
            raise ConnectionError(f"the collection server at {self.where} refused this node ({exc})") from exc
        if not check(facts):
            _close(sock)
            raise ConnectionError(f"what answers at {self.where} did not prove the pool's collections key: "
                                  f"it is not this pool's collection server")
        self._writer = FrameWriter(sock)
        if not host.startswith("/"):  # TCP, which no SSH carries: sealed (frames.py)
            if not check.sealed:
                _close(sock)
                raise ConnectionError(f"the collection server at {self.where} does not authenticate "
                                      f"its frames (another skyward version, or someone between the "
                                      f"two changed its WELCOME)")
            send, receive = check.keys(raw)
            self._writer.seal(send)
            reader.seal(receive)
        sock.settimeout(None)
        tune(sock)
        keepalive(sock)
        self._pending: dict[int, Callable[[Frame | BaseException], None]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.lost: BaseException | None = None
        threading.Thread(target=self._read, args=(reader,), name="skyward-state", daemon=True).start()

    def call(self, body: bytes, buffers: list[tuple[int, Any]], done: Callable[[Frame | BaseException], None]) -> None:
        rid = next(self._ids)
        with self._lock:
            if self.lost is not None:
                raise ConnectionError(str(self.lost))
            self._pending[rid] = done
        try:
            self._writer.send_parts(Kind.STATE, rid, 0, body, buffers)
        except OSError as exc:
            self._fail(exc)

    def _read(self, reader: FrameReader) -> None:
        try:
            while True:
                frame = reader.read()
                with self._lock:
                    done = self._pending.pop(frame.task_id, None)
                if done is not None:
                    done(frame)
        except (EOFError, OSError) as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.lost is None:
                self.lost = exc
            pending = list(self._pending.values())
            self._pending.clear()
        for done in pending:
            done(ConnectionError(f"connection to {self.where} lost ({exc or type(exc).__name__})"))

    def close(self) -> None:
        _close(self._sock)


def call_sync(conn: StateConnection, body: bytes, buffers: list[tuple[int, Any]]) -> Frame:
    """One request, waiting for its answer (tests and tools)."""
    from concurrent.futures import Future  # here: the head's agent needs none at start (7 ms)

    fut: Future[Frame] = Future()

    def done(result: Frame | BaseException) -> None:
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)

    conn.call(body, buffers, done)
    return fut.result()
