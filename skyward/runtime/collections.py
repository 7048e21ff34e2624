"""Distributed collections: ``sky.dict``, ``sky.set``, ``sky.counter``, ``sky.queue``,
``sky.barrier`` and ``sky.lock``.

A factory returns a small proxy; one name is one object for every task of the pool and for
the client inside the ``with`` block. The state lives in the head node's agent
(``skyward.bootstrap.state``): tasks reach it over the pool's private network, the client
through its existing channel to the head node.

Consistency (dict, set and counter take ``consistency=``):

* ``"strong"`` (default): every operation is one round trip to the head node, where all of
  them are applied in one total order (linearizable).
* ``"eventual"``: writes return at once; each process buffers them and sends them in batches
  (a few milliseconds apart, and before every task's result). A read sends this process's
  buffered writes first, so a process always reads its own writes; other processes' writes
  show up once their batch arrives. Once every task has returned, the state equals what
  strong consistency gives for commutative writes (increments, set adds, dict writes to
  distinct keys); writes that do not commute (reset, pop, two nodes writing one key) apply in
  the order their batches arrive.

Every method has an ``_async`` twin that returns a ``concurrent.futures.Future`` which can
also be awaited in asyncio code.
"""

from __future__ import annotations

import builtins
import logging
import os
import pickle
import threading
from collections.abc import Callable, Generator
from concurrent.futures import Future
from typing import Any, ClassVar, Literal

from skyward.errors import (
    CollectionError,
    CollectionTimeoutError,
    ConfigError,
    InheritedPoolError,
    NoActivePoolError,
)

from . import context

log = logging.getLogger("skyward")

Consistency = Literal["strong", "eventual"]
_NO_VALUE: Any = object()
MISSING: Any = object()  # a key that is not there (decoded "miss")
_FLUSH_DELAY = 0.002  # seconds an eventual write waits for others to join its batch


class Result(Future[Any]):
    """A Future that asyncio code can also ``await``."""

    def __await__(self) -> Generator[Any, None, Any]:
        import asyncio  # only for `await`: opening a pool does not import asyncio

        return asyncio.wrap_future(self).__await__()


def _done_future(value: Any = None) -> Result:
    f = Result()
    f.set_result(value)
    return f


# -- where requests go ------------------------------------------------------------------------
Send = Callable[[bytes, list[Any], Callable[[Any], None]], None]


class Backend:
    """This process's way to the collection server, and its buffer of eventual writes.

    ``check`` (the client's): raises when this process may not use the pool any more (a child
    forked from the client: the writes buffered at the fork are the parent's to send)."""

    def __init__(self, send: Send, where: str, check: Callable[[], None] | None = None) -> None:
        self._send = send
        self.where = where
        self._check = check
        self._lock = threading.Lock()
        self._ops: list[tuple[Any, ...]] = []
        self._vals: list[tuple[int, bytes, int]] = []
        self._bufs: list[Any] = []
        self._deltas: builtins.dict[str, int] = {}
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self._error: BaseException | None = None  # a failed background flush, raised on next use

    # -- one request ---------------------------------------------------------------------------
    def request(self, ops: list[tuple[Any, ...]], vals: list[tuple[int, bytes, int]],
                bufs: list[Any], decode: Callable[[Any], Any] = lambda v: v) -> Result:
        from skyward.bootstrap.state import encode_request

        if self._check is not None:
            self._check()
        fut = Result()
        fut.set_running_or_notify_cancel()
        body = encode_request(ops, vals)
        self._request_raw(body, bufs, fut, decode)
        return fut

    def _request_raw(self, body: bytes, bufs: list[Any], fut: Result, decode: Callable[[Any], Any]) -> None:
        def done(frame: Any) -> None:
            try:
                fut.set_result(decode(_decode(frame, self.where)))
            except BaseException as exc:
                fut.set_exception(exc)

        try:
            self._send(body, bufs, done)
        except (CollectionError, InheritedPoolError) as exc:
            fut.set_exception(exc)
        except Exception as exc:
            fut.set_exception(_lost(self.where, exc))

    # -- eventual writes -----------------------------------------------------------------------
    def write(self, op: tuple[Any, ...], value: Any = _NO_VALUE) -> None:
        if self._check is not None:
            self._check()
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        packed = _pack(value) if value is not _NO_VALUE else None
        with self._lock:
            if op[0] == "add" and op[1] == "counter":
                self._deltas[op[2]] = self._deltas.get(op[2], 0) + op[3][0]
            else:
                if self._deltas:  # keep this process's order for what does not commute
                    self._take_deltas()
                self._ops.append(op)
                if packed is not None:
                    self._vals.append(packed[0])
                    self._bufs.extend(packed[1])
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_loop, name="skyward-collections", daemon=True)
                self._flusher.start()
        self._wake.set()

    def _take_deltas(self) -> None:
        for name, n in self._deltas.items():
            if n:
                self._ops.append(("add", "counter", name, (n,), 0))
        self._deltas.clear()

    def _swap(self, final: tuple[Any, ...] | None) -> tuple[list[tuple[Any, ...]], list[Any], list[Any]]:
        self._take_deltas()
        ops, vals, bufs = self._ops, self._vals, self._bufs
        self._ops, self._vals, self._bufs = [], [], []
        if final is not None:
            ops.append(final)
        return ops, vals, bufs

    def flush(self, final: tuple[Any, ...] | None = None, decode: Callable[[Any], Any] = lambda v: v,
              final_value: Any = _NO_VALUE) -> Result:
        """Send the buffered writes (and ``final``, whose answer the result carries)."""
        from skyward.bootstrap.state import encode_request

        if self._check is not None:
            self._check()
        with self._lock:
            if final is not None and final_value is not _NO_VALUE:
                packed = _pack(final_value)
                self._vals.append(packed[0])
                self._bufs.extend(packed[1])
            ops, vals, bufs = self._swap(final)
            if not ops:
                return _done_future(None)
            fut = Result()
            fut.set_running_or_notify_cancel()
            # Sent under the lock: batches leave in the order they were cut.
            self._request_raw(encode_request(ops, vals), bufs, fut, decode)
        return fut

    def pending(self) -> bool:
        return bool(self._ops or self._deltas)

    def _flush_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            threading.Event().wait(_FLUSH_DELAY)  # let more writes join this batch
            try:
                self.flush().result()
            except BaseException as exc:
                self._error = exc


def _pack(value: Any) -> tuple[tuple[int, bytes, int], list[Any]]:
    from skyward.bootstrap import serialize

    try:
        flags, body, buffers = serialize.dumps(value)
    except Exception as exc:
        from skyward.errors import SerializationError

        raise SerializationError(
            f"a {type(value).__qualname__} value could not be pickled for a distributed collection "
            f"({type(exc).__name__}: {exc}); store plain data (numbers, strings, lists, dicts, arrays)."
        ) from exc
    return (flags, bytes(body), len(buffers)), buffers


def _decode(frame: Any, where: str) -> Any:
    if isinstance(frame, BaseException):
        if isinstance(frame, CollectionError):
            raise frame
        raise _lost(where, frame)
    head = pickle.loads(frame.body)
    tag = head[0]
    if tag == "ok":
        return head[1]
    if tag == "v":
        from skyward.bootstrap import serialize

        return serialize.loads(head[1], head[2], frame.buffers)
    if tag == "miss":
        return MISSING
    raise head[1]


def _lost(where: str, exc: BaseException) -> CollectionError:
    return CollectionError(
        f"the collection server on the head node ({where}) cannot be reached ({exc}). The head "
        f"node (node 0) holds the state of every collection of the pool; when it is lost, so is "
        f"that state. Open the pool again (or wait for the head node's replacement) and start over."
    )


# -- which backend: a task on a node, or the client in a `with` block -----------------------------
_node_backend: Backend | None = None
_node_lock = threading.Lock()


def _on_node_backend(what: str) -> Backend:
    global _node_backend
    state = context.state
    if state is None or "error" in state:
        why = (state or {}).get("error") or "the pool was opened with Options(cluster=False)"
        raise ConfigError(
            f"{what}: distributed collections are off for this pool ({why}). Leave "
            f"Options(cluster=...) at its default to use them."
        )
    with _node_lock:
        if _node_backend is None:
            _node_backend = Backend(_NodeSender(state).send, f"{state['host']}:{state['port']}")
            context.task_done_hooks.append(_flush_node)
        return _node_backend


def _forget_node_backend() -> None:
    """In a child forked inside a task: the parent's connection to the collection server (its
    socket, its reader thread, its buffered writes) is the parent's. The child opens its own on
    its first use instead of writing frames between the parent's."""
    global _node_backend
    _node_backend = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_node_backend)


def _flush_node() -> None:
    backend = _node_backend
    if backend is not None and backend.pending():
        try:
            backend.flush().result()
        except Exception:  # the task's own result matters more; the next use raises
            pass


class _NodeSender:
    """The worker's connection to the head node's collection server, reopened once on loss."""

    def __init__(self, state: builtins.dict[str, Any]) -> None:
        self.state = state
        self.conn: Any = None
        self.lock = threading.Lock()

    def send(self, body: bytes, bufs: list[Any], done: Callable[[Any], None]) -> None:
        from skyward.bootstrap.state import StateConnection

        conn = self.conn
        if conn is None or conn.lost is not None:
            with self.lock:
                if self.conn is None or self.conn.lost is not None:
                    latest = context.state  # a replaced head serves elsewhere (a new CONFIGURE)
                    if isinstance(latest, builtins.dict) and "port" in latest:
                        self.state = latest
                    s = self.state
                    node = int(context.topology().get("node", -1)) if context.on_node() else -1
                    self.conn = _connect_state(StateConnection, s, node)
                conn = self.conn
        conn.call(body, bufs, done)


# A connection the collection server turned away (its handshake slots all taken: busy, or a
# flood) is made again after these pauses, each with up to half again at random: about 9 s in
# all, as the node channel's (bootstrap/channel.py), so a flood outlasting the short schedule
# does not fail a task's collection call that the channel would have carried.
_STATE_RETRY_PAUSES = (0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0)


def _connect_state(connection: Any, state: builtins.dict[str, Any], node: int) -> Any:
    """A connection to the collection server: the head's own workers by the Unix socket beside
    its agent's when it has one (``"unix"``: no other user or address shares its handshake
    slots), every other worker over TCP; retried with backoff while it is turned away."""
    import random
    import time

    unix = state.get("unix")
    if node == 0 and isinstance(unix, str):
        try:
            return connection(unix, 0, state["token"], node)
        except OSError:  # (ConnectionError too) not there after all: TCP as the other nodes
            pass
    pauses = iter(_STATE_RETRY_PAUSES)
    while True:
        try:
            return connection(state["host"], int(state["port"]), state["token"], node)
        except ConnectionError:
            pause = next(pauses, None)
            if pause is None:
                raise
            time.sleep(pause * (1 + random.random() / 2))


def _answer(fut: Future[Any]) -> builtins.dict[str, Any] | None:
    """The head's answer to a serve request: its address, or {"error": why}."""
    try:
        where: builtins.dict[str, Any] | None = fut.result(timeout=30)
        return where
    except Exception as exc:
        return {"error": str(exc)}


class ClientState:
    """The client's side of a pool's collections: one part of a ``Pool`` (skyward.core.pool).

    ``head`` gives the channel to the head node (rank 0), whose agent serves the collections;
    the client's own reads and writes go through it. It remembers where the head serves them
    (``served``, asked once per head) and why an earlier head's state is gone (``lost``, set by
    healing when the head is replaced: each process is told once)."""

    def __init__(self, options: Any, head: Callable[[], Any], pool_id: str,
                 check: Callable[[], None] = lambda: None) -> None:
        """``check`` raises when this process may not use the pool (a forked child's is the parent's)."""
        self.options, self.head, self.pool_id = options, head, pool_id
        self.check = check
        self.backend: Backend | None = None
        self.served: tuple[Any, builtins.dict[str, Any] | None] | None = None  # (head channel, address)
        self.lost: str | None = None
        self.asking: tuple[Any, Future[Any]] | None = None  # (head channel, its answer to come)
        self._lock = threading.Lock()

    def head_gone(self, why: str) -> None:
        """The head node that held the collections is gone (replaced, or the pool went to sleep):
        the next head serves them empty, and each process that uses them is told ``why`` once."""
        self.lost, self.served = why, None

    def client_backend(self, what: str) -> Backend:
        self.check()
        backend = self.backend
        if backend is not None:
            return backend
        if self.options.cluster is False:
            raise ConfigError(
                f"{what}: distributed collections are off for this pool (it was opened with "
                f"Options(cluster=False)). Leave Options(cluster=...) at its default to use them."
            )
        from skyward.bootstrap.frames import Kind

        def send(body: bytes, bufs: list[Any], done: Callable[[Any], None]) -> None:
            head = self.head()
            if head is None:
                from skyward.errors import PoolClosedError

                raise PoolClosedError(f"{what}: the pool is closed; use collections inside its `with` block.")
            head.submit(Kind.STATE, 0, body, bufs, done)

        with self._lock:
            if self.backend is None:
                self.backend = Backend(send, "node 0, through the client's channel", self.check)
            return self.backend

    def _to_head(self, op: tuple[Any, ...], done: Any, head: Any = None) -> None:
        """Send one pool-level operation to the head node's collection server, through the
        client's channel to it (``head``: that channel, when the pool does not list it yet);
        ``done(frame)`` gets the answer."""
        from skyward.bootstrap.frames import Kind
        from skyward.bootstrap.state import encode_request

        head = head if head is not None else self.head()
        if head is None:
            raise ConnectionError("the pool has no head node")
        head.submit(Kind.STATE, 0, encode_request([op], []), [], done)

    def ask(self, endpoint: Any, head: Any) -> None:
        """Ask the node that is about to be the head to serve the collections now, as soon as
        its channel is open (``address`` then waits for its answer): the question travels
        while the other nodes connect instead of after them."""
        if self.options.cluster is not False:
            self.asking = (head, self._request(endpoint.private_ip, head))

    def address(self, pairs: list[tuple[Any, Any]]) -> builtins.dict[str, Any] | None:
        """Where the nodes reach the collection server (what CONFIGURE carries): the head
        node's agent serves it on the head's private address (asked once per head; a named
        pool's head answers every program that attaches with the same address, so its
        collections outlive each of them). None: collections are off; {"error": ...}: they failed."""
        if not pairs:
            return None
        endpoint, head = pairs[0]
        cached = self.served
        if cached is not None and cached[0] is head:
            return cached[1]
        asking, self.asking = self.asking, None
        if self.options.cluster is False:
            where = None
        elif asking is not None and asking[0] is head:
            where = _answer(asking[1])
        else:
            where = _answer(self._request(endpoint.private_ip))
        self.served = (head, where)
        if where is not None and "error" in where:
            log.warning("pool %s: distributed collections are unavailable: %s", self.pool_id, where["error"])
        return where

    def _request(self, head_private_ip: str, head: Any = None) -> Future[Any]:
        """Ask the head node's agent to serve collections on its private address."""
        fut: Future[Any] = Future()

        def done(frame: Any) -> None:
            try:
                fut.set_result(_decode(frame, "node 0"))
            except BaseException as exc:
                fut.set_exception(exc)

        try:
            self._to_head(("serve", "", "", (head_private_ip, self.lost), 0), done, head)
        except Exception as exc:
            fut.set_exception(exc)
        return fut

    def node_lost(self, rank: int) -> None:
        """Tell the head node's server that the client lost the node at ``rank``: the locks
        its tasks held are released (a Log event says so) and its barriers break, even when
        its connections stay open (a node frozen or cut off answers nothing but TCP keepalives)."""
        served = self.served
        if rank == 0 or served is None or not served[1] or "error" in served[1]:
            return
        try:
            self._to_head(("node_lost", "pool", "", (rank,), 0), lambda _answer: None)
        except Exception:  # the head itself is gone: so are the locks
            pass

    # -- the collections themselves, bound to this pool (pool.dict(name)...) ---------------
    def dict(self, name: str, consistency: Consistency | None = None) -> Dict:
        name = _check_name("dict", name)
        return Dict(name, _check_consistency("dict", consistency), self.client_backend(f"pool.dict({name!r})"))

    def set(self, name: str, consistency: Consistency | None = None) -> Set:
        name = _check_name("set", name)
        return Set(name, _check_consistency("set", consistency), self.client_backend(f"pool.set({name!r})"))

    def counter(self, name: str, consistency: Consistency | None = None) -> Counter:
        name = _check_name("counter", name)
        return Counter(name, _check_consistency("counter", consistency),
                       self.client_backend(f"pool.counter({name!r})"))

    def queue(self, name: str) -> Queue:
        name = _check_name("queue", name)
        return Queue(name, "strong", self.client_backend(f"pool.queue({name!r})"))

    def barrier(self, name: str, n: int) -> Barrier:
        _check_participants(name, n)
        name = _check_name("barrier", name)
        b = Barrier(name, n, self.client_backend(f"pool.barrier({name!r})"))
        b._declare()
        return b

    def lock(self, name: str, timeout: float | None = 30) -> Lock:
        _check_lock_timeout(name, timeout)
        name = _check_name("lock", name)
        return Lock(name, timeout, self.client_backend(f"pool.lock({name!r})"))

    def flush(self) -> None:
        """Send the client's buffered eventual writes (before the pool closes)."""
        backend = self.backend
        if backend is not None and backend.pending():
            try:
                backend.flush().result(timeout=10)
            except Exception:
                pass


def _backend(what: str) -> Backend:
    if context.on_node():
        return _on_node_backend(what)
    from skyward.core.target import active_pool

    pool = active_pool()
    if pool is None:
        raise NoActivePoolError(
            f"{what} needs an active pool and there is none here. Call it inside a "
            f"@sky.function running on a pool, or on the client inside `with sky.Compute(...) as pool:`."
        )
    return pool.shared.client_backend(what)


def _who() -> tuple[int, int, int]:
    node = int(context.topology().get("node", -1)) if context.on_node() else -1
    return (node, os.getpid(), threading.get_ident())


# -- the proxies ------------------------------------------------------------------------------
def _check_name(factory: str, name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"sky.{factory}(name={name!r}) is not valid: the name must be a non-empty string.")
    return name


def _check_participants(name: Any, n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"sky.barrier({name!r}, n={n!r}) is not valid: n is the number of participants, an int >= 1.")


def _check_lock_timeout(name: Any, timeout: Any) -> None:
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        raise ConfigError(f"sky.lock({name!r}, timeout={timeout!r}) is not valid: a positive number of seconds, or None.")


def _check_consistency(factory: str, consistency: Any) -> Consistency:
    if consistency is None:
        return "strong"
    if consistency not in ("strong", "eventual"):
        raise ConfigError(
            f"sky.{factory}(consistency={consistency!r}) is not valid: use 'strong' (default) or 'eventual'."
        )
    return consistency


def _raise_key(key: Any) -> Callable[[Any], Any]:
    def decode(v: Any) -> Any:
        if v is MISSING:
            raise KeyError(key)
        return v

    return decode


class _Collection:
    _kind: ClassVar[str] = ""

    def __init__(self, name: str, consistency: Consistency = "strong", backend: Backend | None = None) -> None:
        self.name = name
        self.consistency = consistency
        self._backend = backend if backend is not None else _backend(f"sky.{self._kind}({name!r})")

    def _op(self, op: str, args: tuple[Any, ...] = (), nvals: int = 0) -> tuple[Any, ...]:
        return (op, self._kind, self.name, args, nvals)

    def _call(self, op: str, args: tuple[Any, ...] = (), value: Any = _NO_VALUE,
              decode: Callable[[Any], Any] = lambda v: v) -> Result:
        if self.consistency == "eventual":
            return self._backend.flush(self._op(op, args, 0 if value is _NO_VALUE else 1), decode, value)
        if value is _NO_VALUE:
            return self._backend.request([self._op(op, args)], [], [], decode)
        packed, bufs = _pack(value)
        return self._backend.request([self._op(op, args, 1)], [packed], bufs, decode)

    def _write(self, op: str, args: tuple[Any, ...] = (), value: Any = _NO_VALUE) -> Result:
        if self.consistency == "eventual":
            self._backend.write(self._op(op, args, 0 if value is _NO_VALUE else 1), value)
            return _done_future(None)
        return self._call(op, args, value, lambda _v: None)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.name, self.consistency, self._extra()))

    def _extra(self) -> tuple[Any, ...]:
        return ()

    def __repr__(self) -> str:
        return f"<sky.{self._kind} {self.name!r} ({self.consistency})>"


def _rebuild(cls: type[_Collection], name: str, consistency: Consistency, extra: tuple[Any, ...]) -> _Collection:
    """A proxy that travelled inside a task's arguments: bind it to this side's server."""
    obj = cls.__new__(cls)
    _Collection.__init__(obj, name, consistency)
    obj._restore(extra)  # type: ignore[attr-defined]
    return obj


class Dict(_Collection):
    """A dict shared by the pool: ``d[k]``, ``d[k] = v``, ``del d[k]``, ``k in d``, ``get``,
    ``update``, ``pop``. No ``items()``, ``keys()`` or ``len()``."""

    _kind = "dict"

    def _restore(self, extra: tuple[Any, ...]) -> None:
        pass

    def __getitem__(self, key: Any) -> Any:
        return self._call("get", (key,), decode=_raise_key(key)).result()

    def get(self, key: Any, default: Any = None) -> Any:
        return self.get_async(key, default).result()

    def get_async(self, key: Any, default: Any = None) -> Result:
        return self._call("get", (key,), decode=lambda v: default if v is MISSING else v)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.set_async(key, value).result()

    def set_async(self, key: Any, value: Any) -> Result:
        """``d[key] = value``."""
        return self._write("set", (key,), value)

    def __delitem__(self, key: Any) -> None:
        if self.consistency == "eventual":
            self._backend.write(self._op("del", (key,)))
            return
        self._call("del", (key,), decode=_raise_key(key)).result()

    def delete_async(self, key: Any) -> Result:
        """``del d[key]`` (strong: the Future raises KeyError when the key is missing)."""
        if self.consistency == "eventual":
            return self._write("del", (key,))
        return self._call("del", (key,), decode=_raise_key(key))

    def __contains__(self, key: Any) -> bool:
        return bool(self.contains_async(key).result())

    def contains_async(self, key: Any) -> Result:
        return self._call("has", (key,))

    def update(self, items: Any) -> None:
        self.update_async(items).result()

    def update_async(self, items: Any) -> Result:
        pairs = list(items.items() if hasattr(items, "items") else items)
        if self.consistency == "eventual":
            for k, v in pairs:
                self._backend.write(self._op("set", (k,), 1), v)
            return _done_future(None)
        vals, bufs = [], []
        for _, v in pairs:
            packed, b = _pack(v)
            vals.append(packed)
            bufs.extend(b)
        op = self._op("update", ([k for k, _ in pairs],), len(pairs))
        return self._backend.request([op], vals, bufs, lambda _v: None)

    def pop(self, key: Any, default: Any = None) -> Any:
        return self.pop_async(key, default).result()

    def pop_async(self, key: Any, default: Any = None) -> Result:
        return self._call("pop", (key,), decode=lambda v: default if v is MISSING else v)


class Set(_Collection):
    """A set shared by the pool: ``add``, ``discard`` (no ``remove``), ``v in s``, ``len(s)``."""

    _kind = "set"

    def _restore(self, extra: tuple[Any, ...]) -> None:
        pass

    def add(self, value: Any) -> None:
        self.add_async(value).result()

    def add_async(self, value: Any) -> Result:
        return self._write("add", (value,))

    def discard(self, value: Any) -> None:
        self.discard_async(value).result()

    def discard_async(self, value: Any) -> Result:
        return self._write("discard", (value,))

    def __contains__(self, value: Any) -> bool:
        return bool(self.contains_async(value).result())

    def contains_async(self, value: Any) -> Result:
        return self._call("has", (value,))

    def __len__(self) -> int:
        return int(self.len_async().result())

    def len_async(self) -> Result:
        return self._call("len")


class Counter(_Collection):
    """An integer shared by the pool: ``value``, ``increment``, ``decrement``, ``reset``, ``int(c)``.

    ``increment``/``decrement`` return the new value under strong consistency and None under
    eventual (the write is only buffered)."""

    _kind = "counter"

    def _restore(self, extra: tuple[Any, ...]) -> None:
        pass

    @property
    def value(self) -> int:
        return int(self.value_async().result())

    def value_async(self) -> Result:
        return self._call("get")

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def increment(self, n: int = 1) -> int | None:
        result: int | None = self.increment_async(n).result()
        return result

    def increment_async(self, n: int = 1) -> Result:
        n = _check_int("increment", n)
        if self.consistency == "eventual":
            self._backend.write(self._op("add", (n,)))
            return _done_future(None)
        return self._call("add", (n,))

    def decrement(self, n: int = 1) -> int | None:
        result: int | None = self.decrement_async(n).result()
        return result

    def decrement_async(self, n: int = 1) -> Result:
        return self.increment_async(-_check_int("decrement", n))

    def reset(self, value: int = 0) -> None:
        self.reset_async(value).result()

    def reset_async(self, value: int = 0) -> Result:
        return self._write("set", (_check_int("reset", value),))


def _check_int(what: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise ConfigError(f"counter.{what}({n!r}) is not valid: pass an int.")
    return n


class Queue(_Collection):
    """A FIFO queue shared by the pool: ``put``, ``get(timeout=None)``, ``empty()``, ``len(q)``.

    ``get(timeout=s)`` returns None when nothing came in time, as in the reference project."""

    _kind = "queue"

    def _restore(self, extra: tuple[Any, ...]) -> None:
        pass

    def put(self, value: Any) -> None:
        self.put_async(value).result()

    def put_async(self, value: Any) -> Result:
        return self._call("put", (), value, lambda _v: None)

    def get(self, timeout: float | None = None, *, raise_on_timeout: bool = False) -> Any:
        """The oldest item; waits for one up to ``timeout`` seconds (None: as long as it takes).

        When the timeout passes with nothing taken it returns None, as the reference project
        does (code written for it tests ``if item is None``); ``raise_on_timeout=True`` raises
        CollectionTimeoutError instead, which tells a timeout from a None that was put."""
        return self.get_async(timeout, raise_on_timeout=raise_on_timeout).result()

    def get_async(self, timeout: float | None = None, *, raise_on_timeout: bool = False) -> Result:
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
            raise ConfigError(f"queue.get(timeout={timeout!r}) is not valid: seconds as a number, or None.")
        if not isinstance(raise_on_timeout, bool):
            raise ConfigError(f"queue.get(raise_on_timeout={raise_on_timeout!r}) is not valid: True or False.")
        taken = self._call("get", (timeout,))
        return taken if raise_on_timeout else _none_on_timeout(taken)

    def empty(self) -> bool:
        return bool(self.empty_async().result())

    def empty_async(self) -> Result:
        return self._call("len", decode=lambda n: n == 0)

    def __len__(self) -> int:
        return int(self.len_async().result())

    def len_async(self) -> Result:
        return self._call("len")


def _none_on_timeout(taken: Result) -> Result:
    """``taken``, with the head node's "nothing came in time" turned into None. The server
    (skyward.bootstrap.state) always answers a timed-out get with CollectionTimeoutError;
    what the caller sees is decided here, the one place the client, the nodes and SSH share."""
    out = Result()
    out.set_running_or_notify_cancel()

    def settle(f: Future[Any]) -> None:
        exc = f.exception()
        if exc is None:
            out.set_result(f.result())
        elif isinstance(exc, CollectionTimeoutError):
            out.set_result(None)
        else:
            out.set_exception(exc)

    taken.add_done_callback(settle)
    return out


class Barrier(_Collection):
    """A barrier for ``n`` participants: ``wait()`` returns once ``n`` tasks are waiting.

    When a participant's worker process dies or its node is lost, the barrier breaks: waiting
    tasks get CollectionError. ``wait(timeout=)`` bounds the wait (CollectionTimeoutError)."""

    _kind = "barrier"

    def __init__(self, name: str, n: int, backend: Backend | None = None) -> None:
        super().__init__(name, "strong", backend)
        self.n = n

    def _extra(self) -> tuple[Any, ...]:
        return (self.n,)

    def _restore(self, extra: tuple[Any, ...]) -> None:
        self.n = extra[0]

    def _declare(self) -> None:
        self._call("declare", (self.n,)).result()

    def wait(self, timeout: float | None = None) -> int:
        """Block until ``n`` participants wait; returns this one's arrival index (0..n-1)."""
        return int(self.wait_async(timeout).result())

    def wait_async(self, timeout: float | None = None) -> Result:
        return self._call("wait", (self.n, timeout))


class Lock(_Collection):
    """A mutex shared by the pool: ``acquire()``, ``release()``, ``with lock:``.

    ``acquire`` waits at most ``timeout`` seconds (from ``sky.lock``) and then raises
    CollectionTimeoutError. A lock whose holder's worker process dies, or whose node is lost,
    is released (a Log event says so). Not reentrant."""

    _kind = "lock"

    def __init__(self, name: str, timeout: float | None = 30, backend: Backend | None = None) -> None:
        super().__init__(name, "strong", backend)
        self.timeout = timeout

    def _extra(self) -> tuple[Any, ...]:
        return (self.timeout,)

    def _restore(self, extra: tuple[Any, ...]) -> None:
        self.timeout = extra[0]

    def acquire(self) -> bool:
        return bool(self.acquire_async().result())

    def acquire_async(self) -> Result:
        return self._call("acquire", (_who(), self.timeout))

    def release(self) -> None:
        self.release_async().result()

    def release_async(self) -> Result:
        return self._call("release", (_who(),), decode=lambda _v: None)

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> Lock:
        await self.acquire_async()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release_async()


# -- the factories (sky.dict, sky.set, ...) -----------------------------------------------------
# They are reached as attributes of this module through __getattr__ (PEP 562), so that inside
# the module `dict` and `set` still mean the builtins.
def make_dict(name: str, *, consistency: Consistency | None = None) -> Dict:
    """The pool's dict called ``name`` (created empty on first use)."""
    return Dict(_check_name("dict", name), _check_consistency("dict", consistency))


def make_set(name: str, *, consistency: Consistency | None = None) -> Set:
    """The pool's set called ``name``."""
    return Set(_check_name("set", name), _check_consistency("set", consistency))


def make_counter(name: str, *, consistency: Consistency | None = None) -> Counter:
    """The pool's counter called ``name`` (starts at 0)."""
    return Counter(_check_name("counter", name), _check_consistency("counter", consistency))


def make_queue(name: str) -> Queue:
    """The pool's FIFO queue called ``name``."""
    return Queue(_check_name("queue", name))


def make_barrier(name: str, n: int) -> Barrier:
    """The pool's barrier called ``name`` for ``n`` participants."""
    _check_participants(name, n)
    b = Barrier(_check_name("barrier", name), n)
    b._declare()
    return b


def make_lock(name: str, timeout: float | None = 30) -> Lock:
    """The pool's lock called ``name``; ``acquire`` gives up after ``timeout`` seconds."""
    _check_lock_timeout(name, timeout)
    return Lock(_check_name("lock", name), timeout)


_FACTORIES: builtins.dict[str, Callable[..., Any]] = {
    "dict": make_dict, "set": make_set, "counter": make_counter,
    "queue": make_queue, "barrier": make_barrier, "lock": make_lock,
}
for _public, _fn in _FACTORIES.items():
    _fn.__name__ = _fn.__qualname__ = _public


def __getattr__(name: str) -> Any:
    try:
        return _FACTORIES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
