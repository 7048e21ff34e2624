"""The serving endpoint's router: admits HTTP requests by bearer token, sends each to the ready
replica with the fewest outstanding requests, streams both ways, fails over what it safely can
when a replica is lost, and queues (bounded, with a deadline) when every replica is busy.

It runs its own asyncio loop on a daemon thread; every public method is safe to call from any
other thread. HTTP framing lives in ``skyward.serve.http``, the choice of a replica and the
queue in ``skyward.serve.balance``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from skyward.errors import ConfigError
from skyward.serve.balance import Balancer, Replica, Upstream
from skyward.serve.http import (
    END,
    ClientReader,
    HeadTooLarge,
    Refused,
    RequestHead,
    UpstreamConn,
    answer,
    nodelay,
)

__all__ = ["AccessRecord", "Router", "RouterStats", "Upstream"]

log = logging.getLogger("skyward.serve")

T = TypeVar("T")

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})
REPLAY_LIMIT = 1024 * 1024  # an idempotent request's body kept for a retry, at most
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class AccessRecord:
    method: str
    path: str
    status: int
    seconds: float
    replica: str | None
    client: str


@dataclass(frozen=True)
class RouterStats:
    in_flight: int  # requests a replica is answering now
    queued: int  # requests waiting for a replica
    total: int  # finished requests
    by_status: dict[int, int]
    latency_buckets: tuple[tuple[float, int], ...]  # (upper bound in seconds, cumulative count)
    latency_sum: float
    cold_waits: int  # requests that arrived when there was no replica at all
    per_replica: dict[str, int]  # replica key -> requests in flight on it (draining ones too)
    replicas: tuple[str, ...]  # keys of the ready replicas


@dataclass
class _Request:
    head: RequestHead
    reader: ClientReader
    client: str
    idempotent: bool
    replay: list[bytes] | None = field(default_factory=list)  # body chunks read so far, for a retry
    replay_size: int = 0
    body_started: bool = False
    body_complete: bool = False
    client_gone: bool = False
    expect_continue: bool = False
    head_sent: bool = False  # bytes of the replica's answer reached the client

    def replayable(self) -> bool:
        return not self.body_started or (self.body_complete and self.replay is not None)


class Router:
    def __init__(self, *, token: str | None, timeout: float = 60.0, max_queue: int = 1024,
                 on_demand: Callable[[], None] | None = None,
                 access_log: Callable[[AccessRecord], None] | None = None, forward_auth: bool = False) -> None:
        self._token = token
        # Whether the checked Authorization header goes on to the replica (a head node's router:
        # its replicas listen on TCP and check the same token themselves).
        self._strip_auth = token is not None and not forward_auth
        self._expected = f"Bearer {token}".encode() if token is not None else b""
        self._timeout = timeout
        self._balance = Balancer(max_queue, on_demand)
        self._access_log = access_log
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.Task[Any]] = set()
        self._total = 0
        self._by_status: dict[int, int] = {}
        self._buckets = [0] * len(BUCKETS)
        self._latency_sum = 0.0

    # ---- the public, thread-safe surface ----

    def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        if self._loop is not None:
            raise RuntimeError("this router was already started")
        try:
            sock = socket.create_server((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"the endpoint cannot listen on {host}:{port}: the port is in use; "
                                  "pick another port, or port=0 for a free one") from e
            raise ConfigError(f"the endpoint cannot listen on {host}:{port}: {e.strerror}; "
                              "give an address of this machine and a free port") from e
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_log_loop_error)
        thread = threading.Thread(target=loop.run_forever, name="skyward-serve-router", daemon=True)
        self._loop, self._thread = loop, thread
        thread.start()

        async def listen() -> asyncio.AbstractServer:
            return await asyncio.start_server(self._on_client, sock=sock, limit=1 << 20)

        self._server = asyncio.run_coroutine_threadsafe(listen(), loop).result()
        bound = sock.getsockname()
        return str(bound[0]), int(bound[1])

    def add(self, upstream: Upstream) -> None:
        self._call(lambda: self._balance.add(upstream))

    def remove(self, key: str, *, lost: bool) -> None:
        self._call(lambda: self._balance.remove(key, lost))

    def wait_drained(self, key: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._call(lambda: self._balance.in_flight_by_key.get(key, 0)):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def stats(self) -> RouterStats:
        return self._call(self._snapshot)

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=30)
        except Exception:
            log.exception("closing the serving router")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        if not thread.is_alive():
            loop.close()

    # ---- on the loop ----

    def _call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the router's loop (the loop owns the state), its value returned here."""
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running() or \
                threading.current_thread() is self._thread:
            return fn()

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result()

    def _snapshot(self) -> RouterStats:
        running, cumulative = 0, []
        for bound, n in zip(BUCKETS, self._buckets, strict=True):
            running += n
            cumulative.append((bound, running))
        cumulative.append((float("inf"), self._total))
        return RouterStats(
            in_flight=sum(self._balance.in_flight_by_key.values()), queued=len(self._balance.waiters), total=self._total,
            by_status=dict(self._by_status), latency_buckets=tuple(cumulative),
            latency_sum=self._latency_sum, cold_waits=self._balance.cold_waits,
            per_replica=dict(self._balance.in_flight_by_key), replicas=tuple(r.key for r in self._balance.ready))

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for fut, _ in self._balance.waiters:
            fut.cancel()
        for task in list(self._clients):
            task.cancel()
        for rep in list(self._balance.replicas.values()):
            for conn in [*rep.active, *rep.idle]:
                conn.abort()
        if self._clients:
            await asyncio.wait(list(self._clients), timeout=10)
        if self._server is not None:
            await self._server.wait_closed()

    # ---- a client connection ----

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        nodelay(writer)
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) else "unix"
        cr = ClientReader(reader)
        try:
            while True:
                try:
                    event = await cr.next()
                except HeadTooLarge:
                    writer.write(answer(431, "the request's head is too large", close=True))
                    break
                except Exception as e:  # httptools.HttpParserError and its kin
                    if isinstance(e, ConnectionError):
                        break
                    writer.write(answer(400, "the request is not valid HTTP/1.1", close=True))
                    break
                if event is None:
                    break
                if not isinstance(event, RequestHead):
                    continue
                if not await self._handle(cr, writer, event, client):
                    break
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("serving a client connection")
        finally:
            self._clients.discard(task)
            with contextlib.suppress(Exception):
                if writer.transport.get_write_buffer_size():
                    await asyncio.wait_for(writer.drain(), 1)
            writer.close()

    async def _handle(self, cr: ClientReader, writer: asyncio.StreamWriter, head: RequestHead,
                      client: str) -> bool:
        """One request, answered; whether the client connection can take the next one."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        req = _Request(head, cr, client, head.method in IDEMPOTENT or
                       head.header(b"idempotency-key") is not None)
        if not req.idempotent:
            req.replay = None
        expect = head.header(b"expect")
        req.expect_continue = expect is not None and expect.lower() == b"100-continue"
        status, rep_key, keep = 0, None, head.keep_alive
        try:
            if self._token is not None:
                got = head.header(b"authorization") or b""
                if not hmac.compare_digest(got, self._expected):
                    raise Refused(401, "unauthorized", (("WWW-Authenticate", "Bearer"),))
            status, rep_key, keep = await self._forward(req, writer, start + self._timeout)
        except Refused as r:
            status = r.status
            keep = keep and self._skip_body(req)
            writer.write(answer(r.status, r.text, close=not keep, extra=r.extra))
        except asyncio.CancelledError:
            keep = False
            raise
        except (ConnectionError, OSError):
            keep = False  # the client went away
        except Exception:
            log.exception("serve: the router failed on %s %s", head.method, head.url[:200].decode("latin-1"))
            keep = False
            if not req.head_sent:
                status = 502
                writer.write(answer(502, "the router failed on this request", close=True))
        finally:
            seconds = loop.time() - start
            self._record(req, status or 499, seconds, rep_key)
        return keep and not req.client_gone

    def _skip_body(self, req: _Request) -> bool:
        """Whether the rest of the request is already read (so the connection can go on)."""
        if req.body_complete:
            return True
        if req.body_started or not req.reader.body_buffered():
            return False
        while req.reader.events and req.reader.events.popleft() is not END:
            pass
        req.body_complete = True
        return True

    def _record(self, req: _Request, status: int, seconds: float, rep_key: str | None) -> None:
        self._total += 1
        self._by_status[status] = self._by_status.get(status, 0) + 1
        self._latency_sum += seconds
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self._buckets[i] += 1
                break
        if self._access_log is not None:
            path = req.head.url.split(b"?", 1)[0].decode("latin-1")
            try:
                self._access_log(AccessRecord(req.head.method, path, status, seconds, rep_key, req.client))
            except Exception:
                log.exception("the access log callback failed")

    async def _forward(self, req: _Request, writer: asyncio.StreamWriter,
                       deadline: float) -> tuple[int, str | None, bool]:
        """Sends the request to a replica (once more to another when that is safe) and relays
        its answer: (status, replica key, keep the client connection)."""
        exclude: frozenset[Replica] = frozenset()
        why = ""
        while True:
            if exclude and not any(r not in exclude for r in self._balance.ready):
                raise Refused(502, f"{why}, and no other replica is ready")
            rep = await self._balance.acquire(exclude, deadline)
            try:
                try:
                    async with asyncio.timeout_at(deadline):
                        conn, fresh = await self._balance.connection(rep)
                except TimeoutError:
                    raise Refused(504, f"replica {rep.key} did not accept a connection in time") from None
                except Exception as e:
                    if exclude or not req.replayable():
                        raise Refused(502, f"could not connect to replica {rep.key}") from None
                    log.warning("serve: cannot connect to replica %s (%s); trying another", rep.key, e)
                    exclude, why = frozenset({rep}), f"could not connect to replica {rep.key}"
                    continue
                outcome = await self._exchange(req, rep, conn, fresh, writer, deadline)
            finally:
                self._balance.release(rep)
            if outcome == "retry":
                if exclude:
                    raise Refused(502, f"replica {rep.key} was lost")
                exclude, why = frozenset({rep}), f"replica {rep.key} was lost"
                continue
            status, keep = outcome
            return status, rep.key, keep

    async def _exchange(self, req: _Request, rep: Replica, conn: UpstreamConn, fresh: bool,
                        writer: asyncio.StreamWriter, deadline: float) -> Any:
        """One try on one connection: (status, keep) once answered, or "retry" when the replica
        was lost before anything reached the client and the request may be sent again."""
        head = req.head
        rep.active.add(conn)
        conn.begin(head_only=head.method == "HEAD")
        if rep.lost:
            conn.abort()
        data = head.upstream(strip_auth=self._strip_auth, client=req.client)
        pump: asyncio.Task[None] | None = None
        if req.expect_continue:
            req.expect_continue = False
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the router reads the body itself
        if req.body_complete or (not req.body_started and req.reader.body_buffered()):
            conn.writer.write(data + b"".join(self._body_now(req)))
        else:
            conn.writer.write(data)
            pump = asyncio.ensure_future(self._pump(req, conn))
        try:
            return await self._relay(req, rep, conn, fresh, writer, deadline, pump)
        finally:
            if pump is not None and not pump.done():
                pump.cancel()
                conn.reusable = False
                with contextlib.suppress(BaseException):
                    await pump
            self._balance.park(rep, conn)

    def _body_now(self, req: _Request) -> list[bytes]:
        """The whole body, already read: framed for the replica."""
        out: list[bytes] = []
        if req.body_complete:
            chunks = req.replay or []
        else:
            chunks = []
            events = req.reader.events
            while (ev := events.popleft()) is not END:
                chunks.append(ev)  # type: ignore[arg-type]
            req.body_complete = True
            if req.replay is not None and sum(map(len, chunks)) <= REPLAY_LIMIT:
                req.replay = chunks
            else:
                req.replay = None
                req.body_started = bool(chunks)
        for chunk in chunks:
            out.append(_frame(req, chunk))
        if req.head.chunked:
            out.append(b"0\r\n\r\n")
        return out

    async def _pump(self, req: _Request, conn: UpstreamConn) -> None:
        """Streams the request body to the replica as the client sends it."""
        w = conn.writer
        try:
            while True:
                ev = await req.reader.next()
                if ev is None:
                    req.client_gone = True
                    conn.abort()
                    return
                if ev is END:
                    req.body_complete = True
                    if req.head.chunked:
                        w.write(b"0\r\n\r\n")
                    return
                assert isinstance(ev, bytes)
                req.body_started = True
                if req.replay is not None:
                    req.replay_size += len(ev)
                    if req.replay_size <= REPLAY_LIMIT:
                        req.replay.append(ev)
                    else:
                        req.replay = None
                w.write(_frame(req, ev))
                await w.drain()
        except (ConnectionError, OSError):
            pass  # the relay sees the replica go

    async def _relay(self, req: _Request, rep: Replica, conn: UpstreamConn, fresh: bool,
                     writer: asyncio.StreamWriter, deadline: float, pump: asyncio.Task[None] | None) -> Any:
        reader = conn.reader
        held: list[bytes] = []
        try:
            async with asyncio.timeout_at(deadline):
                while not conn.headed:
                    data = await reader.read(65536)
                    if not data:
                        break
                    conn.feed(data)
                    held.append(data)
        except TimeoutError:
            conn.abort()
            raise Refused(504, f"replica {rep.key} did not answer in time") from None
        except (ConnectionError, OSError):
            pass
        except Exception:  # httptools.HttpParserError: not HTTP
            conn.abort()
            raise Refused(502, f"replica {rep.key} sent an invalid response") from None
        if req.client_gone:
            return 499, False
        if not conn.headed:
            conn.abort()
            if pump is not None and not pump.done():
                pump.cancel()
                with contextlib.suppress(BaseException):
                    await pump
            if not fresh and not rep.lost and req.replayable():
                # a pooled connection the replica had just closed: try a new one, same replica
                try:
                    async with asyncio.timeout_at(deadline):
                        again, _ = await self._balance.connection(rep)
                except Exception:
                    return "retry" if req.idempotent else self._lost(rep)
                return await self._exchange(req, rep, again, True, writer, deadline)
            if req.idempotent and req.replayable():
                log.warning("serve: replica %s was lost before answering %s %s; retrying on another",
                            rep.key, req.head.method, req.head.url[:200].decode("latin-1"))
                return "retry"
            return self._lost(rep)
        writer.write(b"".join(held))
        req.head_sent = True
        status = conn.status
        if conn.upgraded:
            await self._splice(req, conn, writer)
            return status, False
        try:
            while not conn.complete:
                data = await reader.read(65536)
                if not data:
                    if not conn.framed and not rep.lost:
                        conn.reusable = False
                        return status, False  # ended by close; so must the client's connection
                    log.warning("serve: replica %s was lost while streaming %s %s", rep.key,
                                req.head.method, req.head.url[:200].decode("latin-1"))
                    conn.abort()
                    return status, False
                conn.feed(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            conn.abort()
            if writer.is_closing():
                req.client_gone = True
            return status, False
        keep = req.head.keep_alive and not conn.close_after and (req.body_complete or self._skip_body(req))
        if pump is not None and not pump.done():
            conn.reusable = False
        return status, keep

    def _lost(self, rep: Replica) -> Any:
        raise Refused(502, f"replica {rep.key} was lost before it answered")

    async def _splice(self, req: _Request, conn: UpstreamConn, writer: asyncio.StreamWriter) -> None:
        """After a 101 answer: bytes both ways until either side closes."""
        conn.reusable = False
        leftover = req.reader.upgraded or b""
        if leftover:
            conn.writer.write(leftover)

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass

        up = asyncio.ensure_future(copy(req.reader.reader, conn.writer))
        down = asyncio.ensure_future(copy(conn.reader, writer))
        try:
            await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
            down.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            conn.abort()


def _frame(req: _Request, chunk: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(chunk), chunk) if req.head.chunked else chunk


def _log_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    log.error("serving router: %s", context.get("message"), exc_info=context.get("exception"))
