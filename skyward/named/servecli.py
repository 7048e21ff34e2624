"""``skyward serve NAME [APP]``: an ASGI app served from a named pool's nodes, in the foreground.

The command attaches to the running pool NAME (as a program does: it is a client while it
serves, so the pool's ttl does not run out under it), calls ``pool.serve(APP)``, prints the
endpoint's URL and the header a request must send, and serves until Ctrl-C or SIGTERM; then it
closes the endpoint and detaches, and the pool stays up. While it serves it writes its status
beside the pool's record for ``skyward ls``, and takes update requests from ``skyward serve
NAME APP --update`` (skyward.named.serving says how, and why files).

A pool that sleeps at zero (``nodes = [0, N]``) is served asleep: the endpoint's first request
wakes it (``Endpoint`` calls ``members.wake()``, the wake a program's first task makes, recorded
the same way), and the pool's autoscaler, which counts the endpoint's requests, puts it to sleep
after ``--idle-timeout`` seconds with none (its replicas drained and stopped first).

APP is an import string ``module:attribute``, imported on the nodes; the current directory is
put first on this process's import path, as uvicorn does (a Local pool's nodes import what was
importable where ``skyward up`` ran). Without APP, ``[pools.NAME.serve] app`` of skyward.toml
is served, with that table's other settings under the command's flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ServeError
from .cliout import EXIT_FAILED, EXIT_OK, err

if TYPE_CHECKING:
    from ..core.pool import Pool
    from ..serve.endpoint import Endpoint

_TICK = 0.5  # how often the loop looks for update requests and a stop
_STATUS_EVERY = 1.0  # how often the status file is rewritten


def add_serve(command: Callable[[str], argparse.ArgumentParser]) -> None:
    p = command("serve")  # its help: _MODULE_COMMANDS of named/cli.py
    p.add_argument("name", help="the running pool's name")
    p.add_argument("app", nargs="?", metavar="APP",
                   help="'module:attribute' (the current directory is importable); default: "
                        "[pools.NAME.serve] app of skyward.toml")
    p.add_argument("--factory", action="store_true", default=None,
                   help="APP is a function that returns the app (called on each replica)")
    p.add_argument("--update", action="store_true",
                   help="roll the `skyward serve NAME` that runs now to APP, replica by replica, and "
                        "wait until it is done")
    p.add_argument("--on", choices=("client", "head"),
                   help="where the router runs: this machine (client, the default) or the pool's head "
                        "node, listening on its private address (head: the pool's other machines and "
                        "--allow-from reach it; requests do not pass through this machine)")
    p.add_argument("--allow-from", action="append", metavar="CIDR",
                   help="with --on head and a fixed --port: open that port of the head node to these "
                        "addresses (repeat for more; a cloud pool's firewall only)")
    p.add_argument("--host", help="the address this machine's router listens on (default 127.0.0.1: this "
                                  "machine only; not with --on head)")
    p.add_argument("--port", type=int, help="the port to listen on (default 8000; 0: any free port)")
    p.add_argument("--replicas-per-node", type=int, metavar="N",
                   help="replicas of the app on each node (default 1; each holds a task slot)")
    p.add_argument("--ready", metavar="PATH",
                   help="a path of the app that answers 200 once a replica is ready, e.g. /health")
    p.add_argument("--idle-timeout", type=float, metavar="S",
                   help="an elastic pool shrinks to its floor after S seconds with no request; one of "
                        "nodes 0:N sleeps, and the next request wakes it (default 60)")
    p.add_argument("--no-auth", action="store_true",
                   help="take requests without the bearer token (anyone who reaches the port may call)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="seconds a request may take before the endpoint answers 504 (default 60)")
    p.set_defaults(handler=cmd_serve)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The command's flags over ``[pools.NAME.serve]`` over the defaults."""
    from ..spec import Options
    from .config import load
    from .registry import check_name

    check_name(args.name)
    table = dict(load(args.name, require=False).data.get("serve") or {})
    flags = {"app": args.app, "factory": args.factory, "host": args.host, "port": args.port,
             "replicas_per_node": args.replicas_per_node, "ready": args.ready, "timeout": args.timeout,
             "idle_timeout": args.idle_timeout, "on": args.on, "allow_from": args.allow_from}
    out: dict[str, Any] = {"factory": False, "host": None, "port": 8000, "replicas_per_node": 1,
                           "ready": None, "timeout": 60.0, "idle_timeout": Options().autoscale_idle_timeout,
                           "on": "client", "allow_from": None}
    out.update({k: v for k, v in table.items() if v is not None})
    if args.app is not None and args.factory is None:
        out["factory"] = False  # the table's factory goes with the table's app
    out.update({k: v for k, v in flags.items() if v is not None})
    if out["on"] == "head" and out["host"] not in (None, "127.0.0.1"):
        raise ConfigError(f"--host {out['host']} with --on head: the head node's router listens on that node's "
                          f"private address, so there is no address of this machine to choose. Drop --host "
                          f"(and `host` of [pools.{args.name}.serve]), or serve with --on client.")
    if out["allow_from"] and out["on"] != "head":
        raise ConfigError(f"--allow-from {' '.join(out['allow_from'])}: it opens the port of a router on the "
                          f"head node to those addresses; this machine's router (--on client) listens where "
                          f"--host says. Add --on head and a fixed --port, or drop --allow-from.")
    out["host"] = out["host"] or "127.0.0.1"
    if float(out["idle_timeout"]) <= 0:
        raise ConfigError(f"--idle-timeout {out['idle_timeout']}: the seconds with no request before an "
                          f"elastic pool shrinks must be > 0 (e.g. --idle-timeout 300).")
    app = out.get("app")
    if not app:
        raise ConfigError(
            f"skyward serve {args.name}: no app to serve. Name it: `skyward serve {args.name} module:app`, "
            f"or set it in skyward.toml:\n  [pools.{args.name}.serve]\n  app = \"module:app\"")
    module, _, attr = str(app).partition(":")
    if not module or not attr or " " in app:
        raise ConfigError(f"app {app!r} is not an import string: write it as 'module:attribute' "
                          f"(e.g. 'myapp:app', 'pkg.api:make_app' with --factory).")
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if args.update:
        return _update(args, settings)
    return _serve(args, settings)


def _update(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from ..records import audit
    from . import serving

    app = settings["app"]
    err(f"asking the `skyward serve {args.name}` process to roll to {app!r}, one replica at a time")
    result = serving.request_update(args.name, app, bool(settings["factory"]), audit.who())
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif result.get("ok"):
        print(f"pool {args.name!r} now serves {app!r}: {result.get('ready')} replica(s) ready, rolled in "
              f"{float(result.get('seconds') or 0):.1f} s at {result.get('url')}")
    else:
        err(f"error: the update of pool {args.name!r} to {app!r} failed: {result.get('error')}")
    return EXIT_OK if result.get("ok") else EXIT_FAILED


class _Stop(KeyboardInterrupt):
    """SIGTERM: stop serving as Ctrl-C does."""


def _serve(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from ..records import audit
    from ..spec import Options
    from . import serving
    from .pools import attach, get, status_of

    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # as uvicorn does: `skyward serve NAME app:app` from the app's folder
    record = get(args.name)
    st = status_of(record)
    if st.gone or st.state == "provisioning":
        raise ServeError(f"pool {args.name!r} is {st.state}: there is nothing to serve from. `skyward ls` "
                         f"shows the pools that run; `skyward up {args.name}` starts it.")
    app = settings["app"]
    previous = signal.signal(signal.SIGTERM, _on_term)
    _log_to_stderr()
    try:
        with serving.hold(args.name):
            options = Options(console="silent", logging=False, autoscale_idle_timeout=float(settings["idle_timeout"]))
            pool = attach(record, options, why="skyward serve")
            unsubscribe = pool.subscribe(_say_wakes(args.name))
            try:
                _check_slots(args.name, pool, settings)
                endpoint = pool.serve(app, factory=bool(settings["factory"]), host=settings["host"],
                                      port=settings["port"], replicas_per_node=settings["replicas_per_node"],
                                      ready=settings["ready"], timeout=float(settings["timeout"]),
                                      auth=not args.no_auth, on=settings["on"],
                                      allow_from=settings["allow_from"] or None)
                current = {"app": app}  # the app served now (updates change it)
                try:
                    audit.append(args.name, "served", record.get("id", ""), url=endpoint.url, app=app)
                    _announce(args, pool, endpoint, app)
                    return _loop(args, pool, endpoint, current, record.get("id", ""))
                finally:
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the close short
                    endpoint.close()
                    audit.append(args.name, "serve stopped", record.get("id", ""), url=endpoint.url,
                                 app=current["app"], requests=endpoint.stats().total)
            finally:
                unsubscribe()
                pool.close()  # detaches: the pool stays up
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_slots(name: str, pool: Pool, settings: dict[str, Any]) -> None:
    """Each replica holds a task slot of its node, and the head's router one more: said in the
    command's terms (pool.serve says it in a program's)."""
    from ..serve.endpoint import slots_needed

    need = slots_needed(int(settings["replicas_per_node"]), settings["on"])
    if need > pool.worker.slots:
        router = " and the head node's router (--on head) one more" if settings["on"] == "head" else ""
        raise ConfigError(
            f"skyward serve {name}: each replica holds one task slot of its node{router}, so a node needs "
            f"{need}, and pool {name!r} runs {pool.worker.slots} task(s) at once per node. Make the pool with "
            f"more: `concurrency = {need}` in [pools.{name}.worker] of skyward.toml, then `skyward down {name}` "
            f"and `skyward up {name}`; or serve with fewer --replicas-per-node.")


def _say_wakes(name: str) -> Callable[[Any], None]:
    """On stderr, when a request wakes the asleep pool and when it sleeps again once idle."""
    from ..observe import events as ev

    def say(event: Any) -> None:
        if isinstance(event, ev.ClusterWoke):
            err(f"pool {name!r} woke for a request: {event.nodes} node(s) in {event.seconds:.1f} s")
        elif isinstance(event, ev.ClusterAsleep) and event.idle_seconds:
            err(f"pool {name!r} had no request for {event.idle_seconds:.0f} s: its replicas stopped and it "
                f"sleeps; the next request wakes it")

    return say


def _on_term(signum: int, frame: Any) -> None:
    raise _Stop


def _log_to_stderr() -> None:
    """The endpoint's access log and the replicas' starts and losses, on stderr as they happen."""
    from ..observe.secrets import redact

    class _Redacted(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return redact(super().format(record))

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Redacted("skyward serve: %(message)s"))
    log = logging.getLogger("skyward.serve")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _announce(args: argparse.Namespace, pool: Pool, endpoint: Endpoint, app: str) -> None:
    """The URL and the header, once, on stdout (the token is in no file: this is where it is
    given, to whoever started the command)."""
    header = "; ".join(f"{k}: {v}" for k, v in endpoint.headers.items())
    if args.json:
        print(json.dumps({"name": args.name, "url": endpoint.url, "headers": endpoint.headers, "app": app}),
              flush=True)
        return
    curl = " ".join(f"-H '{k}: {v}'" for k, v in endpoint.headers.items())
    nodes = pool.current_nodes()
    size = f"{nodes} node(s)" if nodes else "asleep: the first request wakes it"
    lines = [f"serving {app!r} from pool {args.name!r} ({size})",
             f"  url:     {endpoint.url}",
             f"  header:  {header}" if header else "  header:  (none: --no-auth, anyone who reaches the port may call)",
             f"  try:     curl {curl + ' ' if curl else ''}{endpoint.url}/",
             f"roll to another app with `skyward serve {args.name} APP --update`; Ctrl-C stops serving "
             f"(the pool stays up)."]
    print("\n".join(lines), flush=True)


def _loop(args: argparse.Namespace, pool: Pool, endpoint: Endpoint, current: dict[str, str], pool_id: str) -> int:
    """Serve until Ctrl-C/SIGTERM or the pool closes: the status file every second, update
    requests as they come (one at a time, on a thread, so that the status keeps flowing)."""
    from . import serving

    name = args.name
    last_total, last_at, rate, next_status = 0, time.monotonic(), 0.0, 0.0
    announced = False
    updating: threading.Thread | None = None
    try:
        while True:
            if not pool.is_active or endpoint not in pool.endpoints:
                err(f"pool {name!r} was closed (stopped by `skyward down`?): serving ends")
                return EXIT_FAILED
            if not announced:
                announced = _check_ready(endpoint)
            now = time.monotonic()
            if now >= next_status:
                stats = endpoint.stats()
                if now > last_at:
                    rate = max(0, stats.total - last_total) / (now - last_at)
                last_total, last_at, next_status = stats.total, now, now + _STATUS_EVERY
                replicas = endpoint.replicas
                serving.write_status(name, url=endpoint.url, app=current["app"], auth=bool(endpoint.token),
                                     replicas=len(replicas), ready=sum(r.state == "ready" for r in replicas),
                                     requests_per_s=round(rate, 2), requests=stats.total,
                                     in_flight=stats.in_flight, queued=stats.queued,
                                     updating=updating is not None and updating.is_alive())
            if updating is None or not updating.is_alive():
                requests = serving.take_requests(name)
                if requests:
                    updating = threading.Thread(target=_updates, args=(name, endpoint, requests, pool_id, current),
                                                name="skyward-serve-update", daemon=True)
                    updating.start()
            time.sleep(_TICK)
    except (KeyboardInterrupt, _Stop):
        err(f"stopping: closing the endpoint {endpoint.url}; pool {name!r} stays up")
        return EXIT_OK


def _check_ready(endpoint: Endpoint) -> bool:
    """Say once when the replicas the pool's nodes should have are ready; a first start where no
    replica could start at all ends the command (ServeError, with the node's reason)."""
    try:
        endpoint.wait_ready(timeout=0)
    except TimeoutError:
        return False
    replicas = endpoint.replicas
    if replicas:
        err(f"ready: {sum(r.state == 'ready' for r in replicas)} replica(s) take requests at {endpoint.url}")
    else:
        err(f"the pool has no node now: the first request wakes it ({endpoint.url})")
    return True


def _updates(name: str, endpoint: Endpoint, requests: list[dict[str, Any]], pool_id: str,
             current: dict[str, str]) -> None:
    from ..records import audit
    from . import serving

    for request in requests:
        app, began, before = str(request.get("app")), time.monotonic(), current["app"]
        err(f"rolling to {app!r} (asked by {request.get('who')})")
        result: dict[str, Any] = {"app": app, "url": endpoint.url}
        try:
            endpoint.update(app, factory=bool(request.get("factory")))
            current["app"] = app
            endpoint.wait_ready(timeout=5)
            result["ok"] = True
        except (ServeError, ConfigError, TimeoutError) as exc:
            result.update(ok=False, error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        except Exception as exc:  # answered, whatever it is: the requester waits for it
            result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        if not result["ok"] and current["app"] != before:
            result["error"] += f" Roll back with `skyward serve {name} {before} --update`."
        replicas = endpoint.replicas
        result.update(seconds=round(time.monotonic() - began, 2), ready=sum(r.state == "ready" for r in replicas),
                      replicas=len(replicas))
        audit.append(name, "serve updated", pool_id, url=endpoint.url, app=app, ok=result["ok"],
                     asked_by=request.get("who"), error=result.get("error"))
        err(f"rolled to {app!r}: {result['ready']} replica(s) ready" if result["ok"]
            else f"the update to {app!r} failed: {result.get('error')}")
        serving.answer(name, str(request["id"]), result)
