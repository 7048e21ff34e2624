"""Which replica takes a request: the ready replica with the fewest outstanding requests under
its concurrency cap (ties in turn), else a bounded FIFO queue that waits for one, waking an asleep
pool when there is no replica at all; and each replica's pool of idle upstream connections.

Everything here runs on the router's loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from skyward.serve.http import Refused, UpstreamConn, nodelay

log = logging.getLogger("skyward.serve")

MAX_IDLE = 4.0  # seconds an upstream connection stays pooled (uvicorn closes them after 5)
POOL_SIZE = 64  # idle upstream connections kept per replica


@dataclass
class Upstream:
    """A ready replica: ``connect`` opens one new connection to it (on the router's loop)."""

    key: str
    connect: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
    max_concurrency: int = 0  # 0: unbounded; past it, requests for it wait at the router


class Replica:
    """A replica as the router sees it: requests in flight, its connections, draining or lost."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.key = upstream.key
        self.in_flight = 0
        self.draining = False
        self.lost = False
        self.idle: deque[UpstreamConn] = deque()
        self.active: set[UpstreamConn] = set()

    def free(self) -> bool:
        cap = self.upstream.max_concurrency
        return not cap or self.in_flight < cap



class Balancer:
    def __init__(self, max_queue: int, on_demand: Callable[[], None] | None) -> None:
        self.max_queue = max_queue
        self.on_demand = on_demand
        self.replicas: dict[str, Replica] = {}  # ready and draining
        self.ready: list[Replica] = []
        self.rr = 0
        self.waiters: deque[tuple[asyncio.Future[Replica], frozenset[Replica]]] = deque()
        self.cold = False  # on_demand was called and no replica has come since
        self.in_flight_by_key: dict[str, int] = {}
        self.cold_waits = 0

    def add(self, upstream: Upstream) -> None:
        old = self.replicas.get(upstream.key)
        if old is not None and not old.draining:
            self.ready.remove(old)
        rep = Replica(upstream)
        self.replicas[rep.key] = rep
        self.ready.append(rep)
        self.cold = False
        self.dispatch()

    def remove(self, key: str, lost: bool) -> None:
        rep = self.replicas.get(key)
        if rep is None:
            return
        if not rep.draining:
            rep.draining = True
            self.ready.remove(rep)
        if lost:
            rep.lost = True
            for conn in [*rep.active, *rep.idle]:
                conn.abort()
        for conn in rep.idle:
            conn.abort()
        rep.idle.clear()
        if rep.in_flight == 0:
            del self.replicas[key]
        self.dispatch()  # waiters that excluded nothing may now start a cold episode elsewhere


    def pick(self, exclude: frozenset[Replica]) -> Replica | None:
        ready = self.ready
        n = len(ready)
        best: Replica | None = None
        for i in range(n):
            rep = ready[(self.rr + i) % n]
            if rep in exclude or not rep.free():
                continue
            if best is None or rep.in_flight < best.in_flight:
                best = rep
        if best is not None:
            self.rr = (self.rr + 1) % max(n, 1)
            self.take(best)
        return best

    def take(self, rep: Replica) -> None:
        rep.in_flight += 1
        self.in_flight_by_key[rep.key] = self.in_flight_by_key.get(rep.key, 0) + 1

    def release(self, rep: Replica) -> None:
        rep.in_flight -= 1
        left = self.in_flight_by_key.get(rep.key, 1) - 1
        if left > 0:
            self.in_flight_by_key[rep.key] = left
        else:
            self.in_flight_by_key.pop(rep.key, None)
        if rep.draining and rep.in_flight == 0 and self.replicas.get(rep.key) is rep:
            del self.replicas[rep.key]
        self.dispatch()

    def dispatch(self) -> None:
        if not self.waiters:
            return
        for entry in list(self.waiters):
            fut, exclude = entry
            if fut.done():
                self.waiters.remove(entry)
                continue
            rep = self.pick(exclude)
            if rep is None:
                if not exclude:
                    break
                continue
            self.waiters.remove(entry)
            fut.set_result(rep)

    async def acquire(self, exclude: frozenset[Replica], deadline: float) -> Replica:
        if not self.waiters:
            rep = self.pick(exclude)
            if rep is not None:
                return rep
        if len(self.waiters) >= self.max_queue:
            raise Refused(503, "every replica is busy and the queue is full; retry shortly",
                           (("Retry-After", "1"),))
        if not self.ready:
            self.cold_waits += 1
            if not self.cold:
                self.cold = True
                self.wake()
        fut: asyncio.Future[Replica] = asyncio.get_running_loop().create_future()
        entry = (fut, exclude)
        self.waiters.append(entry)
        got: Replica | None = None
        try:
            async with asyncio.timeout_at(deadline):
                got = await fut
            return got
        except TimeoutError:
            raise Refused(504, "no replica answered in time") from None
        finally:
            if got is None:
                if fut.done() and not fut.cancelled():
                    self.release(fut.result())
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self.waiters.remove(entry)

    def wake(self) -> None:
        on_demand = self.on_demand
        if on_demand is None:
            return

        def call() -> None:
            try:
                on_demand()
            except Exception:
                log.exception("waking the pool for a request (on_demand)")

        threading.Thread(target=call, name="skyward-serve-wake", daemon=True).start()

    async def connection(self, rep: Replica) -> tuple[UpstreamConn, bool]:
        now = asyncio.get_running_loop().time()
        while rep.idle:
            conn = rep.idle.pop()
            if conn.usable(now, MAX_IDLE):
                return conn, False
            conn.abort()
        reader, writer = await rep.upstream.connect()
        nodelay(writer)
        return UpstreamConn(reader, writer), True

    def park(self, rep: Replica, conn: UpstreamConn) -> None:
        rep.active.discard(conn)
        if conn.reusable and not rep.draining and not conn.writer.is_closing() and len(rep.idle) < POOL_SIZE:
            conn.idle_since = asyncio.get_running_loop().time()
            rep.idle.append(conn)
        else:
            conn.abort()
