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


class LivePool:
    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.id = str(info["id"])
        self.name: str | None = info.get("name")
        self.nodes: dict[int, dict[str, Any]] = {int(n["index"]): dict(n) for n in info.get("nodes", [])}
        self.metrics: dict[int, dict[str, deque[tuple[float, float]]]] = {}
        self.units: dict[str, str] = {}
        self.running: dict[int, dict[str, Any]] = {}
        self.finished: deque[dict[str, Any]] = deque(maxlen=FINISHED)
        self.batches: dict[int, dict[str, Any]] = {}
        self.lines: dict[int, deque[str]] = {}
        self.errors: deque[dict[str, Any]] = deque(maxlen=50)
        self.tasks_done = self.tasks_failed = 0
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
        node = int(e["node"])
        series = self.metrics.setdefault(node, {}).setdefault(str(e["name"]), deque(maxlen=SERIES))
        series.append((float(e["time"]), float(e["value"])))
        self.units[str(e["name"])] = str(e.get("unit", ""))

    def _on_TaskStarted(self, e: dict[str, Any]) -> None:
        self.running[int(e["task"])] = {k: e.get(k) for k in ("task", "name", "node", "items", "batch", "time")}

    def _on_TaskCompleted(self, e: dict[str, Any]) -> None:
        self.running.pop(int(e["task"]), None)
        row = {k: e.get(k) for k in ("task", "name", "node", "items", "batch", "seconds", "ok", "time")}
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
        out = self.lines.setdefault(int(node), deque(maxlen=LINES))
        for line in str(e.get("message", "")).splitlines():
            out.append(line)

    def _on_Error(self, e: dict[str, Any]) -> None:
        self.errors.appendleft({"time": e.get("time"), "message": e.get("message"), "node": e.get("node")})

    def _on_InstanceProvisioned(self, e: dict[str, Any]) -> None:
        self.nodes[int(e["node"])] = {"index": e["node"], "hostname": e.get("hostname"),
                                      "private_ip": e.get("private_ip"), "lost": False}

    def _on_InstanceLost(self, e: dict[str, Any]) -> None:
        node = self.nodes.get(int(e["node"]))
        if node is not None:
            node["lost"] = True

    def _on_InstanceDestroyed(self, e: dict[str, Any]) -> None:
        self.nodes.pop(int(e["node"]), None)

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
            "hosts": [self.nodes[i] for i in sorted(self.nodes)],
            "metrics": {str(node): {name: list(series)[-points:] for name, series in by_name.items()}
                        for node, by_name in sorted(self.metrics.items())},
            "units": dict(self.units),
            "running": sorted(self.running.values(), key=lambda t: t["task"]),
            "finished": list(self.finished),
            "batches": [self.batches[b] for b in sorted(self.batches, reverse=True)],
            "output": {str(n): list(lines) for n, lines in sorted(self.lines.items())},
            "errors": list(self.errors),
        }
