"""Pools that heal: lost nodes are replaced keeping their rank, health checks find nodes that
are up but unwell, and ``Nodes(min=)`` lets work start before the slow nodes are there.

A mixin of ``Pool`` (skyward.core.pool) on top of membership. The pieces:

* A lost node (its connection broke, it went silent, or it failed ``consecutive_failures``
  health checks in a row) keeps its place in the pool's list, marked lost, while a thread
  asks the provider for a replacement (``Cluster.replace``: Local respawns, SSH re-bootstraps
  the host or takes a spare, clouds update the stack). The new node takes the same rank, so
  ranks stay 0..N-1 and a replaced head is the head again; its tasks were already moved by
  dispatch (``Options.retry_on_interruption``), and may land on the new node.
* ``Options.max_provision_attempts`` (default 3) failed attempts in a row for one rank end
  its healing with an Error event; the pool goes on with the nodes it has, and once none is
  left, dispatch raises instead of waiting.
* With a health checker, a node takes no task until its first check has passed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from skyward.bootstrap import serialize
from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import Frame, Kind

from ..errors import NodeLostError, PoolClosedError, ProviderError
from ..observe import events as ev
from .dispatch import decode_result
from .health import HealthChecker, verdict
from .membership import Membership

log = logging.getLogger("skyward")
DEFAULT_ATTEMPTS = 3


def _unreachable() -> Any:
    raise ProviderError("a dead node of an attached pool is not connected to")


@dataclass
class _Check:
    """Health checks of one node."""

    due: float
    sent: float | None = None
    answer: Frame | BaseException | None = None
    failures: int = 0
    round: int = 0


class Healing(Membership):
    """Keeps the pool at its size: replacements, health checks, partial readiness."""

    _owned: bool
    attach_events: list[ev.Event]  # what replacing dead nodes at attach told (for the trail)

    def _init_healing(self) -> None:
        self._changed = threading.Condition(self._lock)
        self._replacing: dict[NodeChannel, threading.Thread] = {}
        self._given_up: dict[NodeChannel, BaseException] = {}
        self._unchecked: set[NodeChannel] = set()  # no health check passed yet: no tasks
        self._attempts: dict[int, int] = {}  # rank -> failed replacement attempts in a row
        self._joining = 0  # nodes of Nodes(min=) still coming
        self.attach_events = []
        self._health_thread: threading.Thread | None = None
        checker = self.options.health_checker
        if checker is not None and not isinstance(checker, HealthChecker):
            from ..errors import ConfigError

            raise ConfigError(
                f"Options(health_checker={checker!r}) is not valid: pass sky.HealthChecker(fn, ...)."
            )

    # -- which nodes take work -------------------------------------------------------------------
    def _ready(self) -> list[NodeChannel]:
        unchecked = self._unchecked
        return [ch for ch in self._channels if ch.lost is None and ch not in unchecked]

    def _node_may_come(self) -> bool:
        if self._closed:
            return False
        with self._lock:
            return self._joining > 0 or any(
                ch.lost is None or ch not in self._given_up for ch in self._channels
            )

    def _wait_ready(self) -> list[NodeChannel]:
        with self._changed:
            while True:
                ready = self._ready()
                if ready:
                    return ready
                if self._closed:
                    raise PoolClosedError("the pool was closed while tasks waited for a node.")
                if not self._node_may_come():
                    raise self._no_node_error()
                self._changed.wait(0.25)

    def _wait_rank(self, rank: int) -> NodeChannel:
        with self._changed:
            while True:
                ch = self._channels[rank] if rank < len(self._channels) else None
                if ch is None:
                    raise NodeLostError(f"node rank {rank} left the pool (it was resized) before the task was sent.")
                if ch.lost is None and ch not in self._unchecked:
                    return ch
                if ch in self._given_up:
                    raise self._no_node_error(rank)
                if self._closed:
                    raise PoolClosedError("the pool was closed while a task waited for its node.")
                if ch.lost is not None and ch not in self._replacing:
                    return ch  # lost this instant; its replacement has not been asked for yet
                self._changed.wait(0.25)

    def _no_node_error(self, rank: int | None = None) -> NodeLostError:
        why = next(iter(self._given_up.values()), None)
        what = f"node rank {rank} could not be replaced" if rank is not None else "no node of the pool is left"
        return NodeLostError(
            f"{what}: {why or 'every node was lost'}. Open a new pool, or raise "
            f"Options(max_provision_attempts=...) if the provider needs more tries."
        )

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def current_nodes(self) -> int:
        """How many nodes are connected and take tasks now."""
        return len(self._ready())

    # -- starting: every node, or the first ``min`` of them ----------------------------------------
    def _start_nodes(self) -> bool:
        """Start the pool's nodes; return once ``Nodes.min`` of them (default: all) are ready,
        True when all are (else ClusterReady comes when the last one joins)."""
        nodes = self._nodes
        if nodes.min is None or nodes.min >= nodes.desired:
            self._add_nodes(nodes.desired)
            if not self._owned and self._cluster.heal_at_attach:  # its dead nodes are replaced now
                self.attach_events = self._replace_unreachable()
            return True
        self._joining = nodes.desired
        failures: list[BaseException] = []
        stream = self._cluster.start_each(nodes.desired)
        thread = threading.Thread(target=self._join, args=(stream, failures), name="skyward-join", daemon=True)
        thread.start()
        with self._changed:
            while len(self._channels) < nodes.min:
                if self._joining == 0 or len(failures) > nodes.desired - nodes.min:
                    break
                self._changed.wait(0.25)
        if len(self._channels) < nodes.min:
            thread.join()
            raise failures[0] if failures else ProviderError(
                f"fewer than Nodes(min={nodes.min}) nodes started."
            )
        log.info("pool %s: %d of %d node(s) ready (min=%d); the others join as they come",
                 self.id, len(self._channels), nodes.desired, nodes.min)
        return False

    def _join(self, stream: Iterator[Any], failures: list[BaseException]) -> None:
        """Connect nodes as the provider brings them up (Nodes(min=))."""
        try:
            for item in stream:
                if self._closed:
                    if not isinstance(item, BaseException):
                        self._cluster.stop([item])
                    continue
                if isinstance(item, BaseException):
                    failures.append(item)
                    log.warning("pool %s: a node failed to start: %s", self.id, item)
                    self._emit(ev.Error(pool=self.id, message=f"a node failed to start: {item}"))
                else:
                    self._join_one(item, failures)
                with self._changed:
                    self._joining -= 1
                    self._changed.notify_all()
        except BaseException as exc:  # the provider itself failed (before any node started)
            failures.append(exc)
            self._emit(ev.Error(pool=self.id, message=str(exc)))
        finally:
            with self._changed:
                self._joining = 0
                self._changed.notify_all()
        missing = self._nodes.desired - len(self._channels)
        if missing > 0 and not self._closed and self._channels:
            try:  # one more go for the nodes that failed, all at once
                self._scale_to(self._nodes.desired)
            except Exception as exc:
                self._emit(ev.Error(pool=self.id, message=(
                    f"the pool runs with {len(self._channels)} of {self._nodes.desired} node(s): {exc}")))
                return
        if not self._closed:
            self._ready_at_last()

    def _join_one(self, endpoint: Any, failures: list[BaseException]) -> None:
        self._emit(ev.InstanceProvisioned(
            pool=self.id, node=endpoint.index, hostname=endpoint.hostname, private_ip=endpoint.private_ip,
        ))
        try:
            ch = self._connect(endpoint)
        except Exception as exc:
            failures.append(exc)
            self._cluster.stop([endpoint])
            return
        with self._resize_lock:
            with self._lock:
                self._endpoints.append(endpoint)
                self._channels.append(ch)
                self._unchecked.add(ch)  # no tasks before its CONFIGURE (and its first health check)
            self._emit(ev.InstanceBootstrapped(pool=self.id, node=ch.node))
            self._emit(ev.ClusterProvisioned(pool=self.id, nodes=len(self._channels)))
            self._configure_all()
            if self.options.health_checker is None:
                with self._changed:
                    self._unchecked.discard(ch)
                    self._changed.notify_all()

    def _ready_at_last(self) -> None:
        self._emit(ev.ClusterReady(
            pool=self.id, nodes=len(self._channels), seconds=time.monotonic() - self._requested,
        ))

    _requested: float

    def _add_nodes(self, count: int) -> None:
        super()._add_nodes(count)
        if self.options.health_checker is not None:
            with self._lock:
                self._unchecked.update(self._channels[-count:])

    def _replace_unreachable(self) -> list[ev.Event]:
        """An attached pool (a named one) some of whose described nodes are dead: replace each
        now, before the program's first task, as a node lost later would be (``_new_node``),
        each at the rank its index gives it among the others. One that cannot be replaced is
        left out, as before, with a warning. Returns the events the pool's trail records."""
        from skyward.providers.base import NodeEndpoint

        told: list[ev.Event] = []
        for index, why in sorted(self._cluster.unreachable().items()):
            started = time.monotonic()
            lost_event = ev.InstanceLost(pool=self.id, node=index, reason=why)
            self._emit(lost_event)
            with self._lock:
                rank = sum(1 for e in self._endpoints if e.index < index)
            lost = NodeEndpoint(index=index, private_ip="", public_ip=None, hostname="", connect=_unreachable)
            got = self._new_node(rank, lost, index)
            self._attempts.pop(rank, None)
            if not isinstance(got, tuple):
                self._emit(ev.Error(pool=self.id, message=f"dead node {index} could not be replaced "
                                                          f"({got}); the pool runs without it"))
                continue
            endpoint, ch = got
            with self._lock:
                self._endpoints.insert(rank, endpoint)
                self._channels.insert(rank, ch)
                if self.options.health_checker is not None:
                    self._unchecked.add(ch)
            if rank == 0:  # the new head serves the collections, empty: each process is told once
                self._state_lost = f"node {index}, the head node that held them, had died ({why})"
            self._emit(ev.InstanceBootstrapped(pool=self.id, node=ch.node))
            replaced = ev.InstanceReplaced(pool=self.id, node=index, new_node=ch.node, rank=rank,
                                           seconds=time.monotonic() - started, reason=why)
            log.info("pool %s: dead node %d replaced by node %d (rank %d) in %.2f s",
                     self.name or self.id, index, ch.node, rank, replaced.seconds)
            self._emit(replaced)
            self._cluster.replaced(index)
            told += [lost_event, replaced]
        if told:
            self._configure_all()
        return told

    # -- losing and replacing nodes ----------------------------------------------------------------
    def _node_lost(self, node: int, why: BaseException) -> None:
        super()._node_lost(node, why)  # InstanceLost, the provider lets go of it
        if self._closed:
            return
        with self._lock:
            found = [(rank, ch) for rank, ch in enumerate(self._channels) if ch.node == node]
        for rank, ch in found:
            self._collections_node_lost(rank)  # its locks are released now, not at a socket timeout
            self._begin_replacement(rank, ch, str(why) or type(why).__name__, close=False)
        self._notify()

    def _lose(self, rank: int, ch: NodeChannel, reason: str) -> None:
        """Take a node that is up but unwell out of the pool and replace it."""
        log.warning("pool %s: node %d is replaced: %s", self.id, ch.node, reason)
        self._emit(ev.InstanceLost(pool=self.id, node=ch.node, reason=reason))
        self._collections_node_lost(rank)
        self._begin_replacement(rank, ch, reason, close=True)

    def _begin_replacement(self, rank: int, ch: NodeChannel, reason: str, *, close: bool) -> None:
        with self._lock:
            if self._closed or ch in self._replacing or ch in self._given_up:
                return
            if rank >= len(self._channels) or self._channels[rank] is not ch:
                return  # the pool shrank past it meanwhile
            if ch in self._unchecked:  # it never passed a health check: a failed attempt
                self._attempts[rank] = self._attempts.get(rank, 0) + 1
            thread = threading.Thread(
                target=self._replace, args=(rank, ch, reason, time.monotonic(), close),
                name=f"skyward-replace-{rank}", daemon=True,
            )
            self._replacing[ch] = thread
        thread.start()

    def _replace(self, rank: int, old: NodeChannel, reason: str, lost_at: float, close: bool) -> None:
        try:
            self._replace_once(rank, old, reason, lost_at, close)
        except Exception as exc:  # never let a replacement thread die silently
            log.exception("pool %s: replacing node %d failed", self.id, old.node)
            self._give_up(rank, old, exc)
        finally:
            with self._lock:
                self._replacing.pop(old, None)
            self._notify()

    def _replace_once(self, rank: int, old: NodeChannel, reason: str, lost_at: float, close: bool) -> None:
        if close:
            old.close(shutdown_agent=True)  # its tasks fail over now; the agent stops
        with self._lock:
            if rank >= len(self._channels) or self._channels[rank] is not old:
                return
            lost = self._endpoints[rank]
        got = self._new_node(rank, lost, old.node)
        if got is None:
            return
        if isinstance(got, BaseException):
            self._give_up(rank, old, got)
            return
        endpoint, ch = got
        with self._changed:
            swapped = not self._closed and rank < len(self._channels) and self._channels[rank] is old
            if swapped:
                self._channels[rank] = ch
                self._endpoints[rank] = endpoint
                self._unchecked.add(ch)  # no tasks before its CONFIGURE (and its first health check)
        if not swapped:  # the pool closed or shrank past this rank meanwhile
            ch.close(shutdown_agent=True)
            self._cluster.stop([endpoint])
            return
        self._emit(ev.InstanceBootstrapped(pool=self.id, node=ch.node))
        if rank == 0:  # the new head serves the collections, empty: each process is told once
            self._state_lost = f"node {old.node}, the head node that held them, was lost ({reason})"
        self._configure_all()
        if self.options.health_checker is None:
            with self._changed:
                self._unchecked.discard(ch)
                self._attempts.pop(rank, None)
                self._changed.notify_all()
        try:
            preempted = self._cluster.preempted(old.node)
        except Exception:
            preempted = None
        if preempted:
            self._emit(ev.InstancePreempted(pool=self.id, node=old.node, reason=preempted))
        seconds = time.monotonic() - lost_at
        log.info("pool %s: node %d replaced by node %d (rank %d) in %.2f s", self.id, old.node, ch.node, rank, seconds)
        self._emit(ev.InstanceReplaced(pool=self.id, node=old.node, new_node=ch.node, rank=rank,
                                       seconds=seconds, reason=reason))
        if ch.lost is not None:  # lost again before it was in the list: its loss went unseen
            self._begin_replacement(rank, ch, str(ch.lost) or "lost", close=False)

    def _new_node(self, rank: int, lost: Any, node: int) -> tuple[Any, NodeChannel] | BaseException | None:
        """Ask the provider for a node in place of ``lost`` (node ``node``, at ``rank``) until one
        answers: ``(endpoint, channel)``; the last error once ``self._attempts[rank]`` reaches
        ``max_provision_attempts`` (waiting ``provision_retry_delay`` between tries); None when
        the pool stops meanwhile."""
        limit = self.options.max_provision_attempts or DEFAULT_ATTEMPTS
        delay = self.options.provision_retry_delay if self.options.provision_retry_delay is not None else 1.0
        error: BaseException | None = None
        while not self._stop.is_set():
            if self._attempts.get(rank, 0) >= limit:
                return error or ProviderError("its replacements kept failing their health checks")
            try:
                endpoint = self._cluster.replace(lost)
            except Exception as exc:
                error = exc
                self._attempts[rank] = self._attempts.get(rank, 0) + 1
                log.warning("pool %s: replacing node %d failed (attempt %d of %d): %s",
                            self.name or self.id, node, self._attempts[rank], limit, exc)
                self._stop.wait(delay)
                continue
            self._emit(ev.InstanceProvisioned(
                pool=self.id, node=endpoint.index, hostname=endpoint.hostname, private_ip=endpoint.private_ip,
            ))
            try:
                return endpoint, self._connect(endpoint)
            except Exception as exc:
                error = exc
                self._attempts[rank] = self._attempts.get(rank, 0) + 1
                log.warning("pool %s: the replacement of node %d did not answer: %s", self.name or self.id, node, exc)
                lost = endpoint  # the next attempt replaces this one
                self._stop.wait(delay)
        return None

    def _give_up(self, rank: int, old: NodeChannel, error: BaseException) -> None:
        limit = self.options.max_provision_attempts or DEFAULT_ATTEMPTS
        with self._changed:
            left = len(self._ready())
            self._given_up[old] = ProviderError(
                f"node {old.node} (rank {rank}) could not be replaced after {limit} attempt(s) "
                f"(Options.max_provision_attempts={limit}); the last error: {error}"
            )
            self._changed.notify_all()
        message = (f"{self._given_up[old]}. The pool goes on with {left} node(s); raise "
                   f"max_provision_attempts or fix the cause and resize the pool.")
        log.error("pool %s: %s", self.id, message)
        self._emit(ev.Error(pool=self.id, message=message, node=old.node))

    # -- health checks -------------------------------------------------------------------------------
    def _start_health_checks(self) -> None:
        if self.options.health_checker is None or self._health_thread is not None:
            return
        self._health_thread = threading.Thread(target=self._health_loop, name="skyward-health", daemon=True)
        self._health_thread.start()

    def _health_loop(self) -> None:
        hc: HealthChecker = self.options.health_checker
        flags, body, buffers = serialize.dumps(hc.fn)
        body = bytes(body)
        tick = max(0.02, min(0.25, hc.interval / 10, hc.timeout / 10))
        checks: dict[NodeChannel, _Check] = {}
        while not self._stop.wait(tick):
            now = time.monotonic()
            with self._lock:
                ranked = list(enumerate(self._channels))
            for ch in [c for c in checks if all(c is not other for _, other in ranked)]:
                del checks[ch]
            for rank, ch in ranked:
                if ch.lost is not None or ch in self._replacing:
                    continue
                check = checks.get(ch)
                if check is None:
                    check = checks[ch] = _Check(due=now + hc.initial_delay)
                if check.sent is not None:
                    if check.answer is not None:
                        self._judge(rank, ch, check, hc, now)
                    elif now - check.sent > hc.timeout:
                        check.round += 1  # a late answer is ignored
                        self._failed(rank, ch, check, hc, now, f"no answer within timeout={hc.timeout:g} s")
                    continue
                if now >= check.due:
                    check.sent, check.answer = now, None
                    this_round = check.round

                    def done(result: Frame | BaseException, check: _Check = check, this_round: int = this_round) -> None:
                        if check.round == this_round:
                            check.answer = result

                    try:
                        ch.submit(Kind.HEALTH, flags, body, list(buffers), done)
                    except NodeLostError:
                        continue

    def _judge(self, rank: int, ch: NodeChannel, check: _Check, hc: HealthChecker, now: float) -> None:
        answer, check.answer, check.sent = check.answer, None, None
        check.round += 1
        assert answer is not None
        if isinstance(answer, NodeLostError):
            return  # the loss itself is handled as a loss
        try:
            reason = verdict(decode_result(answer, "health check", ch.node))
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
        if reason is not None:
            self._failed(rank, ch, check, hc, now, reason)
            return
        check.failures, check.due = 0, now + hc.interval
        if ch in self._unchecked:
            with self._changed:
                self._unchecked.discard(ch)
                self._attempts.pop(rank, None)
                self._changed.notify_all()

    def _failed(self, rank: int, ch: NodeChannel, check: _Check, hc: HealthChecker, now: float, reason: str) -> None:
        check.sent, check.failures, check.due = None, check.failures + 1, now + hc.interval
        log.warning("pool %s: node %d failed its health check (%d of %d in a row): %s",
                    self.id, ch.node, check.failures, hc.consecutive_failures, reason)
        if check.failures >= hc.consecutive_failures:
            self._lose(rank, ch, f"failed {check.failures} health check(s) in a row: {reason}")
