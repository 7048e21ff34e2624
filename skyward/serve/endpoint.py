"""``pool.serve(app)``: an endpoint on this machine in front of replicas on the pool's nodes.

The endpoint holds a ``Router`` (skyward.serve.router) and a controller thread that keeps
``replicas_per_node`` replicas (skyward.serve.replica) on every ready node of the pool. It
builds on what the pool has and adds no second copy of it:

* **membership**: a replica is started on each node the pool's table says is ready; a node that
  joins later (a resize, the autoscaler, a wake) gets its replicas the same way;
* **healing**: a replica's stream fails when its node is lost; the router takes the replica out
  at once (its idempotent requests in flight go to another), and when the pool's healing has put
  a new node at that rank, the controller starts the replica there again;
* **scale to zero**: a request that comes while the pool is asleep wakes it (``on_demand``), and
  waits for the first replica: that wait is the cold start;
* **the pool's way to a node's port**: the router reaches a replica's socket with
  ``Cluster.open_stream`` (skyward.serve.upstream).

With ``on="head"`` the router runs on the pool's head node instead (skyward.serve.head, held
here by skyward.serve.headlink), listening on its private address; the replicas then listen on
TCP on their node's private address and check the endpoint's token themselves. On a cloud pool,
``allow_from=`` (CIDRs, with a fixed ``port=``) has the pool's stack open that port of the head
node to those networks (``Cluster.firewall``: one stack update), and close it again when the
endpoint closes; elsewhere skyward manages no firewall, and ``allow_from=`` is refused.

``update(app)`` replaces the replicas one at a time: each is drained (no new request, those in
flight finish), stopped, and started again with the new app; requests meanwhile go to the
others, or wait in the router's queue when it was the only one.
"""

from __future__ import annotations

import inspect
import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ServeError
from ..observe import events as ev
from . import access
from . import replica as replica_task
from .headlink import HeadRouter
from .router import AccessRecord, Router, RouterStats, Upstream
from .upstream import connector

if TYPE_CHECKING:
    from ..core.membership import Member
    from ..core.pool import Pool

log = logging.getLogger("skyward.serve")

_TICK = 0.25  # how often the controller looks at the pool's table
_STATS_EVERY = 1.0  # seconds between EndpointStats events (only when something changed)
ON = ("client", "head")  # where the router runs
_RETRY = (1.0, 30.0)  # a replica that failed to start is tried again after 1 s, doubling to 30 s


@dataclass(eq=False)
class _Replica:
    key: str  # "rank.slot"
    rank: int
    node: int  # the provider's node index (what open_stream takes)
    version: int  # which app (update() moves it on)
    address: str = ""  # the node's private address (where an on="head" replica listens)
    state: str = "starting"  # starting, ready, stopping, ended
    stream: Iterator[dict[str, Any]] | None = None
    began: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class ReplicaInfo:
    """One replica as the endpoint sees it now (``Endpoint.replicas``)."""

    key: str  # "RANK.SLOT": the node's rank in the pool and the replica's place on it
    node: int
    state: str  # starting, ready, stopping


def is_factory(app: Any) -> bool:
    """Whether ``app`` is a factory (a callable taking no argument) rather than an ASGI app
    (a callable taking scope, receive and send)."""
    try:
        sig = inspect.signature(app)
    except (TypeError, ValueError):
        return False
    required = [p for p in sig.parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return not required


def _resolved(app: Any, factory: bool | None) -> tuple[Any, bool]:
    """(app, whether to call it for the app): ``factory`` as given, else guessed from a callable."""
    return app, (is_factory(app) if factory is None and not isinstance(app, str) else bool(factory))


def slots_needed(replicas_per_node: int, on: str) -> int:
    """The task slots each node needs: one per replica, and the head's router one more."""
    return replicas_per_node + (on == "head")


def _check(app: Any, replicas_per_node: int, slots: int, timeout: float, ready: str | None,
           on: str, port: int) -> int:
    """Checks the options; the task slots a node must have for them."""
    if not (isinstance(app, str) or callable(app)):
        raise ConfigError(f"pool.serve(app={app!r}): app must be an ASGI app, a factory that returns "
                          f"one, or an import string 'module:attribute'.")
    if not isinstance(replicas_per_node, int) or replicas_per_node < 1:
        raise ConfigError(f"pool.serve(replicas_per_node={replicas_per_node!r}): it must be an int of 1 or more.")
    if on not in ON:
        raise ConfigError(f"pool.serve(on={on!r}): the router runs on 'client' (this machine, the default) "
                          f"or 'head' (the pool's head node, for clients in the pool's network).")
    need = slots_needed(replicas_per_node, on)
    if need > slots:
        router = " and the head node's router one more" if on == "head" else ""
        raise ConfigError(
            f"pool.serve(replicas_per_node={replicas_per_node}, on={on!r}): each replica holds one task slot "
            f"of its node{router}, and this pool's nodes have {slots}. Open the pool with "
            f"sky.Worker(concurrency={need}) (executor='process' for a process each).")
    if not timeout > 0:
        raise ConfigError(f"pool.serve(timeout={timeout!r}): it must be more than 0 seconds.")
    if ready is not None and not ready.startswith("/"):
        raise ConfigError(f"pool.serve(ready={ready!r}): it is the path of a URL on the app, "
                          f"starting with '/' (e.g. '/health').")
    if not 0 <= port <= 65535:
        raise ConfigError(f"pool.serve(port={port!r}): it must be 0 (any free port) to 65535.")
    return need


def _allowed(allow_from: Sequence[str] | None, on: str, port: int, pool: Pool) -> tuple[str, ...]:
    """The CIDRs of ``allow_from=``, checked: valid networks, none the whole internet or a wide
    public slice of it, only with ``on="head"``, a fixed ``port=``, and a pool whose firewall
    skyward manages (a cloud pool's stack)."""
    from ..stacks.network import WIDEST

    if allow_from is None:
        return ()
    if isinstance(allow_from, str):
        allow_from = [allow_from]
    if on != "head":
        raise ConfigError(
            f"pool.serve(allow_from={list(allow_from)!r}, on={on!r}): allow_from= opens the port of a router "
            f"on the head node; the router of on='client' listens on this machine (host=, 127.0.0.1 by "
            f"default). Serve with on='head', or drop allow_from=.")
    cidrs: list[str] = []
    for cidr in allow_from:
        try:
            net = ipaddress.ip_network(str(cidr).strip(), strict=False)
        except ValueError:
            raise ConfigError(f"pool.serve(allow_from=...): {cidr!r} is not an address or a CIDR; write "
                              f"e.g. '10.0.0.0/8' or '203.0.113.7/32'.") from None
        if net.prefixlen == 0:
            raise ConfigError(
                f"pool.serve(allow_from=...): {cidr!r} would open the endpoint to the whole world, with its "
                f"bearer token all that stands in the way. List the networks of the clients that call it "
                f"(e.g. the VPC's '10.0.0.0/8', an office's '203.0.113.0/24'), or serve with on='client' and "
                f"reach it from this machine.")
        if net.prefixlen < WIDEST[net.version] and not net.is_private:
            raise ConfigError(
                f"pool.serve(allow_from=...): {cidr!r} would open the endpoint to {net.num_addresses:,} public "
                f"addresses; a public prefix may be no wider than /{WIDEST[4]} (IPv4) or /{WIDEST[6]} (IPv6). "
                f"List the networks of the clients that call it instead (e.g. '203.0.113.0/24').")
        cidrs.append(str(net))
    if not cidrs:
        return ()
    if port == 0:
        raise ConfigError(
            f"pool.serve(on='head', allow_from={cidrs!r}): give the port to open, e.g. port=8000: a firewall "
            f"rule and the clients outside the pool both name it, so it is not left to chance (port=0).")
    if getattr(pool.cluster, "firewall", None) is None:
        raise ConfigError(
            f"pool.serve(on='head', allow_from={cidrs!r}): skyward manages no firewall for this pool's nodes "
            f"(only cloud pools, sky.AWS and sky.GCP, have a stack that opens ports); the head's port is reachable by whatever reaches its private address, as that "
            f"network's own firewall allows. Drop allow_from= and restrict the port there.")
    return tuple(dict.fromkeys(cidrs))


class Endpoint:
    """An app served by a pool's nodes: ``url`` and ``headers`` are what a request needs."""

    def __init__(self, pool: Pool, app: Any, *, replicas_per_node: int = 1, ready: str | None = None,
                 ready_timeout: float = 300.0, host: str = "127.0.0.1", port: int = 0, auth: bool = True,
                 timeout: float = 60.0, max_concurrency: int = 0, max_queue: int = 1024,
                 target_concurrency: int = 8, factory: bool | None = None, on: str = "client",
                 allow_from: Sequence[str] | None = None) -> None:
        _check(app, replicas_per_node, pool.worker.slots, timeout, ready, on, port)
        allowed = _allowed(allow_from, on, port, pool)
        if not isinstance(target_concurrency, int) or target_concurrency < 1:
            raise ConfigError(f"pool.serve(target_concurrency={target_concurrency!r}): it is the requests "
                              f"in flight per replica an elastic pool scales for: an int of 1 or more.")
        self.pool = pool
        self.replicas_per_node = replicas_per_node
        self.ready_path = ready
        self.ready_timeout = ready_timeout
        self.max_concurrency = max_concurrency
        self.token = secrets.token_urlsafe(32) if auth else None
        if self.token is not None:
            from ..observe import secrets as masking

            masking.register(self.token)
        self._app = _resolved(app, factory)
        self._version = 0
        self._replicas: dict[str, _Replica] = {}
        self._failures: dict[str, tuple[int, float, BaseException]] = {}  # key -> (tries, next try, last error)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._closed = threading.Event()
        # Where the router's streams to replicas open (skyward.serve.upstream): the endpoint's own.
        self._openers = ThreadPoolExecutor(max_workers=32, thread_name_prefix="skyward-serve-open")
        self.access_log: access.AccessLog | None = None  # opened once the port is known, below
        if on == "head" and host != "127.0.0.1":
            raise ConfigError(f"pool.serve(host={host!r}, on='head'): the head's router listens on the head "
                              f"node's private address; host= is for on='client' only.")
        self.on = on
        self.allow_from = allowed
        self._opened: tuple[int, int] | None = None  # (head node, port) the pool's firewall opened
        self._router: Router | HeadRouter
        if on == "head":
            self._router = HeadRouter(pool, port=port, token=self.token, timeout=timeout, max_queue=max_queue,
                                      access_log=self._access)
            self._host, self._port = self._router.host, self._router.port
            if allowed:
                self._open_port(self._router, allowed)
        else:
            self._router = Router(token=self.token, timeout=timeout, max_queue=max_queue,
                                  on_demand=self._on_demand, access_log=self._access)
            self._host, self._port = self._router.start(host, port)
        self.url = f"http://{self._host}:{self._port}"
        logfile = pool._log.file
        self.access_log = access.open_for(None if logfile is None else logfile.parent, pool.name or pool.id,
                                          self._port)
        self.headers: dict[str, str] = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.target_concurrency = target_concurrency
        self._thread = threading.Thread(target=self._control, name="skyward-serve", daemon=True)
        self._thread.start()
        pool.autoscaler.loads.append(self._load)
        pool.members.on_leaving.append(self._leaving)
        pool.before_close(lambda _pool: self.close())

    # -- what a user calls ----------------------------------------------------------------------
    @property
    def replicas(self) -> list[ReplicaInfo]:
        with self._lock:
            return [ReplicaInfo(r.key, r.node, r.state) for r in self._replicas.values() if r.state != "ended"]

    def stats(self) -> RouterStats:
        """Requests, latency, in flight and queued, as the router counts them now."""
        return self._router.stats()

    def wait_ready(self, replicas: int | None = None, timeout: float | None = None) -> None:
        """Wait until ``replicas`` replicas (default: every one the pool's ready nodes should
        have) take traffic. Raises the first start failure when none can, ``TimeoutError`` after
        ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                want = replicas if replicas is not None else self._wanted()
                ready = sum(r.state == "ready" for r in self._replicas.values())
                if ready >= want:
                    return
                failed = [(key, err) for key, (tries, _, err) in sorted(self._failures.items()) if tries]
                if failed and ready == 0 and not any(r.state == "starting" for r in self._replicas.values()):
                    key, err = failed[0]
                    raise ServeError(f"no replica of {self.url} could start; replica {key} (of "
                                     f"{len(failed)} failed): {type(err).__name__}: {err}") from err
                if self._closed.is_set():
                    raise ServeError(f"the endpoint {self.url} was closed while waiting for its replicas.")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{ready} of {want} replica(s) of {self.url} ready after {timeout:g} s.")
                self._changed.wait(_TICK if left is None else min(_TICK, left))

    def wait(self, timeout: float | None = None) -> None:
        """Serve until the endpoint is closed, ``timeout`` passes, or Ctrl-C (what a script that
        only serves does at its end)."""
        try:
            self._closed.wait(timeout)
        except KeyboardInterrupt:
            log.info("serving %s: interrupted", self.url)

    def update(self, app: Any, *, factory: bool | None = None) -> None:
        """Serve ``app`` instead: each replica in turn is drained, stopped and started again with
        it, waiting for it to be ready before the next (no request fails; some wait)."""
        _check(app, self.replicas_per_node, self.pool.worker.slots, 1, self.ready_path, self.on, 0)
        with self._lock:
            previous = self._app
            self._app = _resolved(app, factory)
            self._version += 1
            version = self._version
            keys = sorted(k for k, r in self._replicas.items() if r.state == "ready")
        for done, key in enumerate(keys):
            with self._lock:
                old = self._replicas.get(key)
            if old is None or old.version == version:
                continue
            self._stop(old, drain=True)
            self._changed_wait(lambda k=key: self._ready_at(k, version))
            with self._lock:
                r = self._replicas.get(key)
                failure = self._failures.get(key)
                if self._closed.is_set() or (r is not None and r.version == version and r.state == "ready"):
                    continue
                # The new app does not start: the rest keep the app they serve, and this one
                # starts again with it at once (the next tick), instead of the update taking
                # every replica down one by one.
                self._app, self._version = previous, self._version + 1
                self._failures.pop(key, None)
            error = failure[2] if failure is not None else None
            raise ServeError(
                f"update of {self.url} stopped at replica {key}: the new app did not start there "
                f"({type(error).__name__ if error else 'no reason'}: {error}). {done} replica(s) serve the "
                f"new app, the other {len(keys) - done} the previous one ({key} is started again with "
                f"it). Fix the app and update again.") from error
        self.pool._emit(ev.EndpointUpdated(pool=self.pool.id, url=self.url, replicas=len(keys)))

    def close(self) -> None:
        """Stop taking requests, end the replicas, and free the port (the pool stays open)."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._load in self.pool.autoscaler.loads:
            self.pool.autoscaler.loads.remove(self._load)
        if self._leaving in self.pool.members.on_leaving:
            self.pool.members.on_leaving.remove(self._leaving)
        self._router.close()
        self._close_port()
        self._openers.shutdown(wait=False, cancel_futures=True)
        if self.access_log is not None:
            self.access_log.close()
        with self._lock:
            replicas = list(self._replicas.values())
        for r in replicas:
            self._stop(r, drain=False)
        self._thread.join(5)
        if self in self.pool.endpoints:
            self.pool.endpoints.remove(self)
        self.pool._emit(self.stats_event())  # the final counts (the last may be a second old)
        self.pool._emit(ev.EndpointClosed(pool=self.pool.id, url=self.url))

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Endpoint({self.url}, replicas={len(self.replicas)})"

    # -- the head's port, on a cloud pool ----------------------------------------------------------
    def _open_port(self, router: HeadRouter, cidrs: tuple[str, ...]) -> None:
        """Have the pool's firewall open the router's port on the head to ``cidrs`` (a stack
        update); when that fails, the router ends and the error goes on."""
        firewall = self.pool.cluster.firewall
        assert firewall is not None  # (_allowed saw to it)
        try:
            firewall.open_port(router.node, router.port, cidrs)
        except BaseException:
            router.close()
            raise
        self._opened = (router.node, router.port)
        log.info("endpoint %s: port %d of the head node open to %s", f"http://{router.host}:{router.port}",
                 router.port, ", ".join(cidrs))

    def _close_port(self) -> None:
        opened, self._opened = self._opened, None
        firewall = getattr(self.pool.cluster, "firewall", None)
        if opened is None or firewall is None:
            return
        try:
            firewall.close_port(*opened)
        except Exception as e:
            log.error("endpoint %s: closing port %d of the head node failed (%s); the rule goes with the "
                      "pool's next stack update, or with the pool", self.url, opened[1], _first_line(e))

    # -- the controller ---------------------------------------------------------------------------
    def _wanted(self) -> int:
        return sum(self._serves(m) for m in self.pool.members.records()) * self.replicas_per_node

    @staticmethod
    def _serves(member: Member) -> bool:
        from ..core.membership import NodeState

        return member.state is NodeState.READY and member.channel.lost is None

    def _ready_at(self, key: str, version: int) -> bool:
        r = self._replicas.get(key)
        return self._closed.is_set() or (r is not None and r.version == version and r.state == "ready") or (
            key in self._failures and self._failures[key][0] > 0)

    def _changed_wait(self, done: Any) -> None:
        with self._changed:
            while not done():
                self._changed.wait(_TICK)

    def _control(self) -> None:
        announced = False
        last: tuple[Any, ...] = ()
        sent = 0.0
        while not self._closed.wait(_TICK):
            try:
                self._reconcile()
            except Exception:
                log.exception("endpoint %s: keeping its replicas failed; trying again", self.url)
            if not announced and any(r.state == "ready" for r in list(self._replicas.values())):
                announced = True
                self.pool._emit(ev.EndpointReady(pool=self.pool.id, url=self.url, replicas=len(self.replicas)))
            if time.monotonic() - sent >= _STATS_EVERY:
                event = self.stats_event()
                if event._values()[2:] != last:  # (pool and time aside)
                    last, sent = event._values()[2:], time.monotonic()
                    self.pool._emit(event)

    def stats_event(self) -> ev.EndpointStats:
        """What the views are told of this endpoint now (see ``EndpointStats``)."""
        s = self._router.stats()
        return ev.EndpointStats(
            pool=self.pool.id, url=self.url, replicas=tuple((r.key, r.node, r.state) for r in self.replicas),
            in_flight=s.in_flight, queued=s.queued, total=s.total, statuses=tuple(sorted(s.by_status.items())),
            latency_buckets=tuple(s.latency_buckets), latency_sum=s.latency_sum, cold_waits=s.cold_waits)

    def _reconcile(self) -> None:
        """Start the replicas the ready nodes lack; stop those of nodes that left the table."""
        members = {m.rank: m for m in self.pool.members.records() if self._serves(m)}
        now = time.monotonic()
        starts: list[_Replica] = []
        with self._lock:
            for rank, m in members.items():
                for slot in range(self.replicas_per_node):
                    key = f"{rank}.{slot}"
                    r = self._replicas.get(key)
                    if r is not None and r.state != "ended":
                        continue  # a lost node's replica ends with its stream; healing brings the rank back
                    if now < self._failures.get(key, (0, 0.0, None))[1]:
                        continue
                    r = _Replica(key, rank, m.endpoint.index, self._version, m.endpoint.private_ip)
                    self._replicas[key] = r
                    starts.append(r)
            for key, r in list(self._replicas.items()):
                if r.state == "ended" and r not in starts:
                    del self._replicas[key]
        for r in starts:
            threading.Thread(target=self._run, args=(r,), name=f"skyward-replica-{r.key}", daemon=True).start()

    def _run(self, r: _Replica) -> None:
        """Start replica ``r`` on its node and follow its stream until it ends."""
        app, factory = self._app
        tcp = dict(listen=r.address, token=self.token) if isinstance(self._router, HeadRouter) else {}
        pending = _pending(app, key=r.key, factory=factory, ready=self.ready_path, ready_timeout=self.ready_timeout,
                           **tcp)
        ready = False
        try:
            stream = self.pool.dispatcher.run_async(pending, target=r.rank).result()  # the head group: pool.members
            with self._lock:
                r.stream = stream
            first = next(stream)
            if self._closed.is_set() or r.state == "stopping":
                return
            if isinstance(self._router, HeadRouter):
                host, port = first["tcp"]
                self._router.add_tcp(r.key, host, port, self.max_concurrency)
            else:
                self._router.add(Upstream(r.key, connector(self.pool.cluster, r.node, first["socket"],
                                                           self._openers), max_concurrency=self.max_concurrency))
            ready = True
            with self._changed:
                r.state = "ready"
                self._failures.pop(r.key, None)
                self._changed.notify_all()
            log.info("replica %s ready on node %d in %.2f s", r.key, r.node, first.get("seconds", 0.0))
            self.pool._emit(ev.ReplicaReady(pool=self.pool.id, key=r.key, node=r.node,
                                            seconds=time.monotonic() - r.began))
            for _beat in stream:
                pass
            raise ServeError(f"replica {r.key} ended")
        except BaseException as exc:
            if r.state == "stopping" or self._closed.is_set():
                return
            if ready:
                self._router.remove(r.key, lost=True)
                log.warning("replica %s on node %d lost: %s", r.key, r.node, _first_line(exc))
                self.pool._emit(ev.ReplicaLost(pool=self.pool.id, key=r.key, node=r.node, reason=_first_line(exc)))
            else:
                self._failed(r, exc)
        finally:
            with self._changed:
                stopped, r.state = r.state == "stopping" or self._closed.is_set(), "ended"
                self._changed.notify_all()
            if stopped and r.stream is not None:
                r.stream.close()  # type: ignore[attr-defined]  # (a StreamReader: STOP, once)

    def _failed(self, r: _Replica, exc: BaseException) -> None:
        with self._lock:
            tries = self._failures.get(r.key, (0, 0.0, None))[0] + 1
            delay = min(_RETRY[1], _RETRY[0] * 2 ** (tries - 1))
            self._failures[r.key] = (tries, time.monotonic() + delay, exc)
        log.error("replica %s on node %d did not start (try %d; again in %.0f s): %s",
                  r.key, r.node, tries, delay, exc)
        self.pool._emit(ev.ReplicaLost(pool=self.pool.id, key=r.key, node=r.node, reason=_first_line(exc)))

    def _stop(self, r: _Replica, *, drain: bool) -> None:
        with self._lock:
            if r.state in ("stopping", "ended"):
                return
            was_ready, r.state = r.state == "ready", "stopping"
            stream = r.stream
        if was_ready:
            self._router.remove(r.key, lost=False)
            if drain:
                self._router.wait_drained(r.key, 60.0)
        if stream is not None:
            stream.close()  # type: ignore[attr-defined]  # the generator stops at its next beat

    def _leaving(self, gone: list[Member]) -> None:
        """A shrink takes these nodes: their replicas are drained and stopped first (the pool
        then finds their slots free instead of waiting for tasks that serve for ever)."""
        indices = {m.endpoint.index for m in gone}
        with self._lock:
            leaving = [r for r in self._replicas.values() if r.node in indices]
        for r in leaving:
            self._stop(r, drain=True)

    def _load(self) -> tuple[int, int]:
        """For the pool's autoscaler: the slots the replicas hold, and the slots the requests ask
        for (enough nodes for ``target_concurrency`` requests per replica; none when idle)."""
        with self._lock:
            held = sum(r.state in ("starting", "ready", "stopping") for r in self._replicas.values())
        stats = self._router.stats()
        load = stats.in_flight + stats.queued
        per_node = self.target_concurrency * self.replicas_per_node
        nodes = -(-load // per_node)
        return held, nodes * self.pool.worker.slots

    # -- what the router calls --------------------------------------------------------------------
    def _on_demand(self) -> None:
        """A request came and no replica is ready: wake an asleep pool (its nodes then get replicas)."""
        self.pool.members.wake()

    def _access(self, record: AccessRecord) -> None:
        access_log = self.access_log  # (None for a request that comes before it is open)
        if access_log is not None:
            access_log.write(record)
            return
        log.info('%s "%s %s" %d %.1f ms %s', record.client, record.method, record.path, record.status,
                 record.seconds * 1000, record.replica or "-")


def _pending(app: Any, **kwargs: Any) -> Any:
    from ..core.function import PendingFunction

    _picklable(app)
    return PendingFunction(replica_task.run, (app,), kwargs)


def _picklable(app: Any) -> None:
    """Let an app object travel by value (one defined in the user's script). Starlette's (and
    so FastAPI's) ``app.state`` answers every attribute through ``__getattr__`` on its dict,
    which unpickling reaches before the dict is there: endless recursion on the node. Its state
    is carried as the dict it wraps instead (registered once, for this process's pickling)."""
    import copyreg
    import sys

    if isinstance(app, str) or "starlette.datastructures" not in sys.modules:
        return
    from starlette.datastructures import State

    if State not in copyreg.dispatch_table:
        copyreg.pickle(State, _reduce_state)


def _reduce_state(state: Any) -> tuple[Any, tuple[dict[str, Any]]]:
    return type(state), (dict(state._state),)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
