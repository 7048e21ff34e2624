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


def prices(record: dict[str, Any]) -> dict[str, float | None]:
    """Each group's price per node-hour in USD (None: unknown), by group name: a pool of one
    spec is the one group ``default``, at the record's price."""
    return {g: None if view.get("hourly_cost") is None else float(view["hourly_cost"])
            for g, view in group_views(record).items()}


def rate(price: dict[str, float | None], nodes: dict[str, int]) -> float | None:
    """USD per hour of ``nodes`` (each group's count) at each group's ``price`` per node-hour;
    None when a group that has nodes has no known price."""
    total = 0.0
    for group, n in nodes.items():
        if not n:
            continue
        each = price.get(group)
        if each is None:
            return None
        total += each * n
    return round(total, 6)


@dataclass
class Meter:
    """What an awake pool uses, counted from each group's node count as the recorder sees it:
    node-seconds, and their cost at each group's price (``price``, by group; None once a group
    with nodes has no known price)."""

    nodes: dict[str, int]
    at: float
    price: dict[str, float | None]
    node_seconds: float = 0.0
    cost: float | None = 0.0
    woke_at: float | None = None

    def count(self, nodes: dict[str, int], now: float) -> None:
        """The pool has ``nodes`` (by group) from ``now`` on."""
        held = max(0.0, now - self.at)
        self.node_seconds += sum(self.nodes.values()) * held
        hourly = rate(self.price, self.nodes)
        self.cost = None if self.cost is None or hourly is None else self.cost + hourly * held / 3600
        if not any(self.nodes.values()) and any(nodes.values()):
            self.woke_at = now
        self.nodes, self.at = dict(nodes), now

    def slept(self, now: float) -> tuple[float, float, float | None]:
        """The pool fell asleep at ``now``: (seconds awake, node-seconds, their cost in USD)
        since it woke; resets."""
        self.count({g: 0 for g in self.nodes}, now)
        awake = 0.0 if self.woke_at is None else now - self.woke_at
        used = (self.node_seconds, None if self.cost is None else round(self.cost, 6))
        self.node_seconds, self.cost, self.woke_at = 0.0, 0.0, None
        return awake, *used


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
    its present size, each group at its own price (None: a price unknown)."""
    price = prices(record)
    if any(p is None for p in price.values()):
        return None
    total = sum(float(w["cost"] or 0.0) for w in wakes(record["name"]))
    woke = record.get("woke")
    hourly = rate(price, {g: len((view.get("cluster") or {}).get("nodes") or [])
                          for g, view in group_views(record).items()})
    if hourly and isinstance(woke, int | float) and not record.get("asleep_since"):
        total += hourly * max(0.0, now - float(woke)) / 3600
    return round(total, 6)
