"""Named pools that sleep at zero nodes: ``nodes = [0, N]`` in skyward.toml, ``skyward up NAME
--nodes 0:N``.

Such a pool keeps its registry record with no node while it sleeps: ``pools.status_of`` calls
it ``asleep`` (0 of N nodes) and, like any named pool, it expires ``ttl`` seconds after its last
program left. A program attached to it wakes it on its first task (the pool object does that,
skyward.core.membership); its autoscaler puts it back to sleep after
``Options.autoscale_idle_timeout`` seconds idle, and the last program to leave puts it to sleep
at once (no program is left to run the autoscaler, and idle nodes would cost money until their
ttl). The registry and the audit trail follow through ``pools._Recorder``, which counts what
each wake cost with a ``Meter``.

This module reads records and the trail; it starts and stops nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..records import audit
from .groupviews import group_views


def node_range(config: dict[str, Any]) -> tuple[int, int | None]:
    """(desired, max) of a pool's ``nodes`` setting (validated TOML data)."""
    raw = config.get("nodes", 1)
    if isinstance(raw, list):
        return int(raw[0]), int(raw[1])
    if isinstance(raw, dict):
        ceiling = raw.get("max")
        return int(raw["desired"]), None if ceiling is None else int(ceiling)
    return int(raw), None


def _parts(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each group's view of the record (its ``config`` and ``cluster``): the record itself for a
    pool of one spec."""
    return list(group_views(record).values())


def may_sleep(record: dict[str, Any]) -> bool:
    """Whether the pool sleeps with no node when idle (``desired`` 0, a ``max``): a pool of
    groups sleeps as a whole when each of its groups does."""
    for part in _parts(record):
        desired, top = node_range(part.get("config") or {})
        if desired != 0 or not top:
            return False
    return True


def ceiling(record: dict[str, Any]) -> int | None:
    """How many nodes the pool may grow to, all its groups together (None: one is not elastic)."""
    tops = [node_range(part.get("config") or {})[1] for part in _parts(record)]
    return None if any(t is None for t in tops) else sum(t for t in tops if t is not None)


def is_asleep(record: dict[str, Any]) -> bool:
    """A pool that may sleep, started, with no node now (in none of its groups)."""
    if not may_sleep(record):
        return False
    clusters = [part.get("cluster") for part in _parts(record)]
    return all(isinstance(c, dict) and not c.get("nodes") for c in clusters)


def node_total(record: dict[str, Any]) -> int:
    """The nodes the record describes now, all its groups together."""
    return sum(len((part.get("cluster") or {}).get("nodes") or []) for part in _parts(record))


def cost(record: dict[str, Any], node_seconds: float) -> float | None:
    """USD for ``node_seconds`` at the record's price per node-hour (None: price unknown)."""
    price = record.get("hourly_cost")
    return None if price is None else round(float(price) * node_seconds / 3600, 6)


@dataclass
class Meter:
    """Node-seconds while the pool is awake, counted from the node counts the recorder sees."""

    nodes: int
    at: float
    node_seconds: float = 0.0
    woke_at: float | None = None

    def count(self, nodes: int, now: float) -> None:
        """The pool has ``nodes`` nodes from ``now`` on."""
        self.node_seconds += self.nodes * max(0.0, now - self.at)
        if self.nodes == 0 and nodes > 0:
            self.woke_at = now
        self.nodes, self.at = nodes, now

    def slept(self, now: float) -> tuple[float, float]:
        """The pool fell asleep at ``now``: (seconds awake, node-seconds) since it woke; resets."""
        self.count(0, now)
        awake = 0.0 if self.woke_at is None else now - self.woke_at
        used, self.node_seconds, self.woke_at = self.node_seconds, 0.0, None
        return awake, used


def wakes(name: str) -> list[dict[str, Any]]:
    """Each wake of pool ``name`` from its audit trail, oldest first: when it woke, how long that
    took, how many nodes, and once it slept again how long it was awake and what that cost."""
    out: list[dict[str, Any]] = []
    for entry in audit.read(name):
        if entry.get("event") == "woke":
            out.append({"at": entry.get("time"), "seconds": entry.get("seconds"), "nodes": entry.get("nodes"),
                        "hourly_cost": entry.get("hourly_cost"), "awake_seconds": None, "cost": None})
        elif entry.get("event") == "asleep" and out and out[-1]["awake_seconds"] is None:
            out[-1].update(awake_seconds=entry.get("awake_seconds"), cost=entry.get("cost"))
    return out


def spent(record: dict[str, Any], now: float) -> float | None:
    """What a pool that sleeps at zero cost so far: its finished wakes, and the one going on at
    its present size (None: price unknown)."""
    price = record.get("hourly_cost")
    if price is None:
        return None
    total = sum(float(w["cost"] or 0.0) for w in wakes(record["name"]))
    woke = record.get("woke")
    nodes = node_total(record)
    if nodes and isinstance(woke, int | float) and not record.get("asleep_since"):
        total += float(price) * nodes * max(0.0, now - float(woke)) / 3600
    return round(total, 6)
