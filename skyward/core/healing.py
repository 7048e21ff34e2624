"""Healing: a pool that keeps its size. Lost nodes are replaced keeping their rank, health
checks find nodes that are up but unwell, and an attached pool's dead nodes are replaced
before its first task.

One part of a ``Pool`` (skyward.core.pool), built on membership: it decides, membership holds
the nodes. It reads the node table through membership's methods and changes a node's
readiness only through the ones made for it (``claim_for_replacement``, ``swap``, ``insert``,
``mark_checked``, ``give_up``). The pieces:

* A lost node (its connection broke, it went silent, or it failed ``consecutive_failures``
  health checks in a row) keeps its place in the pool's list, marked lost, while a thread
  asks the provider for a replacement (``Cluster.replace``: Local respawns, SSH re-bootstraps
  the host or takes a spare, clouds update the stack). The new node takes the same rank, so
  ranks stay 0..N-1 and a replaced head is the head again; its tasks were already moved by
  dispatch (``Options.retry_on_interruption``), and may land on the new node.
* ``Options.max_provision_attempts`` (default 3) failed attempts in a row for one rank end
  its healing with an Error event; the pool goes on with the nodes it has, and once none is
  left, dispatch raises instead of waiting.
* With a health checker, a node takes no task until its first check has passed, and a new
  pool waits for that on each of its nodes before it is handed over (``wait_warm``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skyward.bootstrap import serialize
from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import Frame, Kind

from ..errors import ConfigError, NodeLostError, ProviderError
from ..observe import events as ev
from ..spec import Options
from .dispatch import decode_result
from .membership import Membership, NodeState

if TYPE_CHECKING:
    from ..health import HealthChecker
    from ..runtime.collections import ClientState

log = logging.getLogger("skyward")
DEFAULT_ATTEMPTS = 3


class _NotReplaced(ProviderError):
    """A lost node is not replaced at all: the pool's deadline is too near (Cluster.no_growth)."""


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


class Healing:
    """Replacement policy and health checks over a pool's membership."""

    def __init__(self, members: Membership, options: Options, shared: ClientState,
                 emit: Callable[[ev.Event], None]) -> None:
        checker = options.health_checker
        if checker is not None:  # (a pool without one never loads skyward.health: 1 ms of its start)
            from ..health import HealthChecker

            if not isinstance(checker, HealthChecker):
                raise ConfigError(
                    f"Options(health_checker={checker!r}) is not valid: pass sky.HealthChecker(fn, ...)."
                )
        self.members, self.options, self.shared, self.emit = members, options, shared, emit
        self.pool_id = members.pool_id
        self.attempts: dict[int, int] = {}  # rank -> failed replacement attempts in a row
        self._health_thread: threading.Thread | None = None

    @property
    def _label(self) -> str:
        return self.members.name or self.pool_id

    # -- losing and replacing nodes ----------------------------------------------------------------
    def node_lost(self, node: int, why: BaseException) -> None:
        """Membership saw node ``node`` go (InstanceLost is out): replace it at its rank."""
        for rank, ch in self.members.ranks_of(node):
            self.shared.node_lost(rank)  # its locks are released now, not at a socket timeout
            self._begin_replacement(rank, ch, str(why) or type(why).__name__, close=False)
        self.members.notify()

    def lose(self, rank: int, ch: NodeChannel, reason: str) -> None:
        """Take a node that is up but unwell out of the pool and replace it."""
        log.warning("pool %s: node %d is replaced: %s", self.pool_id, ch.node, reason)
        self.emit(ev.InstanceLost(pool=self.pool_id, node=ch.node, reason=reason))
        self.shared.node_lost(rank)
        self._begin_replacement(rank, ch, reason, close=True)

    def _begin_replacement(self, rank: int, ch: NodeChannel, reason: str, *, close: bool) -> None:
        thread = threading.Thread(
            target=self._replace, args=(rank, ch, reason, time.monotonic(), close),
            name=f"skyward-replace-{rank}", daemon=True,
        )
        unchecked = self.members.claim_for_replacement(rank, ch)
        if unchecked is None:
            return
        if unchecked:  # it never passed a health check: a failed attempt
            self.attempts[rank] = self.attempts.get(rank, 0) + 1
        thread.start()

    def _replace(self, rank: int, old: NodeChannel, reason: str, lost_at: float, close: bool) -> None:
        try:
            self._replace_once(rank, old, reason, lost_at, close)
        except Exception as exc:  # never let a replacement thread die silently
            log.exception("pool %s: replacing node %d failed", self.pool_id, old.node)
            self._give_up(rank, old, exc)
        finally:
            self.members.replaced(old)

    def _replace_once(self, rank: int, old: NodeChannel, reason: str, lost_at: float, close: bool) -> None:
        members = self.members
        if close:
            old.close(shutdown_agent=True)  # its tasks fail over now; the agent stops
        lost = members.at(rank, old)
        if lost is None:
            return
        got = self._new_node(rank, lost, old.node)
        if got is None:
            return
        if isinstance(got, BaseException):
            self._give_up(rank, old, got)
            return
        endpoint, ch = got
        if not members.swap(rank, old, endpoint, ch):  # the pool closed or shrank past this rank
            ch.close(shutdown_agent=True)
            members.cluster.stop([endpoint])
            return
        self.emit(ev.InstanceBootstrapped(pool=self.pool_id, node=ch.node))
        if rank == 0 and members.holds_state:  # the new head serves the collections, empty: each process is told once
            self.shared.head_gone(f"node {old.node}, the head node that held them, was lost ({reason})")
        members.configure_all()
        if self.options.health_checker is None:
            members.mark_checked(ch)
            self.attempts.pop(rank, None)
        try:
            preempted = members.cluster.preempted(old.node)
        except Exception:
            preempted = None
        if preempted:
            self.emit(ev.InstancePreempted(pool=self.pool_id, node=old.node, reason=preempted))
        seconds = time.monotonic() - lost_at
        log.info("pool %s: node %d replaced by node %d (rank %d) in %.2f s",
                 self.pool_id, old.node, ch.node, rank, seconds)
        self.emit(ev.InstanceReplaced(pool=self.pool_id, node=old.node, new_node=ch.node, rank=rank,
                                      seconds=seconds, reason=reason))
        if ch.lost is not None:  # lost again before it was in the list: its loss went unseen
            self._begin_replacement(rank, ch, str(ch.lost) or "lost", close=False)

    def _new_node(self, rank: int, lost: Any, node: int) -> tuple[Any, NodeChannel] | BaseException | None:
        """Ask the provider for a node in place of ``lost`` (node ``node``, at ``rank``) until one
        answers: ``(endpoint, channel)``; the last error once ``self.attempts[rank]`` reaches
        ``max_provision_attempts`` (waiting ``provision_retry_delay`` between tries); None when
        the pool stops meanwhile."""
        members = self.members
        limit = self.options.max_provision_attempts or DEFAULT_ATTEMPTS
        delay = self.options.provision_retry_delay if self.options.provision_retry_delay is not None else 1.0
        error: BaseException | None = None
        while not members.stop.is_set():
            refused = members.cluster.no_growth()
            if refused is not None:
                return _NotReplaced(refused)
            if self.attempts.get(rank, 0) >= limit:
                return error or ProviderError("its replacements kept failing their health checks")
            self.emit(ev.InstanceRequested(pool=self.pool_id, provider=members.spec.provider.kind,
                                           replacing=node))
            try:
                endpoint = members.cluster.replace(lost)
            except Exception as exc:
                error = exc
                self.attempts[rank] = self.attempts.get(rank, 0) + 1
                log.warning("pool %s: replacing node %d failed (attempt %d of %d): %s",
                            self._label, node, self.attempts[rank], limit, exc)
                members.stop.wait(delay)
                continue
            self.emit(ev.InstanceProvisioned(
                pool=self.pool_id, node=endpoint.index, hostname=endpoint.hostname, private_ip=endpoint.private_ip,
            ))
            try:
                return endpoint, members.connect(endpoint)
            except Exception as exc:
                error = exc
                self.attempts[rank] = self.attempts.get(rank, 0) + 1
                log.warning("pool %s: the replacement of node %d did not answer: %s", self._label, node, exc)
                lost = endpoint  # the next attempt replaces this one
                members.stop.wait(delay)
        return None

    def _give_up(self, rank: int, old: NodeChannel, error: BaseException) -> None:
        limit = self.options.max_provision_attempts or DEFAULT_ATTEMPTS
        if isinstance(error, _NotReplaced):
            reason = ProviderError(f"node {old.node} (rank {rank}) is not replaced: {error}")
            left = self.members.give_up(old, reason)
            message = f"{reason}. The pool goes on with {left} node(s) until then."
            log.error("pool %s: %s", self.pool_id, message)
            self.emit(ev.Error(pool=self.pool_id, message=message, node=old.node))
            return
        reason = ProviderError(
            f"node {old.node} (rank {rank}) could not be replaced after {limit} attempt(s) "
            f"(Options.max_provision_attempts={limit}); the last error: {error}"
        )
        left = self.members.give_up(old, reason)
        message = (f"{reason}. The pool goes on with {left} node(s); raise "
                   f"max_provision_attempts or fix the cause and resize the pool.")
        log.error("pool %s: %s", self.pool_id, message)
        self.emit(ev.Error(pool=self.pool_id, message=message, node=old.node))

    # -- an attached pool's dead nodes ---------------------------------------------------------------
    def replace_unreachable(self) -> list[ev.Event]:
        """An attached pool (a named one) some of whose described nodes are dead: replace each
        now, before the program's first task, as a node lost later would be (``_new_node``),
        each at the rank its index gives it among the others. One that cannot be replaced is
        left out, as before, with a warning. Returns the events the pool's trail records."""
        from skyward.providers.base import NodeEndpoint

        members = self.members
        told: list[ev.Event] = []
        for index, why in sorted(members.cluster.unreachable().items()):
            started = time.monotonic()
            lost_event = ev.InstanceLost(pool=self.pool_id, node=index, reason=why)
            self.emit(lost_event)
            rank = members.rank_for_index(index)
            lost = NodeEndpoint(index=index, private_ip="", public_ip=None, hostname="", connect=_unreachable)
            got = self._new_node(rank, lost, index)
            self.attempts.pop(rank, None)
            if not isinstance(got, tuple):
                self.emit(ev.Error(pool=self.pool_id, message=f"dead node {index} could not be replaced "
                                                              f"({got}); the pool runs without it"))
                continue
            endpoint, ch = got
            members.insert(rank, endpoint, ch)
            if rank == 0:  # the new head serves the collections, empty: each process is told once
                self.shared.head_gone(f"node {index}, the head node that held them, had died ({why})")
            self.emit(ev.InstanceBootstrapped(pool=self.pool_id, node=ch.node))
            replaced = ev.InstanceReplaced(pool=self.pool_id, node=index, new_node=ch.node, rank=rank,
                                           seconds=time.monotonic() - started, reason=why)
            log.info("pool %s: dead node %d replaced by node %d (rank %d) in %.2f s",
                     self._label, index, ch.node, rank, replaced.seconds)
            self.emit(replaced)
            members.cluster.replaced(index)
            told += [lost_event, replaced]
        if told:
            members.configure_all()
        return told

    # -- health checks -------------------------------------------------------------------------------
    def start_health_checks(self) -> None:
        if self.options.health_checker is None or self._health_thread is not None:
            return
        self._health_thread = threading.Thread(target=self._health_loop, name="skyward-health", daemon=True)
        self._health_thread.start()

    def wait_warm(self) -> None:
        """With a health checker, wait until each node of the pool has passed its first check
        (warming gates readiness, as in the reference) or was given up; raise NodeLostError when
        none passed. Replacements of nodes that fail while warming happen meanwhile."""
        members = self.members
        if self.options.health_checker is None:
            return
        self.start_health_checks()
        with members.changed:
            while not members.closed and members.warming():
                members.changed.wait(0.25)
            if members.table and not members.ready():
                raise members.no_node_error()

    def _health_loop(self) -> None:
        from ..health import HealthChecker, NodeCheck

        hc = self.options.health_checker
        assert isinstance(hc, HealthChecker)
        members = self.members
        # One key per pool and checker: the node keeps the first copy it gets and runs it each time.
        flags, body, buffers = serialize.dumps(NodeCheck(f"{self.pool_id}:{id(hc):x}", hc.fn))
        body = bytes(body)
        tick = max(0.02, min(0.25, hc.interval / 10, hc.timeout / 10))
        checks: dict[NodeChannel, _Check] = {}
        while not members.stop.wait(tick):
            now = time.monotonic()
            records = members.records()
            for ch in [c for c in checks if all(c is not m.channel for m in records)]:
                del checks[ch]
            for m in records:
                rank, ch = m.rank, m.channel
                if ch.lost is not None or m.state is NodeState.REPLACING:
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
        from ..health import verdict

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
        if self.members.mark_checked(ch):
            self.attempts.pop(rank, None)

    def _failed(self, rank: int, ch: NodeChannel, check: _Check, hc: HealthChecker, now: float, reason: str) -> None:
        check.sent, check.failures, check.due = None, check.failures + 1, now + hc.interval
        log.warning("pool %s: node %d failed its health check (%d of %d in a row): %s",
                    self.pool_id, ch.node, check.failures, hc.consecutive_failures, reason)
        if check.failures >= hc.consecutive_failures:
            self.lose(rank, ch, f"failed {check.failures} health check(s) in a row: {reason}")
