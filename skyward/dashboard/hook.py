"""How a running program shows its pools on the dashboard (standard library only).

Every pool calls :func:`opened` once it is ready. That starts one daemon thread per process
which, while the program has open pools, looks once a second for the dashboard's server file
(``SKYWARD_HOME/dashboard/server.json``, written by ``skyward dashboard``, 0600). That stat is
all it costs while no dashboard runs: no event subscription, so the pool emits nothing extra.

When a dashboard is up, the thread registers each open pool with it (a snapshot: nodes, size,
provider, cost; never the agents' token or the image's environment), subscribes to the pool's
events and posts them in batches every quarter second. When the dashboard goes away the
thread unsubscribes and goes back to looking for the file.

A pool that opens while a dashboard runs is subscribed before its first task (:func:`listen`,
called as it becomes ready), not at the thread's next look: a program that maps at once would
otherwise lose its first tasks' events (nobody listened, so none were built). What is queued
is sent when the pool closes (detach or destroy) and when the program exits, so a program
that ends right after its last task is counted whole.

A child forked from the program starts with none of this: the pools, the link and the events
it had queued are the parent's to send.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import socket
import sys
import threading
import time
import urllib.parse
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyward.paths import skyward_home

if TYPE_CHECKING:
    import http.client

    from skyward.core.pool import Pool
    from skyward.observe.events import Event

log = logging.getLogger("skyward.dashboard")

LOOK_EVERY = 1.0  # seconds between looks for a dashboard while none is up
SEND_EVERY = 0.25  # seconds between posts of the queued events while one is up
BATCH = 5000  # events per post
QUEUED = 200_000  # events kept while the dashboard is slow to take them (the oldest go first)

_pools: weakref.WeakSet[Pool] = weakref.WeakSet()
_lock = threading.Lock()
_thread: threading.Thread | None = None
_link: _Link | None = None


def server_file() -> Path:
    return skyward_home() / "dashboard" / "server.json"


def running_server() -> dict[str, Any] | None:
    """The running dashboard's ``{"url", "token", "pid"}``, or None."""
    try:
        info: dict[str, Any] = json.loads(server_file().read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info


def listen(pool: Pool) -> None:
    """A pool is ready and its caller's first task is next: while a dashboard runs, queue the
    pool's events from now on (the thread :func:`opened` starts sends them). One failed read
    of the server file when none runs."""
    global _link
    info = running_server()
    if info is None:
        return
    with _lock:
        _pools.add(pool)
        if _link is None:
            _link = _Link(str(info["url"]), str(info["token"]))
        _link.subscribe(pool)


def opened(pool: Pool) -> None:
    """A pool is ready: show it on the dashboard while one runs (cheap when none does)."""
    global _thread
    with _lock:
        _pools.add(pool)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_watch, name="skyward-dashboard", daemon=True)
            _thread.start()


def _drop(link: _Link) -> None:
    """Stop using ``link`` (the dashboard went away, or answered badly)."""
    global _link
    with _lock:
        if _link is link:
            _link = None
    link.close()


def _watch() -> None:
    global _thread, _link
    while True:
        with _lock:
            live = [p for p in _pools if p.is_active]
            link = _link
            if not live and (link is None or link.idle()):
                _link = None
                _thread = None
                if link is not None:
                    link.close()
                return
        if link is not None and time.monotonic() - link.checked > LOOK_EVERY:
            # The dashboard stopped (or another one replaced it): stop listening at once.
            info = running_server()
            link.checked = time.monotonic()
            if info is None or (str(info["url"]), str(info["token"])) != (link.url, link.token):
                _drop(link)
                link = None
        if link is None:
            info = running_server()
            if info is not None:
                with _lock:
                    if _link is None:
                        _link = _Link(str(info["url"]), str(info["token"]))
                    link = _link
        if link is not None:
            # Only when a dashboard runs: most programs never need it, and its import would
            # compete with the pool's start for the interpreter.
            import http.client

            try:
                link.sync(live)
                link.send()
            except (OSError, http.client.HTTPException, ValueError) as exc:
                log.debug("dashboard link lost: %s", exc)
                _drop(link)
                link = None
        time.sleep(SEND_EVERY if link is not None else LOOK_EVERY)


def _flush(timeout: float) -> None:
    """Send what is queued now (a pool closing, the program ending): every event emitted so
    far is handed to the link, then posted, after any post the thread has under way."""
    link = _link
    if link is None:
        return
    from skyward.observe.events import bus

    bus.flush(timeout)
    with contextlib.suppress(Exception):
        link.send()


def _forget_parents_link() -> None:
    """In a forked child: the pools, the watching thread (which did not come along) and the
    link to the dashboard with its queue of events are the parent's; sending that queue, or
    anything on the parent's connection, would post its events twice or mix with its requests.
    This process starts its own watch when it opens a pool of its own."""
    global _pools, _lock, _thread, _link
    _pools, _lock, _thread, _link = weakref.WeakSet(), threading.Lock(), None, None


os.register_at_fork(after_in_child=_forget_parents_link)


@atexit.register
def _flush_at_exit() -> None:
    """Send what is queued (a pool closed just before the program ends) before leaving."""
    _flush(1.0)


def _encode(event: Event) -> dict[str, Any]:
    out = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    out["type"] = type(event).__name__
    return out


def snapshot(pool: Pool) -> dict[str, Any]:
    """What the dashboard shows of a pool before any event: nothing secret."""
    spec = pool.spec
    provider = getattr(spec.provider, "kind", type(spec.provider).__name__)
    try:
        cost = spec.provider.hourly_cost(spec)
    except Exception:  # a price lookup must not stop the pool from showing
        cost = None
    members = pool.members
    grouped = len(pool.groups) > 1  # its nodes' indices repeat across groups: each says its group
    nodes = [{"index": m.channel.node, "hostname": m.endpoint.hostname, "private_ip": m.endpoint.private_ip,
              "lost": m.channel.lost is not None, **({"group": g.name} if grouped else {})}
             for g in pool.groups.values() for m in g.members.records()]
    return {
        "id": pool.id,
        "name": pool.name,
        "provider": provider,
        "owned": pool.owned,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "program": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python",
        "started": time.time() - (time.monotonic() - members.requested),
        "nodes": nodes,
        "desired": sum(g.members.nodes.desired for g in pool.groups.values()),
        "max": members.nodes.max,
        "accelerator": None if spec.accelerator is None else str(spec.accelerator),
        "ttl": spec.ttl,
        "hourly_cost": cost,
        "metrics": [m.name for m in spec.image.metrics],
    }


class _Link:
    """One program's connection to the dashboard."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.checked = url, time.monotonic()
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.token = token
        self.conn: http.client.HTTPConnection | None = None
        self.queue: deque[dict[str, Any]] = deque(maxlen=QUEUED)
        self.subscribed: dict[str, Callable[[], None]] = {}  # pool id -> unsubscribe
        self.unregistered: list[Pool] = []  # subscribed, not yet registered with the dashboard
        self.sending = threading.Lock()  # one post at a time, the queue's batches in order
        self.ended: set[str] = set()
        self.missing: dict[str, float] = {}  # pool id -> when it was first seen closed

    def idle(self) -> bool:
        return not self.queue and not self.subscribed and not self.unregistered

    def _post(self, path: str, body: Any) -> None:
        import http.client

        data = json.dumps(body, default=str).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
            try:
                self.conn.request("POST", path, data, headers)
                response = self.conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
                continue
            if response.status >= 400:
                raise ValueError(f"dashboard answered {response.status} to {path}")
            return

    def subscribe(self, pool: Pool) -> None:
        """Queue ``pool``'s events from now on; it is registered before they are posted."""
        from skyward.observe.events import ClusterDestroyed, ClusterDetached, bus

        if pool.id in self.subscribed or pool.id in self.ended:
            return
        queue = self.queue

        def put(event: Event, queue: deque[dict[str, Any]] = queue) -> None:
            queue.append(_encode(event))
            if isinstance(event, ClusterDestroyed | ClusterDetached):
                self.ended.add(event.pool)

        self.unregistered.append(pool)  # before any event of it can be queued
        self.subscribed[pool.id] = bus.subscribe(put, pool.id)
        pool.on_close(lambda: _flush(1.0))  # its last events leave as it closes

    def sync(self, live: list[Pool]) -> None:
        with _lock:
            for pool in live:
                self.subscribe(pool)
            # Stop listening once a pool's last event is queued (or it closed 3 s ago unseen).
            open_ids, now = {p.id for p in live}, time.monotonic()
            for pool_id in list(self.subscribed):
                if pool_id not in open_ids:
                    self.missing.setdefault(pool_id, now)
                if pool_id in self.ended or now - self.missing.get(pool_id, now) > 3.0:
                    self.subscribed.pop(pool_id)()
                    self.missing.pop(pool_id, None)

    def send(self) -> None:
        """Register the pools not registered yet, then post everything queued, in batches."""
        with self.sending:
            while self.unregistered:
                self._post("/api/ingest/register", snapshot(self.unregistered[0]))
                self.unregistered.pop(0)
            while self.queue:
                batch: list[dict[str, Any]] = []
                while self.queue and len(batch) < BATCH:
                    batch.append(self.queue.popleft())
                self._post("/api/ingest/events", batch)

    def close(self) -> None:
        for unsubscribe in list(self.subscribed.values()):
            unsubscribe()
        self.subscribed.clear()
        with self.sending:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
