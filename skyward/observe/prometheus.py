"""Prometheus metrics of pools: what the events say, in the exposition format.

One :class:`PoolStats` per pool is fed with that pool's events as plain dicts (the shape the
dashboard receives them in, see ``skyward.dashboard.hook``), so the same numbers come out of
``skyward dashboard``'s ``/metrics`` and out of a program's own ``Options(metrics_port=...)``.
:class:`Collector` turns a set of them into metric families when Prometheus scrapes; nothing is
computed between scrapes beyond counting events.

A program's own ``/metrics`` (``metrics_port``) answers only ``Authorization: Bearer TOKEN``,
the token in ``SKYWARD_HOME/metrics/token`` (0600, kept from one program to the next), as the
dashboard's answers only its own token: a loopback port is open to every local user.

Names and labels are an interface (Grafana boards are built on them): add, never rename.
``pool`` is a named pool's name, or a program's pool id; ``node`` a node's index; ``function``
a task's qualified name; ``provider`` the provider's kind; ``endpoint`` an endpoint's
``HOST:PORT`` (``pool.serve``; its series come from ``EndpointStats`` events). ``prometheus_client`` is imported
only by the code that serves (the ``dashboard`` extra, or ``metrics_port``).
"""

from __future__ import annotations

import bisect
import dataclasses
import hmac
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from skyward.core.pool import Pool

log = logging.getLogger("skyward.observe.prometheus")

# Task durations: from a few ms (a round trip) to hours (a training run).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
# The sampler's own metrics get a gauge each; any other sample (Custom, Disk, Network...) is
# skyward_node_sample{metric=..., unit=...}.
NODE_GAUGES = {
    "cpu": ("skyward_node_cpu_percent", "CPU utilisation of the node, all cores (0-100)"),
    "memory": ("skyward_node_memory_percent", "memory used on the node (0-100)"),
    "gpu": ("skyward_node_gpu_percent", "GPU utilisation of the node (0-100)"),
    "gpu_memory": ("skyward_node_gpu_memory_percent", "GPU memory used on the node (0-100)"),
}
NODE_STATES = ("provisioning", "bootstrapping", "ready", "lost")
REPLICA_STATES = ("starting", "ready", "stopping")


@dataclasses.dataclass
class _Function:
    queued: int = 0  # items of open maps/gathers not sent to a node yet
    running: int = 0  # items sent and not answered
    done: int = 0
    failed: int = 0
    sent: int = 0
    received: int = 0
    buckets: list[int] = dataclasses.field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    seconds: float = 0.0
    count: int = 0


class PoolStats:
    """The counters and last samples of one pool, fed with its events as dicts."""

    def __init__(self, pool: str, provider: str = "", hourly_cost: float | None = None,
                 nodes: Iterable[dict[str, Any]] = (), started: float | None = None) -> None:
        self.pool, self.provider = pool, provider
        self.hourly_cost = hourly_cost  # per node, $/h (None: unknown)
        self.lock = threading.Lock()
        self.nodes: dict[int | str, str] = {_node({"node": n["index"], "group": n.get("group")}):
                                            "lost" if n.get("lost") else "ready" for n in nodes}
        self.functions: dict[str, _Function] = {}
        self.samples: dict[tuple[int | str, str], tuple[float, str]] = {}
        self.batches: dict[int, tuple[str, int]] = {}  # open batch -> (function, items not sent yet)
        self.running: dict[int, tuple[str, int]] = {}  # task -> (function, items)
        self.cost = 0.0
        self.cost_at = started if started is not None else time.time()
        self.ended = False
        self.endpoints: dict[str, dict[str, Any]] = {}  # endpoint label -> its last EndpointStats

    def _fn(self, name: str) -> _Function:
        found = self.functions.get(name)
        if found is None:
            found = self.functions[name] = _Function()
        return found

    def _bill(self, now: float) -> None:
        """Add what the nodes cost since the last change of their number."""
        if self.hourly_cost is not None and not self.ended:
            live = sum(1 for s in self.nodes.values() if s != "lost")
            self.cost += self.hourly_cost * live * max(0.0, now - self.cost_at) / 3600
        self.cost_at = max(self.cost_at, now)

    def apply(self, e: dict[str, Any]) -> None:
        kind = e.get("type")
        with self.lock:
            when = float(e.get("time") or time.time())
            if kind == "TaskStarted":
                name, items = str(e["name"]), int(e.get("items") or 1)
                fn = self._fn(name)
                fn.running += items
                self.running[int(e["task"])] = (name, items)
                batch = self.batches.get(e.get("batch") or -1)
                if batch is not None:
                    self.batches[int(e["batch"])] = (batch[0], max(0, batch[1] - items))
                    fn.queued = max(0, fn.queued - items)
            elif kind == "TaskCompleted":
                name, items = str(e["name"]), int(e.get("items") or 1)
                fn = self._fn(name)
                if self.running.pop(int(e["task"]), None) is not None:
                    fn.running = max(0, fn.running - items)
                if e.get("ok"):
                    fn.done += items
                else:
                    fn.failed += items
                fn.sent += int(e.get("bytes_sent") or 0)
                fn.received += int(e.get("bytes_received") or 0)
                seconds = float(e.get("seconds") or 0.0)
                fn.buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
                fn.seconds += seconds
                fn.count += 1
            elif kind == "BatchStarted":
                name, total = str(e["name"]), int(e["total"])
                self.batches[int(e["batch"])] = (name, total)
                self._fn(name).queued += total
            elif kind == "BatchFinished":
                name, left = self.batches.pop(int(e["batch"]), ("", 0))
                if name:
                    fn = self._fn(name)
                    fn.queued = max(0, fn.queued - left)
            elif kind == "EndpointStats":
                self.endpoints[endpoint_label(str(e["url"]))] = e
            elif kind == "EndpointClosed":
                last = self.endpoints.get(endpoint_label(str(e["url"])))
                if last is not None:  # the counts stay (Prometheus reads the final ones); nothing runs
                    self.endpoints[endpoint_label(str(e["url"]))] = {**last, "replicas": [], "in_flight": 0,
                                                                      "queued": 0}
            elif kind == "Metric":
                self.samples[(_node(e), str(e["name"]))] = (float(e["value"]), str(e.get("unit") or ""))
            elif kind in ("InstanceProvisioned", "BootstrapPhase", "InstanceBootstrapped", "InstanceLost",
                          "InstanceDestroyed"):
                if int(e["node"]) < 0:  # work on this machine for every node (the wheelhouse)
                    return
                node = _node(e)
                self._bill(when)
                if kind == "InstanceDestroyed":
                    self.nodes.pop(node, None)
                    self.samples = {k: v for k, v in self.samples.items() if k[0] != node}
                else:
                    self.nodes[node] = {"InstanceProvisioned": "provisioning", "BootstrapPhase": "bootstrapping",
                                        "InstanceBootstrapped": "ready", "InstanceLost": "lost"}[kind]
            elif kind == "ClusterAsleep":
                self._bill(when)
                self.nodes.clear()
                self.samples.clear()
            elif kind in ("ClusterDestroyed", "ClusterDetached"):
                self._bill(when)
                self.ended = True
                self.nodes.clear()

    def cost_so_far(self, now: float | None = None) -> float | None:
        if self.hourly_cost is None:
            return None
        with self.lock:
            self._bill(time.time() if now is None else now)
            return self.cost


def _node(e: dict[str, Any]) -> int | str:
    """A node's ``node`` label: its index, or ``group:index`` in a pool of several groups (whose
    indices repeat across groups)."""
    return f"{e['group']}:{int(e['node'])}" if e.get("group") else int(e["node"])


class _Families:
    """Metric families built for one scrape (samples of several pools go to one family)."""

    def __init__(self) -> None:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        g, c = GaugeMetricFamily, CounterMetricFamily
        self.info = g("skyward_pool_info", "1 per pool: its provider", labels=["pool", "provider"])
        self.nodes = g("skyward_pool_nodes", "nodes of the pool by state", labels=["pool", "provider", "state"])
        self.hourly = g("skyward_pool_hourly_cost_dollars", "what the pool's nodes cost per hour now, in USD",
                        labels=["pool", "provider"])
        self.cost = g("skyward_pool_cost_dollars", "what the pool has cost so far, in USD", labels=["pool", "provider"])
        fn = ["pool", "function"]
        self.queued = g("skyward_tasks_queued", "items of maps and gathers not sent to a node yet", labels=fn)
        self.running = g("skyward_tasks_running", "items sent to a node and not answered yet", labels=fn)
        self.done = c("skyward_tasks_done", "items that completed successfully", labels=fn)
        self.failed = c("skyward_tasks_failed", "items that failed (raised, timed out, or their node was lost)",
                        labels=fn)
        self.sent = c("skyward_task_sent_bytes", "bytes of task payloads sent to the nodes", labels=fn)
        self.received = c("skyward_task_received_bytes", "bytes of results received from the nodes", labels=fn)
        self.duration = HistogramMetricFamily(
            "skyward_task_duration_seconds", "from dispatch to result, per task (a map sends chunks of items)",
            labels=fn)
        node = ["pool", "node"]
        self.gauges = {name: g(metric, text, labels=node) for name, (metric, text) in NODE_GAUGES.items()}
        self.sample = g("skyward_node_sample", "any other sample the node's metrics sampler takes",
                        labels=["pool", "node", "metric", "unit"])
        ep = ["pool", "endpoint"]
        self.requests = c("skyward_endpoint_requests", "requests an endpoint (pool.serve) answered, by status",
                          labels=[*ep, "status"])
        self.latency = HistogramMetricFamily(
            "skyward_endpoint_request_duration_seconds",
            "from a request's arrival at the endpoint to its last byte (queueing and cold starts included)",
            labels=ep)
        self.in_flight = g("skyward_endpoint_in_flight", "requests a replica is answering now", labels=ep)
        self.waiting = g("skyward_endpoint_queued", "requests waiting for a free replica", labels=ep)
        self.cold = c("skyward_endpoint_cold_starts", "requests that came when no replica was ready "
                      "(an asleep pool woke for them, or every replica was lost)", labels=ep)
        self.replicas = g("skyward_endpoint_replicas", "the endpoint's replicas by state", labels=[*ep, "state"])

    def add_pool(self, pool: str, provider: str, nodes: dict[str, int], hourly: float | None,
                 cost: float | None) -> None:
        self.info.add_metric([pool, provider], 1)
        for state in NODE_STATES:
            self.nodes.add_metric([pool, provider, state], nodes.get(state, 0))
        if hourly is not None:
            self.hourly.add_metric([pool, provider], hourly)
        if cost is not None:
            self.cost.add_metric([pool, provider], cost)

    def add_stats(self, stats: list[PoolStats], pool: str) -> None:
        """The work of ``stats`` (one pool, maybe from several programs), summed."""
        merged: dict[str, _Function] = {}
        samples: dict[tuple[int | str, str], tuple[float, str]] = {}
        for s in stats:
            with s.lock:
                for name, fn in s.functions.items():
                    m = merged.setdefault(name, _Function())
                    for f in ("queued", "running", "done", "failed", "sent", "received", "seconds", "count"):
                        setattr(m, f, getattr(m, f) + getattr(fn, f))
                    m.buckets = [a + b for a, b in zip(m.buckets, fn.buckets, strict=True)]
                samples.update(s.samples)
        for name, fn in sorted(merged.items()):
            labels = [pool, name]
            self.queued.add_metric(labels, fn.queued)
            self.running.add_metric(labels, fn.running)
            self.done.add_metric(labels, fn.done)
            self.failed.add_metric(labels, fn.failed)
            self.sent.add_metric(labels, fn.sent)
            self.received.add_metric(labels, fn.received)
            cumulative, out = 0, []
            for bound, n in zip((*map(str, BUCKETS), "+Inf"), fn.buckets, strict=True):
                cumulative += n
                out.append((bound, cumulative))
            self.duration.add_metric(labels, out, fn.seconds)
        for (node, name), (value, unit) in sorted(samples.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            gauge = self.gauges.get(name)
            if gauge is not None:
                gauge.add_metric([pool, str(node)], value)
            else:
                self.sample.add_metric([pool, str(node), name, unit], value)
        endpoints: dict[str, dict[str, Any]] = {}
        for s in stats:
            with s.lock:
                endpoints.update(s.endpoints)
        for label, e in sorted(endpoints.items()):
            self.add_endpoint(pool, label, e)

    def add_endpoint(self, pool: str, label: str, e: dict[str, Any]) -> None:
        labels = [pool, label]
        for status, n in e.get("statuses") or ():
            self.requests.add_metric([*labels, str(status)], int(n))
        buckets = [(_bound(float(b)), int(n)) for b, n in e.get("latency_buckets") or ()]
        if not buckets or buckets[-1][0] != "+Inf":
            buckets.append(("+Inf", int(e.get("total") or 0)))
        self.latency.add_metric(labels, buckets, float(e.get("latency_sum") or 0.0))
        self.in_flight.add_metric(labels, int(e.get("in_flight") or 0))
        self.waiting.add_metric(labels, int(e.get("queued") or 0))
        self.cold.add_metric(labels, int(e.get("cold_waits") or 0))
        states: dict[str, int] = dict.fromkeys(REPLICA_STATES, 0)
        for _key, _node, state in e.get("replicas") or ():
            states[str(state)] = states.get(str(state), 0) + 1
        for state, n in states.items():
            self.replicas.add_metric([*labels, state], n)

    def __iter__(self) -> Iterator[Any]:
        yield from (self.info, self.nodes, self.hourly, self.cost, self.queued, self.running, self.done,
                    self.failed, self.sent, self.received, self.duration, *self.gauges.values(), self.sample,
                    self.requests, self.latency, self.in_flight, self.waiting, self.cold, self.replicas)


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else str(value)


def endpoint_label(url: str) -> str:
    """An endpoint's ``endpoint`` label: its ``HOST:PORT`` (unique on the machine that serves it)."""
    return urlsplit(url).netloc or url


def families(stats: Iterable[PoolStats], others: Iterable[dict[str, Any]] = ()) -> list[Any]:
    """The families for ``stats`` (pools whose events this process sees) and ``others``: pools
    known only by a summary (``pool``, ``provider``, ``nodes`` as {state: n}, ``hourly_cost``,
    ``cost_so_far``), named pools no program of this machine uses now."""
    out = _Families()
    by_pool: dict[str, list[PoolStats]] = {}
    for s in stats:
        by_pool.setdefault(s.pool, []).append(s)
    for pool, group in sorted(by_pool.items()):
        states: dict[str, int] = {}
        hourly = cost = None
        for s in group:
            with s.lock:
                for state in s.nodes.values():
                    states[state] = states.get(state, 0) + 1
            so_far = s.cost_so_far()
            if so_far is not None:
                cost = (cost or 0.0) + so_far
            if s.hourly_cost is not None and not s.ended:
                hourly = (hourly or 0.0) + s.hourly_cost * sum(1 for v in s.nodes.values() if v != "lost")
        out.add_pool(pool, group[0].provider, states, hourly, cost)
        out.add_stats(group, pool)
    for row in others:
        if row["pool"] in by_pool:
            continue
        out.add_pool(row["pool"], row.get("provider") or "", row.get("nodes") or {}, row.get("hourly_cost"),
                     row.get("cost_so_far"))
    return list(out)


class Collector:
    """A ``prometheus_client`` collector over ``source()``: (stats, summaries) at scrape time."""

    def __init__(self, source: Callable[[], tuple[Iterable[PoolStats], Iterable[dict[str, Any]]]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        stats, others = self.source()
        yield from families(stats, others)

    def describe(self) -> list[Any]:
        return []  # unchecked collector: families vary with the pools


def registry(source: Callable[[], tuple[Iterable[PoolStats], Iterable[dict[str, Any]]]]) -> Any:
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Collector(source))
    return reg


def render(reg: Any) -> tuple[bytes, str]:
    """The exposition text of ``reg`` and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(reg), CONTENT_TYPE_LATEST


def as_dict(event: Any) -> dict[str, Any]:
    """An event as the dashboard receives it: its fields and ``type``."""
    out = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    out["type"] = type(event).__name__
    return out


# -- a program's own endpoint: Options(metrics_port=...) ------------------------------------------
def pool_label(name: str | None, pool_id: str) -> str:
    return name or pool_id


def parse_address(value: int | str) -> tuple[str, int]:
    """``metrics_port``: a port (on loopback) or ``"HOST:PORT"``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return "127.0.0.1", value
    host, _, port = str(value).rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def metrics_token_file() -> Path:
    """``SKYWARD_HOME/metrics/token``: the bearer token of ``Options(metrics_port=...)``,
    made (0600) the first time a program serves its metrics, and kept: a scrape config that
    reads it (``credentials_file``) goes on working from one program to the next."""
    from skyward.paths import skyward_home

    return skyward_home() / "metrics" / "token"


def metrics_token() -> str:
    """The token ``/metrics`` of ``Options(metrics_port=...)`` wants (``Authorization: Bearer
    TOKEN``); made on first use (see ``metrics_token_file``)."""
    path = metrics_token_file()
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        return token
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".token.", dir=path.parent)  # 0600
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    try:
        os.link(tmp, path)  # the first program to get here makes it; the others read that one
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return path.read_text().strip()


def _server(address: tuple[str, int], reg: Any, token: str) -> Any:
    """An HTTP server of ``reg`` on ``address`` that answers only ``Authorization: Bearer TOKEN``
    (every local user can reach a loopback port)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # seconds a connection may take to say what it wants

        def do_GET(self) -> None:
            scheme, _, given = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
                self._send(401, b"skyward: /metrics needs `Authorization: Bearer TOKEN`; the token is in "
                                b"SKYWARD_HOME/metrics/token (docs/guides/observability.md)\n",
                           "text/plain; charset=utf-8", {"WWW-Authenticate": "Bearer"})
                return
            if urlsplit(self.path).path not in ("/", "/metrics"):
                self._send(404, b"skyward: the metrics are at /metrics\n", "text/plain; charset=utf-8")
                return
            body, content_type = render(reg)
            self._send(200, body, content_type)

        def _send(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in {"Content-Type": content_type, "Content-Length": str(len(body)),
                               "Cache-Control": "no-store", **(extra or {})}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET

    server = Server(address, Handler)
    thread = threading.Thread(target=server.serve_forever, name="skyward-metrics", daemon=True)
    thread.start()
    return server, thread


class _Exporter:
    """This process's /metrics server: one per process, whatever number of pools it opens."""

    def __init__(self) -> None:
        self.stats: dict[str, PoolStats] = {}
        self.servers: dict[tuple[str, int], Any] = {}
        self.lock = threading.Lock()
        self.registry = registry(lambda: (list(self.stats.values()), ()))

    def serve(self, address: tuple[str, int]) -> None:
        with self.lock:
            if address in self.servers:
                return
            try:
                token = metrics_token()
                self.servers[address] = _server(address, self.registry, token)
            except OSError as exc:
                from skyward.errors import ConfigError

                raise ConfigError(
                    f"Options(metrics_port={address[0]}:{address[1]}): cannot listen there ({exc}). Pick a "
                    f"free port, or 0 for any (metrics_address() says which)."
                ) from None

    def address(self) -> tuple[str, int] | None:
        for server, _thread in self.servers.values():
            host, port = server.server_address[:2]
            return str(host), int(port)
        return None


_exporter: _Exporter | None = None


def expose(pool: Pool, value: int | str) -> None:
    """Serve ``pool``'s metrics on ``value`` (see ``parse_address``) from now until this process
    ends; the pool's series stay after it closes (Prometheus reads the final counts)."""
    global _exporter
    try:
        address = parse_address(value)
    except ValueError:
        from skyward.errors import ConfigError

        raise ConfigError(f"Options(metrics_port={value!r}) is not valid: give a port (int) or 'HOST:PORT'.") from None
    if _exporter is None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            from skyward.errors import ConfigError

            raise ConfigError(f"Options(metrics_port={value!r}) needs prometheus-client: "
                              f"pip install 'skyward[prometheus]' (or the dashboard extra).") from None
        _exporter = _Exporter()
    exporter = _exporter
    from skyward.observe.events import bus

    spec = pool.spec
    try:
        hourly = spec.provider.hourly_cost(spec)
    except Exception:  # a price lookup must not stop the pool
        hourly = None
    provider = getattr(spec.provider, "kind", type(spec.provider).__name__)
    stats = PoolStats(pool_label(pool.name, pool.id), str(provider), hourly)
    exporter.stats[pool.id] = stats
    bus.subscribe(lambda e: stats.apply(as_dict(e)), pool.id)
    exporter.serve(address)


def metrics_address() -> tuple[str, int] | None:
    """Where this process serves ``/metrics`` (``Options(metrics_port=...)``), or None."""
    return None if _exporter is None else _exporter.address()
