"""Elastic pools: when to grow and when to shrink (pure logic; the pool runs the loop)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..spec import Nodes, Options


@dataclass
class ScaleState:
    last_change: float
    idle_since: float | None = None


def decide(nodes: Nodes, live: int, busy: int, slots: int, now: float,
           state: ScaleState, options: Options) -> int | None:
    """The node count to scale to now, or None to stay.

    Grow while tasks wait for a free slot (``busy`` beyond ``live * slots``), by as many nodes
    as the waiting tasks fill, at most once per ``autoscale_cooldown`` and never beyond
    ``nodes.max``. Shrink back to ``nodes.desired`` once nothing has run for
    ``autoscale_idle_timeout`` seconds. Updates ``state``.
    """
    if nodes.max is None:
        return None
    waiting = busy - live * slots
    if waiting > 0 and live < nodes.max and now - state.last_change >= options.autoscale_cooldown:
        state.last_change, state.idle_since = now, None
        return min(nodes.max, live + math.ceil(waiting / slots))
    if busy == 0 and live > nodes.desired:
        if state.idle_since is None:
            state.idle_since = now
        if now - state.idle_since >= options.autoscale_idle_timeout:
            state.last_change, state.idle_since = now, None
            return nodes.desired
        return None
    state.idle_since = None
    return None
