"""What the dashboard keeps of the pools that running programs registered (see ``hook``).

One :class:`LivePool` per registered pool, fed with that program's events: node metrics as
short time series, running and finished tasks, each map/gather's progress, the nodes' output
and errors. Plain Python, no server types: the API serves :meth:`LivePool.view`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

SERIES = 900  # samples kept per node and metric (15 minutes at one per second)
FINISHED = 200  # finished tasks kept
LINES = 300  # output lines kept per node
BATCHES = 50  # maps/gathers kept
RATE_WINDOW = 10.0  # seconds an endpoint's requests/s is measured over


Key = int | str  # a node: its index, or "group:index" in a pool of several groups


def node_key(e: dict[str, Any]) -> Key:
    """The node an event (or a described node) is about: its provider index, which repeats
    across the groups of a pool of several groups, so there it is ``"group:index"``."""
    index = int(e["node"] if "node" in e else e["index"])
    group = e.get("group")
    return f"{group}:{index}" if group else index


class LivePool:
    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.id = str(info["id"])
        self.name: str | None = info.get("name")
        self.nodes: dict[Key, dict[str, Any]] = {node_key(n): {**n, "key": node_key(n)} for n in info.get("nodes", [])}
        self.metrics: dict[Key, dict[str, deque[tuple[float, float]]]] = {}
        self.units: dict[str, str] = {}
        self.running: dict[int, dict[str, Any]] = {}
        self.finished: deque[dict[str, Any]] = deque(maxlen=FINISHED)
        self.batches: dict[int, dict[str, Any]] = {}
        self.lines: dict[Key, deque[str]] = {}
        self.errors: deque[dict[str, Any]] = deque(maxlen=50)
        self.tasks_done = self.tasks_failed = 0
        self.endpoints: dict[str, dict[str, Any]] = {}  # url -> its last EndpointStats (and "closed")
        self.endpoint_totals: dict[str, deque[tuple[float, int]]] = {}  # url -> (time, requests) of each
        self.ended: float | None = None
        self.updated = time.time()

    @property
    def ref(self) -> str:
        return f"@{self.id}"

    def alive(self) -> bool:
        """The program is still running (pools of this machine only; others count as alive)."""
        if self.ended is not None:
            return False
        if self.info.get("pid") is None:  # the dashboard's own listening (watch.py)
            return True
        try:
            os.kill(int(self.info.get("pid", 0)), 0)
        except (OSError, ValueError):
            return False
        return True

    # -- events ------------------------------------------------------------------------------
    def apply(self, e: dict[str, Any]) -> None:
        kind = e.get("type")
        self.updated = time.time()
        handler = getattr(self, f"_on_{kind}", None)
        if handler is not None:
            handler(e)

    def _on_Metric(self, e: dict[str, Any]) -> None:
        node = node_key(e)
        series = self.metrics.setdefault(node, {}).setdefault(str(e["name"]), deque(maxlen=SERIES))
        series.append((float(e["time"]), float(e["value"])))
        self.units[str(e["name"])] = str(e.get("unit", ""))

    def _on_TaskStarted(self, e: dict[str, Any]) -> None:
        self.running[int(e["task"])] = {k: e.get(k) for k in ("task", "name", "node", "group", "items", "batch", "time")}

    def _on_TaskCompleted(self, e: dict[str, Any]) -> None:
        self.running.pop(int(e["task"]), None)
        row = {k: e.get(k) for k in ("task", "name", "node", "group", "items", "batch", "seconds", "ok", "time")}
        self.finished.appendleft(row)
        if e.get("ok"):
            self.tasks_done += 1
        else:
            self.tasks_failed += 1
        batch = self.batches.get(e.get("batch") or -1)
        if batch is not None:
            batch["done" if e.get("ok") else "failed"] += int(e.get("items") or 1)

    def _on_BatchStarted(self, e: dict[str, Any]) -> None:
        self.batches[int(e["batch"])] = {
            "batch": e["batch"], "kind": e.get("kind"), "name": e.get("name"), "total": int(e["total"]),
            "done": 0, "failed": 0, "started": e.get("time"), "finished": None, "ok": None,
        }
        while len(self.batches) > BATCHES:
            self.batches.pop(min(self.batches))

    def _on_BatchFinished(self, e: dict[str, Any]) -> None:
        batch = self.batches.get(int(e["batch"]))
        if batch is None:
            return
        batch.update(done=int(e["done"]), finished=e.get("time"), ok=bool(e.get("ok")),
                     failed=int(e["total"]) - int(e["done"]), seconds=e.get("seconds"))

    def _on_Log(self, e: dict[str, Any]) -> None:
        node = e.get("node")
        if node is None:
            return
        out = self.lines.setdefault(node_key(e), deque(maxlen=LINES))
        for line in str(e.get("message", "")).splitlines():
            out.append(line)

    def _on_Error(self, e: dict[str, Any]) -> None:
        self.errors.appendleft({"time": e.get("time"), "message": e.get("message"), "node": e.get("node")})

    def _on_EndpointStats(self, e: dict[str, Any]) -> None:
        url = str(e["url"])
        self.endpoints[url] = {**e, "closed": False}
        totals = self.endpoint_totals.setdefault(url, deque(maxlen=SERIES))
        totals.append((float(e.get("time") or time.time()), int(e.get("total") or 0)))

    def _on_EndpointClosed(self, e: dict[str, Any]) -> None:
        last = self.endpoints.get(str(e["url"]))
        if last is not None:
            last.update(closed=True, replicas=[], in_flight=0, queued=0)

    def _on_InstanceProvisioned(self, e: dict[str, Any]) -> None:
        self.nodes[node_key(e)] = {"index": e["node"], "hostname": e.get("hostname"), "key": node_key(e),
                                   "group": e.get("group"), "private_ip": e.get("private_ip"), "lost": False}

    def _on_InstanceLost(self, e: dict[str, Any]) -> None:
        node = self.nodes.get(node_key(e))
        if node is not None:
            node["lost"] = True

    def _on_InstanceDestroyed(self, e: dict[str, Any]) -> None:
        self.nodes.pop(node_key(e), None)

    def _on_ClusterDestroyed(self, e: dict[str, Any]) -> None:
        self.ended = float(e.get("time") or time.time())

    _on_ClusterDetached = _on_ClusterDestroyed

    # -- views -------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        now = time.time()
        info = self.info
        cost = info.get("hourly_cost")
        nodes = len(self.nodes)
        total = None if cost is None else round(float(cost) * nodes, 4)
        started = float(info.get("started") or now)
        end = self.ended or now
        return {
            "ref": self.ref,
            "id": self.id,
            "name": self.name,
            "kind": "program",
            "program": info.get("program"),
            "pid": info.get("pid"),
            "provider": info.get("provider"),
            "state": "running" if self.alive() else "ended",
            "nodes": nodes,
            "desired": info.get("desired"),
            "accelerator": info.get("accelerator"),
            "ttl": info.get("ttl"),
            "created": started,
            "age_seconds": round(now - started, 1),
            "expires": None,
            "hourly_cost": total,
            "cost_so_far": None if total is None else round(total * (end - started) / 3600, 6),
            "tasks_running": len(self.running),
            "tasks_done": self.tasks_done,
            "tasks_failed": self.tasks_failed,
        }

    def view(self, points: int = SERIES) -> dict[str, Any]:
        return {
            **self.summary(),
            "hosts": [self.nodes[i] for i in sorted(self.nodes, key=str)],
            "metrics": {str(node): {name: list(series)[-points:] for name, series in by_name.items()}
                        for node, by_name in sorted(self.metrics.items(), key=lambda kv: str(kv[0]))},
            "units": dict(self.units),
            "running": sorted(self.running.values(), key=lambda t: t["task"]),
            "finished": list(self.finished),
            "batches": [self.batches[b] for b in sorted(self.batches, reverse=True)],
            "output": {str(n): list(lines) for n, lines in sorted(self.lines.items(), key=lambda kv: str(kv[0]))},
            "errors": list(self.errors),
            "endpoints": [self.endpoint_view(url) for url in sorted(self.endpoints)],
        }

    def endpoint_view(self, url: str, now: float | None = None) -> dict[str, Any]:
        """An endpoint as the pool page shows it: its replicas, requests/s over the last
        ``RATE_WINDOW`` seconds, p50/p99 latency and errors since it opened."""
        e = self.endpoints[url]
        now = time.time() if now is None else now
        statuses = {int(status): int(n) for status, n in e.get("statuses") or ()}
        buckets = [(float(b), int(n)) for b, n in e.get("latency_buckets") or ()]
        total = int(e.get("total") or 0)
        before = 0  # requests counted at the window's start (0: the endpoint opened in it)
        for when, count in self.endpoint_totals.get(url, ()):
            if when <= now - RATE_WINDOW:
                before = count
        return {
            "url": url,
            "closed": bool(e.get("closed")),
            "replicas": [{"key": key, "node": node, "state": state} for key, node, state in e.get("replicas") or ()],
            "requests": total,
            "requests_per_second": 0.0 if e.get("closed") else round(max(0, total - before) / RATE_WINDOW, 2),
            "in_flight": int(e.get("in_flight") or 0),
            "queued": int(e.get("queued") or 0),
            "cold_starts": int(e.get("cold_waits") or 0),
            "p50_seconds": quantile(buckets, 0.5),
            "p99_seconds": quantile(buckets, 0.99),
            "errors": sum(n for status, n in statuses.items() if status >= 500),
            "client_errors": sum(n for status, n in statuses.items() if 400 <= status < 500),
            "statuses": {str(status): n for status, n in sorted(statuses.items())},
        }


def quantile(buckets: list[tuple[float, int]], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram ((upper bound, count), ..., (inf, total)),
    interpolated inside its bucket as Prometheus' ``histogram_quantile`` does; None when empty.
    A quantile in the last (unbounded) bucket is that of the highest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower
