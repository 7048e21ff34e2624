"""Elastic pools: when to grow and when to shrink (``decide``, pure logic) and the loop that
applies it to a pool's membership (``Autoscaler``, one part of a ``Pool``)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..observe import events as ev
from ..spec import Nodes, Options, Worker
from .membership import Membership

log = logging.getLogger("skyward")


@dataclass
class ScaleState:
    last_change: float  # the last step (or the loop's start)
    idle_since: float | None = None
    stepped: bool = False  # whether a step was taken: the cooldown before a shrink counts from it


def decide(nodes: Nodes, live: int, busy: int, slots: int, now: float,
           state: ScaleState, options: Options) -> int | None:
    """The node count to scale to now, or None to stay.

    Grow while tasks wait for a free slot (``busy`` beyond ``live * slots``), by as many nodes
    as the waiting tasks fill, at most once per ``autoscale_cooldown`` and never beyond
    ``nodes.max``. Shrink to ``nodes.floor`` (``min`` when given, else ``desired``; 0 puts the
    pool to sleep) once nothing has run for ``autoscale_idle_timeout`` seconds, and no sooner than
    ``autoscale_cooldown`` after the last step (a pool that just grew for a burst keeps its nodes
    that long). Updates ``state``.
    """
    if nodes.max is None:
        return None
    waiting = busy - live * slots
    if waiting > 0 and live < nodes.max and now - state.last_change >= options.autoscale_cooldown:
        state.last_change, state.idle_since, state.stepped = now, None, True
        return min(nodes.max, live + math.ceil(waiting / slots))
    if busy == 0 and live > nodes.floor:
        if state.idle_since is None:
            state.idle_since = now
        cooled = not state.stepped or now - state.last_change >= options.autoscale_cooldown
        if now - state.idle_since >= options.autoscale_idle_timeout and cooled:
            state.last_change, state.idle_since, state.stepped = now, None, True
            return nodes.floor
        return None
    state.idle_since = None
    return None


class Autoscaler:
    """Runs ``decide`` about once a second while the pool's size range is elastic."""

    def __init__(self, members: Membership, options: Options, worker: Worker) -> None:
        self.members, self.options, self.worker = members, options, worker
        self._thread: threading.Thread | None = None
        # Whether an idle pool may shrink now: a named pool's other programs may be using the
        # nodes this one sees idle (skyward.named.pools sets it; the next idle period asks again).
        self.may_shrink: Callable[[], bool] = lambda: True
        # Work the nodes' task slots do not show as it is (a served endpoint: its replicas hold a
        # slot each for as long as they serve, while its load is the requests): each source says
        # (slots its tasks hold, slots its load asks for), and the second counts for the first.
        self.loads: list[Callable[[], tuple[int, int]]] = []

    def start(self) -> None:
        """Start the loop if the pool is elastic now and it does not run yet."""
        members = self.members
        if not members.nodes.elastic:
            return  # nothing to move between
        with members.lock:
            if self._thread is not None or members.closed:
                return
            self._thread = threading.Thread(target=self._loop, name="skyward-autoscale", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        """Tasks already queued on a node stay there; new nodes take their share of what is
        dispatched after they join (round-robin for >>, the next chunks of a running map)."""
        members = self.members
        state = ScaleState(last_change=time.monotonic())
        said_no_growth = False
        while not members.stop.wait(min(1.0, self.options.reconcile_tick_interval)):
            with members.lock:
                if members.joining or members.waking is not None:
                    continue  # nodes on their way (Nodes(min=), a wake) are not idle ones
                live = [m.channel for m in members.table if m.channel.lost is None]
                size = len(members.table)  # a lost node being replaced still counts: no scale-up
            busy = sum(ch.inflight for ch in live)
            for load in list(self.loads):
                held, wanted = load()
                busy = max(0, busy - held) + wanted
            now = time.monotonic()
            idle_since = state.idle_since  # decide() clears it when it shrinks the pool
            target = decide(members.nodes, size, busy, self.worker.slots, now, state, self.options)
            if target is None:
                continue
            if target > size:
                refused = members.cluster.no_growth()
                if refused is not None:
                    if not said_no_growth:  # said once: the tasks wait on the nodes there are
                        said_no_growth = True
                        message = f"autoscale: {busy} task(s) wait, but the pool stays at {size} node(s): {refused}"
                        log.warning("pool %s: %s", members.name or members.pool_id, message)
                        members.emit(ev.Log(pool=members.pool_id, level="WARNING", message=message))
                    continue
            if target < size and not self.may_shrink():
                log.info("autoscale: idle here, but another program uses the pool; keeping %d node(s)", size)
                continue
            log.info("autoscale: %d task(s) in flight on %d node(s); scaling to %d", busy, len(live), target)
            try:
                members.scale_to(target, idle=now - idle_since if idle_since is not None else None)
            except Exception as exc:  # a failed scale step must not end the pool
                if members.closed:
                    return
                log.warning("autoscale step failed: %s", exc)
