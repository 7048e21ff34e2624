"""Live data of a named pool that no program is using: the dashboard listens to its agents.

Every agent sends its metric samples and its output to each connection it has. While a page
of a named pool is open and no program that uses the pool has registered, the dashboard opens
one connection per node, sends nothing on it (no task, no ping), and turns what arrives into
the same events a program would post. Opening the connection renews the agents' lease once;
an open connection that sends nothing does not renew it again, so a watched pool still stops
when its ttl passes with no client.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward.errors import SkywardError
from skyward.named import pools as named

log = logging.getLogger("skyward.dashboard")

OnEvent = Callable[[dict[str, Any]], None]


class NodeWatch:
    """Passive connections to the agents of named pool ``name``."""

    def __init__(self, name: str, on_event: OnEvent) -> None:
        self.name = name
        self.pool_id = f"watch-{name}"
        self.on_event = on_event
        self.channels: list[Any] = []
        self.cluster: Any = None
        self.error: str | None = None
        self._closed = threading.Event()

    def info(self, record: dict[str, Any]) -> dict[str, Any]:
        """The snapshot a LivePool starts from (as a program would send it)."""
        nodes = (record.get("cluster") or {}).get("nodes", [])
        return {"id": self.pool_id, "name": self.name, "provider": record.get("provider"), "owned": False,
                "pid": None, "program": "skyward dashboard", "started": time.time(),
                "nodes": [{"index": n["index"], "hostname": n.get("hostname"), "private_ip": n.get("private_ip"),
                           "lost": False} for n in nodes],
                "desired": len(nodes), "hourly_cost": record.get("hourly_cost"), "ttl": record.get("ttl")}

    def start(self) -> None:
        threading.Thread(target=self._connect, name=f"skyward-watch-{self.name}", daemon=True).start()

    def _connect(self) -> None:
        from skyward.bootstrap.channel import NodeChannel

        try:
            record = named.get(self.name)
            description = record["cluster"]
            cluster = named.provider_from(record["config"]).attach(description)
            endpoints = cluster.start(len(description["nodes"]))
        except (SkywardError, KeyError, TypeError, OSError) as exc:
            self.error = str(exc)
            return
        self.cluster = cluster
        for endpoint in endpoints:
            if self._closed.is_set():
                break
            try:
                self.channels.append(NodeChannel(
                    endpoint.connect, node=endpoint.index, token=cluster.token,
                    ttl=float(record.get("ttl", 600)), on_output=self._output, on_metric=self._metric,
                    agent_id=endpoint.agent_id,
                ))
            except (OSError, SkywardError) as exc:
                log.debug("watching node %d of %s: %s", endpoint.index, self.name, exc)
        if self._closed.is_set():
            self._disconnect()

    def _metric(self, node: int, samples: list[dict[str, Any]]) -> None:
        now = time.time()
        for sample in samples:
            self.on_event({"type": "Metric", "pool": self.pool_id, "time": now, "node": node,
                           "name": sample["name"], "value": float(sample["value"]), "unit": sample.get("unit", "")})

    def _output(self, node: int, task: int, stream: int, data: bytes) -> None:
        from skyward.observe import secrets

        self.on_event({"type": "Log", "pool": self.pool_id, "time": time.time(), "node": node,
                       "level": "stderr" if stream == 2 else "stdout",
                       "message": secrets.redact(data.decode("utf-8", "replace"))})

    def stop(self) -> None:
        self._closed.set()
        threading.Thread(target=self._disconnect, daemon=True).start()

    def _disconnect(self) -> None:
        channels, self.channels = self.channels, []
        for ch in channels:
            with contextlib.suppress(Exception):
                ch.close(shutdown_agent=False)
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.detach()
