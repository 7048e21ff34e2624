"""The dashboard's ASGI app (Starlette): HTML pages, the JSON API under /api, server-sent events.

Every request needs the access token, given as ``Authorization: Bearer TOKEN`` (the API,
curl, Prometheus), as ``X-Skyward-Token: TOKEN``, or as ``?token=TOKEN``; or a browser session.
The token is only exchanged for a session: a page visited with ``?token=`` (the URL ``skyward
dashboard`` prints), or ``POST /login`` with a one-time code (``skyward dashboard --open``: a
0600 page posts it, ``Hub.login_code``, so nothing secret is on a command line), starts one.

A session is two random values the server keeps (``Hub.sessions``), neither of them the token
and neither accepted as one: an id in an HttpOnly, SameSite=Strict cookie named after the
server's port (``skyward_session_PORT``), and a key the page keeps in its origin's
``localStorage`` and sends as ``X-Skyward-Session`` with every API call. Browsers send a
127.0.0.1 cookie to every port of 127.0.0.1 (another user's server on another port gets it),
but keep ``localStorage`` per origin, port included: the cookie alone opens only the HTML shells
(which hold no data), never the API. A session unused for ``SESSION_IDLE`` s is forgotten. A
foreign page cannot add the header, so the API needs no other guard against cross-site requests.
Nor can it frame a page to borrow the user's clicks: every response forbids framing
(``framing.NoFraming``), and a page that finds itself in a frame acts on nothing (``dashboard.js``).

Blocking work (registry, providers, stacks, attaching to nodes) runs in worker threads, never
on the event loop. Pages are static HTML shells; ``app.js`` renders them from the API and
keeps them current from ``/api/events``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import html
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from skyward.errors import ConfigError, PoolExistsError, PoolNotFoundError, SkywardError
from skyward.named import registry
from skyward.observe import prometheus
from skyward.observe.prometheus import PoolStats
from skyward.records import audit

from . import views
from .framing import NoFraming
from .live import LivePool
from .watch import NodeWatch

log = logging.getLogger("skyward.dashboard")
STATIC = Path(__file__).parent / "static"
COOKIE = "skyward_session_{port}"  # one name per port: two dashboards' sessions never meet
SESSION_HEADER = "x-skyward-session"
SESSION_IDLE = 12 * 3600.0  # seconds a browser session may go unused
SESSIONS_KEPT = 256  # at most this many sessions; logging in past it forgets the least recently used
POLL = 1.0  # seconds between looks at the registry and the audit trail for changes
LIVE_KEPT = 600.0  # seconds an ended program's pool stays listed
CODE_TTL = 120.0  # seconds a one-time login code is good for (a browser's first start is slow)


@dataclass
class Hub:
    """The server's state: registered program pools and the event-stream subscribers."""

    token: str
    project: Path | None = None
    live: dict[str, LivePool] = field(default_factory=dict)
    # Named pools whose page is open while no program uses them: their agents, listened to.
    watches: dict[str, NodeWatch] = field(default_factory=dict)
    watched: dict[str, LivePool] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None
    subscribers: set[tuple[asyncio.Queue[dict[str, Any]], str | None]] = field(default_factory=set)
    # One-time login codes (``--open``) and when each expires (time.monotonic()).
    codes: dict[str, float] = field(default_factory=dict)
    codes_lock: threading.Lock = field(default_factory=threading.Lock)
    # Prometheus counters of each program pool (by id) and watched named pool (by name).
    stats: dict[str, PoolStats] = field(default_factory=dict)
    # Browser sessions: the cookie's id -> (the page's key, when last used, time.monotonic()).
    sessions: dict[str, tuple[str, float]] = field(default_factory=dict)
    session_idle: float = SESSION_IDLE

    def new_session(self) -> tuple[str, str]:
        """A new browser session: (the cookie's id, the page's key)."""
        sid, key = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self.codes_lock:
            self._forget_idle()
            while len(self.sessions) >= SESSIONS_KEPT:
                del self.sessions[min(self.sessions, key=lambda s: self.sessions[s][1])]
            self.sessions[sid] = (key, time.monotonic())
        return sid, key

    def _forget_idle(self) -> None:
        now = time.monotonic()
        for sid, (_, used) in list(self.sessions.items()):
            if now - used > self.session_idle:
                del self.sessions[sid]

    def session(self, sid: str | None, key: str | None, *, page: bool = False) -> bool:
        """Whether ``sid`` (the cookie) is a live session and ``key`` its key (``page``: a page's
        HTML shell, asked for by a navigation that cannot carry the key: the cookie is enough)."""
        if not sid:
            return False
        with self.codes_lock:
            self._forget_idle()
            found = next((s for s in self.sessions if hmac.compare_digest(s.encode(), sid.encode())), None)
            if found is None:
                return False
            wanted, _ = self.sessions[found]
            if not page and (key is None or not hmac.compare_digest(wanted.encode(), key.encode())):
                return False
            self.sessions[found] = (wanted, time.monotonic())
            return True

    def login_code(self, ttl: float = CODE_TTL) -> str:
        """A code that ``POST /login`` exchanges for the session cookie once, within ``ttl`` s.

        It stands in for the token where the token would be seen: a browser's command line is
        readable by every local user, a code that is spent (or expired) is worth nothing."""
        code = secrets.token_urlsafe(24)
        with self.codes_lock:
            self.codes[code] = time.monotonic() + ttl
        return code

    def redeem(self, code: str) -> bool:
        """Spend ``code``: True once for a code this hub issued and that has not expired."""
        now = time.monotonic()
        with self.codes_lock:
            for known, expires in list(self.codes.items()):
                if expires < now:
                    del self.codes[known]
            # Compare each in constant time; pop only the one that matched.
            match = next((k for k in self.codes if hmac.compare_digest(k.encode(), code.encode())), None)
            return match is not None and self.codes.pop(match, None) is not None

    def publish(self, message: dict[str, Any], ref: str | None = None, name: str | None = None) -> None:
        """Send ``message`` to the pages that want it: one about a pool (``ref``/``name``) to the
        pages of that pool and the pools list; one about no pool in particular (the registry
        changed) to every page, a pool's page included (its record may be what changed)."""
        for queue, wanted in list(self.subscribers):
            if wanted is None or (ref is None and name is None) or wanted in (ref, name):
                try:
                    queue.put_nowait(message)
                except asyncio.QueueFull:  # a stalled reader loses events, never the server
                    pass

    def programs_of(self, name: str) -> list[LivePool]:
        """Open program pools attached to (or owning) named pool ``name``, newest first."""
        found = [p for p in self.live.values() if p.name == name and p.alive()]
        return sorted(found, key=lambda p: float(p.info.get("started") or 0), reverse=True)


# -- auth ------------------------------------------------------------------------------------------
def cookie_name(request: Request) -> str:
    """The session cookie's name on the port this request came in on."""
    server = request.scope.get("server") or ("", 0)
    return COOKIE.format(port=int(server[1] or 0))


def _given_token(request: Request) -> str | None:
    """The access token the request carries, if any (a session is not one)."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    if "x-skyward-token" in request.headers:
        return request.headers["x-skyward-token"]
    return request.query_params.get("token")


def _has_token(hub: Hub, request: Request) -> bool:
    token = _given_token(request)
    return token is not None and hmac.compare_digest(token.encode(), hub.token.encode())


def _authorized(hub: Hub, request: Request, *, page: bool = False) -> bool:
    """The token, or a live session: its cookie and (but for ``page``) its key. The key comes
    as ``X-Skyward-Session``, or as ``?session=`` for the event stream (EventSource sends no
    headers of its own)."""
    if _has_token(hub, request):
        return True
    key = request.headers.get(SESSION_HEADER)
    if key is None and request.url.path == "/api/events":
        key = request.query_params.get("session")
    return hub.session(request.cookies.get(cookie_name(request)), key, page=page)


def _unauthorized(api: bool) -> Response:
    if api:
        return JSONResponse({"error": "a valid token is required: send `Authorization: Bearer TOKEN` "
                                      "(the token is in the URL `skyward dashboard` printed); a browser "
                                      "session expires after a while unused: open that URL again"}, 401)
    return HTMLResponse("<!doctype html><title>skyward: token required</title><h1>401: token required</h1>"
                        "<p>Open the URL that <code>skyward dashboard</code> printed (it ends in "
                        "<code>?token=...</code>).</p>", 401, headers={"Cache-Control": "no-store"})


_LOGGED_IN = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="skyward-session" content="{key}"><title>skyward</title></head>
<body><p><a href="{target}">Open the dashboard</a></p><script>
localStorage.setItem("skyward-session", document.querySelector('meta[name="skyward-session"]').content);
location.replace({target_js});
</script></body></html>
"""


def _logged_in(hub: Hub, request: Request, target: str) -> Response:
    """A new session: its cookie, and a page that keeps its key in this origin's localStorage
    and goes on to ``target`` by itself (not a redirect: after ``--open``'s post the browser came
    from a file, another site, and the SameSite=Strict cookie would not go with a redirect)."""
    sid, key = hub.new_session()
    target_js = json.dumps(target).replace("<", "\\u003c")  # nothing in it can end the script
    body = _LOGGED_IN.format(key=html.escape(key), target=html.escape(target), target_js=target_js)
    response = HTMLResponse(body, headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})
    response.set_cookie(cookie_name(request), sid, httponly=True, samesite="strict", path="/")
    return response


def login(hub: Hub) -> Endpoint:
    """``POST /login`` with ``code=...`` (a form, as the page ``--open`` writes posts it): a
    one-time code for a session (``_logged_in``)."""

    async def endpoint(request: Request) -> Response:
        body = b""
        async for chunk in request.stream():  # unauthenticated: read no more than a code needs
            body += chunk
            if len(body) > 1024:
                body = b""
                break
        code = (parse_qs(body.decode("latin-1")).get("code") or [""])[0]
        if not code or not hub.redeem(code):
            return HTMLResponse(
                "<!doctype html><title>skyward: code used or expired</title>"
                "<h1>401: this login code was used already or has expired</h1>"
                f"<p>A code from <code>skyward dashboard --open</code> logs in once, within {int(CODE_TTL)} s. "
                "Open the URL that <code>skyward dashboard</code> printed instead.</p>",
                401, headers={"Cache-Control": "no-store"})
        return _logged_in(hub, request, "/")

    return endpoint


def _error(exc: BaseException) -> JSONResponse:
    status = (404 if isinstance(exc, PoolNotFoundError) else 409 if isinstance(exc, PoolExistsError)
              else 400 if isinstance(exc, ConfigError) else 500)
    return JSONResponse({"error": views.clean(str(exc)), "type": type(exc).__name__}, status)


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(views.clean(data), status)


Endpoint = Callable[[Request], Awaitable[Response]]


def api(hub: Hub, fn: Callable[[Hub, Request], Awaitable[Any]]) -> Endpoint:
    """An API endpoint: token or session checked, SkywardErrors as JSON errors, the result cleaned."""

    async def endpoint(request: Request) -> Response:
        if not _authorized(hub, request):
            return _unauthorized(api=True)
        try:
            result = await fn(hub, request)
        except SkywardError as exc:
            return _error(exc)
        except Exception as exc:  # a bug: say what, keep serving
            log.exception("dashboard: %s %s failed", request.method, request.url.path)
            return _error(exc)
        return result if isinstance(result, Response) else _json(result)

    return endpoint


async def _body(request: Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except ValueError:
        raise ConfigError("the request body must be a JSON object") from None
    if not isinstance(data, dict):
        raise ConfigError("the request body must be a JSON object")
    return data


# -- API: pools ------------------------------------------------------------------------------------
async def list_pools(hub: Hub, request: Request) -> Any:
    named = await run_in_threadpool(views.named_pools)
    for row in named:
        row["programs"] = [p.summary() for p in hub.programs_of(row["name"])]
    programs = [p.summary() for p in hub.live.values() if p.name is None]
    return named + sorted(programs, key=lambda r: -float(r["created"] or 0))


def _live_ref(hub: Hub, ref: str) -> LivePool:
    pool = hub.live.get(ref[1:]) if ref.startswith("@") else None
    if pool is None:
        raise PoolNotFoundError(f"no program pool {ref!r} is known to this dashboard; GET /api/pools lists them.")
    return pool


async def get_pool(hub: Hub, request: Request) -> Any:
    ref = request.path_params["ref"]
    if ref.startswith("@"):
        return _live_ref(hub, ref).view()
    detail = await run_in_threadpool(views.named_pool, ref)
    programs = hub.programs_of(ref)
    detail["programs"] = [p.summary() for p in programs]
    # Live data comes from the programs using the pool; the newest one's metrics stand for the
    # nodes (every client receives the same samples).
    watched = hub.watched.get(ref)
    detail["live"] = programs[0].view() if programs else watched.view() if watched is not None else None
    detail["batches"] = [b for p in programs for b in p.view()["batches"]]
    return detail


async def get_history(hub: Hub, request: Request) -> Any:
    return await run_in_threadpool(views.history, request.path_params["ref"])


async def get_stack(hub: Hub, request: Request) -> Any:
    return await run_in_threadpool(views.stack, request.path_params["ref"])


async def get_logs(hub: Hub, request: Request) -> Any:
    ref = request.path_params["ref"]
    try:
        lines = int(request.query_params.get("lines", 100))
        node = request.query_params.get("node")
        node_index = None if node in (None, "") else int(node)
    except ValueError:
        raise ConfigError("lines and node must be integers") from None
    if ref.startswith("@"):  # a program's pool: the task output it relayed
        output = _live_ref(hub, ref).view()["output"]
        return [{"node": int(n), "text": "\n".join(text[-lines:]), "error": None}
                for n, text in output.items() if node_index is None or int(n) == node_index]
    return await run_in_threadpool(views.log_tail, ref, node_index, lines)


async def create_pool(hub: Hub, request: Request) -> Any:
    data = await _body(request)
    name = data.get("name")
    if not isinstance(name, str):
        raise ConfigError('give the pool to start: {"name": "NAME"} ([pools.NAME] in skyward.toml)')
    result = await run_in_threadpool(views.up, name, hub.project)
    hub.publish({"type": "changed", "what": "pools"})
    return _json(result, 201)


async def delete_pool(hub: Hub, request: Request) -> Any:
    result = await run_in_threadpool(views.down, request.path_params["ref"])
    hub.publish({"type": "changed", "what": "pools"})
    return result


async def resize_pool(hub: Hub, request: Request) -> Any:
    data = await _body(request)
    result = await run_in_threadpool(views.resize, request.path_params["ref"], data.get("nodes"))
    hub.publish({"type": "changed", "what": "pools"})
    return result


async def exec_pool(hub: Hub, request: Request) -> Any:
    data = await _body(request)
    timeout = data.get("timeout", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigError(f"timeout={timeout!r} is not valid: give seconds per node, a number > 0.")
    return await run_in_threadpool(views.run_command, request.path_params["ref"], data.get("command"),
                                   float(timeout))


async def get_config(hub: Hub, request: Request) -> Any:
    return await run_in_threadpool(views.config_pools, hub.project)


async def get_preview(hub: Hub, request: Request) -> Any:
    return await run_in_threadpool(views.preview, request.path_params["name"], hub.project)


# -- API: programs register their pools (see hook.py) ------------------------------------------
async def ingest_register(hub: Hub, request: Request) -> Any:
    info = await _body(request)
    pool = LivePool(info)
    hub.live[pool.id] = pool
    hub.stats[pool.id] = _stats_of(info)
    hub.publish({"type": "changed", "what": "pools"})
    return {"ok": True}


async def ingest_events(hub: Hub, request: Request) -> Any:
    try:
        batch = await request.json()
    except ValueError:
        raise ConfigError("the body must be a JSON list of events") from None
    touched: dict[str, LivePool] = {}
    out: dict[str, list[dict[str, Any]]] = {}
    for event in batch if isinstance(batch, list) else []:
        pool = hub.live.get(str(event.get("pool")))
        if pool is None:
            continue
        pool.apply(event)
        stats = hub.stats.get(pool.id)
        if stats is not None:
            stats.apply(event)
        touched[pool.id] = pool
        out.setdefault(pool.id, []).append(event)
    for pool_id, events in out.items():
        pool = touched[pool_id]
        hub.publish({"type": "events", "ref": pool.ref, "name": pool.name, "events": views.clean(events)},
                    ref=pool.ref, name=pool.name)
        if pool.ended is not None:
            hub.publish({"type": "changed", "what": "pools"})
    return {"ok": True}


# -- Prometheus ------------------------------------------------------------------------------------
def _stats_of(info: dict[str, Any]) -> PoolStats:
    """Counters for a registered pool: named pools by name (stable across programs), others by id."""
    cost = info.get("hourly_cost")
    return PoolStats(prometheus.pool_label(info.get("name"), str(info["id"])), str(info.get("provider") or ""),
                     None if cost is None else float(cost), info.get("nodes") or (),
                     started=info.get("started"))


def _named_rows() -> list[dict[str, Any]]:
    """The registry's named pools as Prometheus summaries (those no program reports on)."""
    rows = []
    for row in views.named_pools():
        state = {"running": "ready", "provisioning": "provisioning"}.get(row["state"])  # asleep, expired...: none
        rows.append({"pool": row["name"], "provider": row.get("provider"),
                     "nodes": {state: row["nodes"]} if state else {},
                     "hourly_cost": row.get("hourly_cost") if state else None,
                     "cost_so_far": row.get("cost_so_far")})
    return rows


async def metrics(hub: Hub, request: Request) -> Any:
    """``GET /metrics``: every pool in Prometheus' text format (docs/guides/observability.md)."""
    named = await run_in_threadpool(_named_rows)
    reg = prometheus.registry(lambda: (list(hub.stats.values()), named))
    body, content_type = await run_in_threadpool(prometheus.render, reg)
    return Response(body, headers={"Content-Type": content_type, "Cache-Control": "no-store"})


# -- API: the event stream ---------------------------------------------------------------------
async def event_stream(hub: Hub, request: Request) -> Any:
    """Server-sent events: ``data:`` lines, each a JSON list of messages, sent at most every
    0.2 s. ``?pool=REF`` keeps only that pool's (a name or ``@id``), plus what changes lists."""
    ref = request.query_params.get("pool") or None
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=10000)
    entry = (queue, ref)

    async def stream() -> AsyncIterator[str]:
        hub.subscribers.add(entry)
        try:
            yield "retry: 2000\n" + "data: " + json.dumps([{"type": "hello", "time": time.time()}]) + "\n\n"
            while True:
                try:
                    first = await asyncio.wait_for(queue.get(), 15.0)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                await asyncio.sleep(0.2)  # let a burst gather into one message
                batch = [first]
                while not queue.empty() and len(batch) < 2000:
                    batch.append(queue.get_nowait())
                yield "data: " + json.dumps(batch, default=str) + "\n\n"
        finally:
            hub.subscribers.discard(entry)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


# -- watching the registry and the audit trail -------------------------------------------------
def _signature() -> tuple[dict[str, int], dict[str, int]]:
    def stamps(folder: Path, pattern: str) -> dict[str, int]:
        out = {}
        for p in folder.glob(pattern):
            try:
                out[p.stem] = p.stat().st_mtime_ns
            except OSError:
                continue
        return out

    audit_dir = audit._path("x").parent
    return stamps(registry.pools_dir(), "*.json"), stamps(audit_dir, "*.jsonl")


async def watch(hub: Hub) -> None:
    """Tell the pages when a pool starts, stops, changes, or its trail grows (a CLI command or
    another program did something), and when a registered program ends."""
    pools, trails = await run_in_threadpool(_signature)
    while True:
        await asyncio.sleep(POLL)
        try:
            new_pools, new_trails = await run_in_threadpool(_signature)
        except OSError:
            continue
        changed = new_pools != pools
        for name in {*new_trails, *trails}:
            if new_trails.get(name) != trails.get(name):
                hub.publish({"type": "changed", "what": "audit", "ref": name}, name=name)
                changed = True
        now = time.time()
        for pool in list(hub.live.values()):
            if pool.ended is None and not pool.alive():
                pool.ended = now
                changed = True
            if pool.ended is not None and now - pool.ended > LIVE_KEPT:
                del hub.live[pool.id]
                hub.stats.pop(pool.id, None)
                changed = True
        if changed:
            hub.publish({"type": "changed", "what": "pools"})
        pools, trails = new_pools, new_trails
        await run_in_threadpool(_update_watches, hub, set(new_pools))


def _update_watches(hub: Hub, registered: set[str]) -> None:
    """Listen to the agents of the named pools whose pages are open and that no program uses;
    stop listening when the page closes, a program takes over, or the pool goes away."""
    wanted = {ref for _, ref in list(hub.subscribers) if ref and not ref.startswith("@")}
    for name in list(hub.watches):
        if name not in wanted or name not in registered or hub.programs_of(name):
            hub.watches.pop(name).stop()
            hub.watched.pop(name, None)
            hub.stats.pop(name, None)
    for name in wanted - set(hub.watches):
        if name not in registered or hub.programs_of(name):
            continue
        record = registry.read(name)
        if record is None or record.get("state") != "running" or not record.get("cluster"):
            continue
        watch = NodeWatch(name, functools.partial(_from_watch, hub, name))
        hub.watched[name] = LivePool(watch.info(record))
        hub.stats[name] = _stats_of(hub.watched[name].info)
        hub.watches[name] = watch
        watch.start()


def _from_watch(hub: Hub, name: str, event: dict[str, Any]) -> None:
    """An event from a watched pool's agents (a watcher thread): hand it to the event loop."""

    def deliver() -> None:
        pool = hub.watched.get(name)
        if pool is None:
            return
        pool.apply(event)
        stats = hub.stats.get(name)
        if stats is not None:
            stats.apply(event)
        hub.publish({"type": "events", "ref": name, "name": name, "events": views.clean([event])}, name=name)

    if hub.loop is not None:
        hub.loop.call_soon_threadsafe(deliver)


# -- pages -------------------------------------------------------------------------------------
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - skyward</title>
<link rel="stylesheet" href="/static/uPlot.min.css">
<link rel="stylesheet" href="/static/dashboard.css">
</head>
<body data-page="{page}" data-ref="{ref}">
<header><a class="brand" href="/">skyward</a>
<nav><a href="/" id="nav-pools">Pools</a> <a href="/config" id="nav-config">skyward.toml</a></nav>
<span id="live-status" class="muted" title="live updates">connecting</span></header>
<main id="main"><p class="muted">loading</p></main>
<dialog id="confirm"><form method="dialog"><p id="confirm-text"></p>
<menu><button value="cancel" id="confirm-cancel">Cancel</button>
<button value="ok" id="confirm-ok" class="danger">Confirm</button></menu></form></dialog>
<script src="/static/uPlot.iife.min.js"></script>
<script src="/static/dashboard.js"></script>
</body></html>
"""


def page(hub: Hub, name: str) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        if not _authorized(hub, request, page=True):
            return _unauthorized(api=False)
        if "token" in request.query_params:  # from the printed URL: a session, and the URL without it
            target = request.url.remove_query_params("token")
            return _logged_in(hub, request, target.path + (f"?{target.query}" if target.query else ""))
        ref = request.path_params.get("ref", "")
        title = {"pools": "pools", "config": "skyward.toml"}.get(name, ref)
        body = _PAGE.format(title=html.escape(title), page=name, ref=html.escape(ref))
        return HTMLResponse(body, headers={"Cache-Control": "no-store"})

    return endpoint


class _Dashboard(Starlette):
    """The app, wrapped whole in ``NoFraming``: outside Starlette's own error handling, so that
    the 500 of an unhandled error says it may not be framed too."""

    def build_middleware_stack(self) -> Any:
        return NoFraming(super().build_middleware_stack())


def build(token: str, project: Path | None = None) -> Starlette:
    hub = Hub(token=token, project=project)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        hub.loop = asyncio.get_running_loop()
        task = asyncio.create_task(watch(hub))
        try:
            yield
        finally:
            task.cancel()
            for node_watch in hub.watches.values():
                node_watch.stop()

    routes = [
        Route("/", page(hub, "pools")),
        Route("/pools/{ref}", page(hub, "pool")),
        Route("/config", page(hub, "config")),
        Route("/login", login(hub), methods=["POST"]),
        Route("/api/pools", api(hub, list_pools)),
        Route("/api/pools", api(hub, create_pool), methods=["POST"]),
        Route("/api/pools/{ref}", api(hub, get_pool)),
        Route("/api/pools/{ref}", api(hub, delete_pool), methods=["DELETE"]),
        Route("/api/pools/{ref}/history", api(hub, get_history)),
        Route("/api/pools/{ref}/stack", api(hub, get_stack)),
        Route("/api/pools/{ref}/logs", api(hub, get_logs)),
        Route("/api/pools/{ref}/resize", api(hub, resize_pool), methods=["POST"]),
        Route("/api/pools/{ref}/exec", api(hub, exec_pool), methods=["POST"]),
        Route("/api/config", api(hub, get_config)),
        Route("/api/config/{name}/preview", api(hub, get_preview)),
        Route("/api/events", api(hub, event_stream)),
        Route("/metrics", api(hub, metrics)),
        Route("/api/ingest/register", api(hub, ingest_register), methods=["POST"]),
        Route("/api/ingest/events", api(hub, ingest_events), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = _Dashboard(routes=routes, lifespan=lifespan)
    app.state.hub = hub
    return app
