"""Membership: which nodes the pool has and which of them take tasks.

One part of a ``Pool`` (skyward.core.pool). It owns the node table: one ``Member`` per node, in
rank order (0 is the head), each with the endpoint the provider gave, the channel to its agent
and one ``NodeState``; besides it, ``joining`` counts the nodes of ``Nodes(min=)`` still on their
way. It also holds the pool's lifecycle flags (``closed``, ``stopped``) and the lease heartbeat. It connects and configures nodes, adds and removes them, and tells the parts
above it what is ready: dispatch asks ``ready()``/``wait_ready()``/``wait_rank()``, healing
changes a node's readiness through the methods under "for healing". It calls no other part:
what happens on a loss, to a nested task or to the collections is wired in by the pool
(``on_lost``, ``on_nested``, ``on_stopped``, ``state_address``, ``ask_state``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import Frame

from ..errors import InheritedPoolError, NodeLostError, PoolClosedError, ProviderError
from ..metrics import to_config
from ..observe import events as ev
from ..observe import secrets
from ..spec import Nodes, Options, Spec, Worker

if TYPE_CHECKING:
    from ..providers.base import Cluster

log = logging.getLogger("skyward")

Pairs = list[tuple[Any, NodeChannel]]  # (endpoint, channel) in rank order


class NodeState(Enum):
    """Where a node of the table stands. The channel's own ``lost`` says the connection is gone
    the instant it goes; the state is what the pool made of it."""

    UNCHECKED = "unchecked"  # connected, configured or about to be; no health check passed yet: no tasks
    READY = "ready"  # takes tasks (while its channel is not lost)
    # its channel went and no replacement is under way (one that never passed a check stays
    # UNCHECKED until healing claims it: that loss counts as a failed attempt of its rank)
    LOST = "lost"
    REPLACING = "replacing"  # healing is bringing a node to its rank
    GIVEN_UP = "given up"  # it will not be replaced (``Member.why`` says why)


@dataclass(eq=False, slots=True)
class Member:
    """One node of the pool: everything the pool keeps about it, in one place."""

    rank: int  # its position in the table: 0 is the head
    endpoint: Any  # the provider's NodeEndpoint: its index, addresses, how to connect
    channel: NodeChannel
    state: NodeState
    why: BaseException | None = None  # GIVEN_UP: the last error of its replacement


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node as the pool sees it at one moment (``Pool.snapshot()``)."""

    rank: int  # its position in the pool: 0 is the head
    node: int  # the provider's index for it (stays the same when other nodes leave)
    state: Literal["ready", "lost"]
    host: str
    private_ip: str
    public_ip: str | None
    slots: int  # tasks it runs at once (Worker.concurrency + buffer)
    running: int  # tasks it is running now
    queued: int  # tasks sent to it beyond its slots, waiting there
    group: str = "default"  # the group it is a node of (skyward.core.group); rank is within it


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """The pool at one moment: its nodes and their work."""

    pool: str
    name: str | None
    active: bool
    nodes: tuple[NodeSnapshot, ...]

    @property
    def concurrency(self) -> int:
        """Task slots of the ready nodes together."""
        return sum(n.slots for n in self.nodes if n.state == "ready")

    @property
    def running(self) -> int:
        return sum(n.running for n in self.nodes)

    @property
    def queued(self) -> int:
        return sum(n.queued for n in self.nodes)


class Membership:
    """The pool's nodes and their readiness (see the module's doc)."""

    cluster: Cluster  # set by attach(), before any node starts

    def __init__(self, pool_id: str, name: str | None, spec: Spec, options: Options, worker: Worker,
                 emit: Callable[[ev.Event], None]) -> None:
        self.pool_id, self.name = pool_id, name
        self.spec, self.options, self.worker = spec, options, worker
        self.emit = emit
        # The process that opened the pool owns it. A child forked from it (os.fork,
        # multiprocessing's fork start method) inherits this object, its sockets and its exit
        # hooks, but no thread: it must never write to the nodes, close or detach them
        # (skyward.core.pool asks ``foreign()`` before acting; dispatch asks ``check_owner()``).
        self.pid = os.getpid()
        self.lock = threading.RLock()  # guards everything below; `changed` is notified on changes
        self.changed = threading.Condition(self.lock)
        self.table: list[Member] = []  # in rank order; replaced whole or changed under the lock
        self.nodes: Nodes = spec.node_spec  # the size asked for (resize changes it)
        self.joining = 0  # nodes of Nodes(min=) still coming
        self.drift: dict[str, tuple[str, str, int]] = {}  # package -> (version here, on a node, that node)
        self.closed = False
        self.stopped: str | None = None  # why it was stopped from outside (`skyward down`), if it was
        self.stop = threading.Event()  # set once the pool closes: every loop of every part ends
        self.on_heartbeat: list[Callable[[], None]] = []  # checks of other parts, at every beat
        self.resize_lock = threading.Lock()
        self.requested = time.monotonic()
        self.waking: threading.Thread | None = None  # an asleep pool starting a node for its work
        self.wake_error: BaseException | None = None
        self._print_lock = threading.Lock()
        self._plugins_blob: str | None = None
        # Wired by the pool (skyward.core.pool):
        self.on_lost: Callable[[int, BaseException], None] = lambda node, why: None
        self.on_nested: Callable[[NodeChannel, Frame], None] = lambda origin, frame: None
        self.on_stopped: Callable[[], None] = lambda: None
        self.state_address: Callable[[Pairs], dict[str, Any] | None] = lambda pairs: None
        self.ask_state: Callable[[Any, NodeChannel], None] = lambda endpoint, channel: None
        self.on_head_gone: Callable[[str], None] = lambda why: None  # the collections' state went with it
        # A shrink took these members out of the table: work that holds their slots for good
        # (a served endpoint's replicas) ends there before the pool waits for their tasks.
        self.on_leaving: list[Callable[[list[Member]], None]] = []
        # The group these nodes are (skyward.core.group); in a pool of several groups the pool
        # gives each node its pool-wide place (``layout``), and hears when a group's nodes change
        # (``on_configured``: the other groups' nodes are told their new pool-wide numbers).
        self.group = "default"
        self.holds_state = True  # its first node serves the pool's collections (the head group)
        self.layout: Callable[[Membership], dict[str, Any]] | None = None
        self.on_configured: Callable[[Membership], None] | None = None

    def attach(self, cluster: Cluster) -> None:
        self.cluster = cluster

    @property
    def channels(self) -> list[NodeChannel]:
        """The nodes' channels in rank order (a copy: the table is changed through the methods)."""
        return [m.channel for m in self.table]

    def _member(self, ch: NodeChannel) -> Member | None:
        """The record of the node on ``ch``, while it is in the table (call with the lock held)."""
        return next((m for m in self.table if m.channel is ch), None)

    def _at(self, rank: int, ch: NodeChannel) -> Member | None:
        """The record at ``rank`` if ``ch`` is still the node there (call with the lock held)."""
        table = self.table
        return table[rank] if rank < len(table) and table[rank].channel is ch else None

    def _append(self, endpoint: Any, ch: NodeChannel, state: NodeState) -> None:
        self.table.append(Member(len(self.table), endpoint, ch, state))

    def _first_state(self) -> NodeState:
        """A new node's state: with a health checker, no tasks before a check has passed."""
        return NodeState.READY if self.options.health_checker is None else NodeState.UNCHECKED

    # -- whose pool it is ------------------------------------------------------------------------
    def foreign(self) -> bool:
        """True in a process forked from the one that opened the pool (it owns nothing of it)."""
        return os.getpid() != self.pid

    def check_owner(self) -> None:
        """Raise InheritedPoolError in a process forked from the one that opened the pool."""
        if os.getpid() == self.pid:
            return
        what = f"pool {self.name!r} (id {self.pool_id})" if self.name else f"pool {self.pool_id}"
        attach = (f"attach to it here with sky.Compute(name={self.name!r}) (a named pool takes "
                  f"several programs at once)") if self.name else \
            "for a pool several processes share, start a named one (`skyward up NAME`) and attach to it " \
            "in each process with sky.Compute(name=NAME)"
        raise InheritedPoolError(
            f"{what} belongs to process {self.pid}, which opened it; this process ({os.getpid()}) was "
            f"forked from it and cannot use it: its connections, nodes and collections are the parent's. "
            f"Open a pool in this process (with sky.Compute(...) as pool:), or {attach}."
        )

    # -- what takes tasks (dispatch and batches ask) ---------------------------------------------
    def ready(self) -> list[NodeChannel]:
        """The nodes that take tasks now, in rank order."""
        return [m.channel for m in self.table if m.state is NodeState.READY and m.channel.lost is None]

    def node_may_come(self) -> bool:
        """Whether a node can take tasks now or later (a lost one may be replaced, an asleep
        pool wakes)."""
        if self.closed:
            return False
        with self.lock:
            return self.joining > 0 or self.waking is not None or self.asleep() or any(
                m.channel.lost is None or m.state is not NodeState.GIVEN_UP for m in self.table)

    def wait_ready(self) -> list[NodeChannel]:
        """The ready nodes, waiting while none is (raises when none will come back). An asleep
        pool (``Nodes(desired=0)`` and no node) wakes for it."""
        with self.changed:
            while True:
                ready = self.ready()
                if ready:
                    return ready
                if self.closed:
                    raise PoolClosedError("the pool was closed while tasks waited for a node.")
                self._wake_if_asleep()
                if not self.node_may_come():
                    raise self.no_node_error()
                self.changed.wait(0.25)

    # -- scale to zero ---------------------------------------------------------------------------
    def asleep(self) -> bool:
        """No node, none on its way, and the pool may have none: an elastic pool whose floor is 0
        (``Nodes(desired=0, max=N)``, or ``Nodes(desired=N, min=0, max=M)`` once it reaped to zero)."""
        nodes = self.nodes
        return (not self.closed and not self.table and not self.joining
                and nodes.floor == 0 and (nodes.max or 0) > 0)

    def wake(self) -> None:
        """Start a node now if the pool is asleep (work is on its way that needs one: a request
        to a served endpoint). A wake that failed before is logged here, not raised."""
        with self.changed:
            try:
                self._wake_if_asleep()
            except ProviderError as exc:
                log.warning("pool %s: %s", self.name or self.pool_id, exc)

    def _wake_if_asleep(self) -> None:
        """Start a node for work that waits (once; call with the lock held). A wake that failed
        raises here, once, for the work that waited; the next task tries again."""
        if self.waking is not None or not self.asleep():
            return
        if self.wake_error is not None:
            error, self.wake_error = self.wake_error, None
            raise ProviderError(f"the pool has no node and could not start one for this task: {error}") from error
        self.waking = threading.Thread(target=self._wake, name="skyward-wake", daemon=True)
        self.waking.start()

    def _wake(self) -> None:
        started = time.monotonic()
        log.info("pool %s: waking: a task came and the pool has no node", self.name or self.pool_id)
        try:
            self.scale_to(1)  # the autoscaler grows it further while tasks wait
        except BaseException as exc:
            self.wake_error = exc
            self.emit(ev.Error(pool=self.pool_id, message=f"the pool could not wake: {exc}"))
        else:
            self.emit(ev.ClusterWoke(pool=self.pool_id, nodes=len(self.table),
                                     seconds=time.monotonic() - started))
        finally:
            with self.changed:
                self.waking = None
                self.changed.notify_all()

    def wait_rank(self, rank: int) -> NodeChannel:
        """The node at ``rank``, waiting while it is being replaced or checked."""
        with self.changed:
            while True:
                table = self.table
                m = table[rank] if rank < len(table) else None
                if m is None and (self.waking is not None or self.asleep()):
                    self._wake_if_asleep()
                    self.changed.wait(0.25)
                    continue
                if m is None:
                    raise NodeLostError(f"node rank {rank} left the pool (it was resized) before the task was sent.")
                ch = m.channel
                if m.state is NodeState.READY and ch.lost is None:
                    return ch
                if m.state is NodeState.GIVEN_UP:
                    raise self.no_node_error(rank)
                if self.closed:
                    raise PoolClosedError("the pool was closed while a task waited for its node.")
                if ch.lost is not None and m.state is not NodeState.REPLACING:
                    return ch  # lost this instant; its replacement has not been asked for yet
                self.changed.wait(0.25)

    def no_node_error(self, rank: int | None = None) -> NodeLostError:
        why = next((m.why for m in self.table if m.state is NodeState.GIVEN_UP), None)
        what = f"node rank {rank} could not be replaced" if rank is not None else "no node of the pool is left"
        return NodeLostError(
            f"{what}: {why or 'every node was lost'}. Open a new pool, or raise "
            f"Options(max_provision_attempts=...) if the provider needs more tries."
        )

    def notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def current_nodes(self) -> int:
        """How many nodes are connected and take tasks now."""
        return len(self.ready())

    def size(self) -> int:
        """Nodes in the table, lost ones being replaced included."""
        return len(self.table)

    def records(self) -> list[Member]:
        """The table as it is now (the records themselves: their state moves on)."""
        with self.lock:
            return list(self.table)

    def ranked(self) -> list[tuple[int, NodeChannel]]:
        with self.lock:
            return [(m.rank, m.channel) for m in self.table]

    def pairs(self) -> Pairs:
        with self.lock:
            return [(m.endpoint, m.channel) for m in self.table]

    def head(self) -> NodeChannel | None:
        table = self.table
        return table[0].channel if table else None

    def snapshot(self) -> PoolSnapshot:
        slots = self.worker.slots
        nodes = []
        for m in self.records():
            rank, endpoint, ch = m.rank, m.endpoint, m.channel
            inflight = ch.inflight
            nodes.append(NodeSnapshot(
                rank=rank, node=ch.node, state="ready" if ch.lost is None else "lost",
                host=endpoint.hostname, private_ip=endpoint.private_ip, public_ip=endpoint.public_ip,
                slots=slots, running=min(inflight, slots), queued=max(0, inflight - slots), group=self.group,
            ))
        return PoolSnapshot(pool=self.pool_id, name=self.name, active=not self.closed, nodes=tuple(nodes))

    # -- starting ------------------------------------------------------------------------------
    def start(self) -> bool:
        """Start the pool's nodes; return once ``Nodes.min`` of them (default: all) are ready,
        True when all are (else ClusterReady comes when the last one joins)."""
        nodes = self.nodes
        if nodes.min is None or nodes.min >= nodes.desired:
            self.add_nodes(nodes.desired)
            return True
        self.joining = nodes.desired
        failures: list[BaseException] = []
        stream = self.cluster.start_each(nodes.desired)
        thread = threading.Thread(target=self._join, args=(stream, failures), name="skyward-join", daemon=True)
        thread.start()
        with self.changed:
            while len(self.table) < nodes.min:
                if self.joining == 0 or len(failures) > nodes.desired - nodes.min:
                    break
                self.changed.wait(0.25)
        if len(self.table) < nodes.min:
            thread.join()
            raise failures[0] if failures else ProviderError(f"fewer than Nodes(min={nodes.min}) nodes started.")
        log.info("pool %s: %d of %d node(s) ready (min=%d); the others join as they come",
                 self.pool_id, len(self.table), nodes.desired, nodes.min)
        return False

    def ready_at_last(self) -> None:
        self.emit(ev.ClusterReady(pool=self.pool_id, nodes=len(self.table),
                                  seconds=time.monotonic() - self.requested))

    def _join(self, stream: Iterator[Any], failures: list[BaseException]) -> None:
        """Connect nodes as the provider brings them up (Nodes(min=))."""
        try:
            for item in stream:
                if self.closed:
                    if not isinstance(item, BaseException):
                        self.cluster.stop([item])
                    continue
                if isinstance(item, BaseException):
                    failures.append(item)
                    log.warning("pool %s: a node failed to start: %s", self.pool_id, item)
                    self.emit(ev.Error(pool=self.pool_id, message=f"a node failed to start: {item}"))
                else:
                    self._join_one(item, failures)
                with self.changed:
                    self.joining -= 1
                    self.changed.notify_all()
        except BaseException as exc:  # the provider itself failed (before any node started)
            failures.append(exc)
            self.emit(ev.Error(pool=self.pool_id, message=str(exc)))
        finally:
            with self.changed:
                self.joining = 0
                self.changed.notify_all()
        missing = self.nodes.desired - len(self.table)
        if missing > 0 and not self.closed and self.table:
            try:  # one more go for the nodes that failed, all at once
                self.scale_to(self.nodes.desired)
            except Exception as exc:
                self.emit(ev.Error(pool=self.pool_id, message=(
                    f"the pool runs with {len(self.table)} of {self.nodes.desired} node(s): {exc}")))
                return
        if not self.closed:
            self.ready_at_last()

    def _join_one(self, endpoint: Any, failures: list[BaseException]) -> None:
        self.emit(ev.InstanceProvisioned(
            pool=self.pool_id, node=endpoint.index, hostname=endpoint.hostname, private_ip=endpoint.private_ip,
        ))
        try:
            ch = self.connect(endpoint)
        except Exception as exc:
            failures.append(exc)
            self.cluster.stop([endpoint])
            return
        with self.resize_lock:
            with self.lock:  # no tasks before its CONFIGURE (and its first health check)
                self._append(endpoint, ch, NodeState.UNCHECKED)
            self.emit(ev.InstanceBootstrapped(pool=self.pool_id, node=ch.node))
            self.emit(ev.ClusterProvisioned(pool=self.pool_id, nodes=len(self.table)))
            self.configure_all()
            if self.options.health_checker is None:
                self.mark_checked(ch)

    def add_nodes(self, count: int) -> None:
        if count <= 0:
            return  # a pool born asleep (Nodes(desired=0)): its first task starts a node
        endpoints = self.cluster.start(count)
        for e in endpoints:
            self.emit(ev.InstanceProvisioned(
                pool=self.pool_id, node=e.index, hostname=e.hostname, private_ip=e.private_ip,
            ))
        self.emit(ev.ClusterProvisioned(pool=self.pool_id, nodes=len(self.table) + len(endpoints)))
        head = endpoints[0] if not self.table else None  # a pool's first node is its head

        def connect(endpoint: Any) -> NodeChannel:
            ch = self.connect(endpoint)
            if endpoint is head:
                self.ask_state(endpoint, ch)  # where it serves collections, asked at once
            return ch

        with ThreadPoolExecutor(max_workers=min(16, len(endpoints))) as ex:
            channels = list(ex.map(connect, endpoints))
        for ch in channels:
            self.emit(ev.InstanceBootstrapped(pool=self.pool_id, node=ch.node))
        with self.lock:
            for endpoint, ch in zip(endpoints, channels, strict=True):
                self._append(endpoint, ch, self._first_state())
        self.configure_all()

    # -- one node's connection -------------------------------------------------------------------
    def connect(self, endpoint: Any) -> NodeChannel:
        ch = NodeChannel(
            endpoint.connect,  # (how to connect: a handshake turned away is tried again)
            node=endpoint.index,
            token=self.cluster.token,
            ttl=self.spec.ttl,
            on_output=self._print_output,
            on_lost=self._node_lost,
            on_metric=self._metric,
            on_submit=lambda origin, frame: self.on_nested(origin, frame),
            on_stopping=self._pool_stopped,
            agent_id=endpoint.agent_id,
        )
        ch.when_proven(lambda: self._compare_versions(ch))  # the versions a relay cannot have changed
        return ch

    def _compare_versions(self, ch: NodeChannel) -> None:
        """Warn, once per package, when a node has another version of a package this machine
        has too: values made of it may not unpickle on the other side (issue: a pinned
        Image(pip=["numpy==1.26.4"]) with numpy 2 here)."""
        from skyward.bootstrap import versions

        theirs = ch.facts.get("packages")
        if not isinstance(theirs, dict):
            return  # an agent of an older version: it does not say
        with self.lock:
            found = [d for d in versions.differences(versions.installed(), theirs) if d[0] not in self.drift]
            for name, here, there in found:
                self.drift[name] = (here, there, ch.node)
        if found:
            listed = ", ".join(f"{name} {there} (here {here})" for name, here, there in found)
            log.warning(
                "pool %s: node %d has other versions of packages this machine has too: %s. A value "
                "made of one of them (an argument, a result) may fail to unpickle on the other side; "
                "install the same version here, or pin the node's to this machine's in Image(pip=[...]).",
                self.name or self.pool_id, ch.node, listed)

    def _pool_stopped(self, node: int, message: str) -> None:
        """An agent says the pool is being stopped from outside (``skyward down``): say it once,
        and let the pool close this side (dispatch from now on raises PoolStoppedError)."""
        with self.lock:
            if self.stopped is not None or self.closed:
                return
            self.stopped = message
        log.warning("%s", message)
        self.on_stopped()

    def _metric(self, node: int, samples: list[dict[str, Any]]) -> None:
        if ev.bus.wants(self.pool_id, ev.Metric):
            for sample in samples:
                self.emit(ev.Metric(
                    pool=self.pool_id, node=node, name=sample["name"], value=float(sample["value"]),
                    unit=sample.get("unit", ""),
                ))

    def _node_lost(self, node: int, why: BaseException) -> None:
        if self.closed:
            return
        reason = str(why) or type(why).__name__
        try:
            reason = self.cluster.loss_reason(node, reason)
        except Exception:  # the provider's account is a courtesy: the loss itself must come out
            log.debug("pool %s: the provider could not say why node %d was lost", self.pool_id, node, exc_info=True)
        log.warning("pool %s: node %d was lost (%s)", self.pool_id, node, reason)
        with self.lock:  # one that never passed a check stays UNCHECKED: its loss is a failed attempt
            for m in self.table:
                if m.channel.node == node and m.state is NodeState.READY:
                    m.state = NodeState.LOST
        self.emit(ev.InstanceLost(pool=self.pool_id, node=node, reason=reason))
        try:
            self.cluster.node_lost(node)
        except Exception:  # the provider's bookkeeping must not break the pool
            log.exception("pool %s: the provider failed to drop lost node %d", self.pool_id, node)
        self.on_lost(node, why)

    def _print_output(self, node: int, task: int, stream: int, data: bytes) -> None:
        text = secrets.redact(data.decode("utf-8", "replace"))
        if ev.bus.wants(self.pool_id, ev.Log):
            self.emit(ev.Log(pool=self.pool_id, level="stderr" if stream == 2 else "stdout", message=text, node=node))
        lines = text.splitlines()
        out = sys.stderr if stream == 2 else sys.stdout
        prefix = f"[node {node}] "
        with self._print_lock:
            try:
                out.write("".join(prefix + line + "\n" for line in lines))
                out.flush()
            except (OSError, ValueError):
                pass

    # -- configuring the nodes -------------------------------------------------------------------
    def _node_plugins(self) -> str | None:
        """The plugins' node-side hooks as they travel in CONFIGURE (computed once)."""
        if not self.spec.plugins:
            return None
        if self._plugins_blob is None:
            from ..plugins.compose import encode_for_nodes

            self._plugins_blob = encode_for_nodes(self.spec.plugins)
        return self._plugins_blob

    def configure_all(self, spread: bool = True) -> None:
        """Tell every node the pool as it is now: its rank and peers, the worker settings, the
        metrics, the plugins and where the collections are served (``spread``: and, in a pool of
        several groups, the other groups' nodes their new pool-wide places)."""
        pairs = self.pairs()
        common = {  # the same for every node: encoded once
            "worker": self.worker.agent_settings(),
            "metrics": to_config(self.spec.image.metrics),  # Image normalized them already
            "spill": str(self.cluster.spill_dir) if self.cluster.spill_dir else None,
            "plugins": self._node_plugins(),
            "state": self.state_address(pairs),  # where the head node serves collections
        }
        wide = self.layout(self) if self.layout is not None else None  # the pool's, once for every node
        peers = self._peers(pairs)
        encoded = _SharedJSON()
        with together():  # (links that share a connection: one write for all of them)
            for position, (_, ch) in enumerate(pairs):
                ch.configure(encoded.dumps({"topology": self.topology(position, pairs, wide, peers), **common}))
        if spread and self.on_configured is not None:
            self.on_configured(self)

    @staticmethod
    def _peers(pairs: Pairs) -> list[dict[str, Any]]:
        return [{"node": i, "private_ip": e.private_ip, "public_ip": e.public_ip} for i, (e, _) in enumerate(pairs)]

    def topology(self, position: int, pairs: Pairs, pool: dict[str, Any] | None = None,
                 peers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """What ``sky.instance_info()`` says on the node at ``position`` (``pool``: the pool-wide
        part in a pool of several groups, from ``layout``; ``peers``: the group's, made once
        for all its nodes)."""
        acc = self.spec.accelerator
        assert acc is None or not isinstance(acc, str)  # Spec converts strings
        count = float(getattr(acc, "count", 0) or 0)
        peers = self._peers(pairs) if peers is None else peers
        head_addr, head_port = pairs[0][0].private_ip, self.cluster.head_port
        # The group's own world (what framework plugins build theirs over), and the pool's.
        group = {"group": self.group, "group_rank": position, "group_size": len(pairs), "group_peers": peers,
                 "group_head_addr": head_addr, "group_head_port": head_port}
        wide = {"node": position, "total_nodes": len(pairs), "peers": peers, "head_addr": head_addr,
                "head_port": head_port}
        if pool is not None:
            wide = {**pool, "node": pool["offset"] + position}
            del wide["offset"]
        return {
            **wide,
            **group,
            "job_id": self.pool_id,
            "accelerators": count,
            "total_accelerators": count * len(pairs),
            "accelerator": None if acc is None else {
                "type": acc.name, "count": count, "memory_gb": acc.memory_gb,
                "is_trainium": acc.name.lower().startswith("trainium"),
            },
            "network": {"interface": self.cluster.interface, "bandwidth_gbps": None},
        }

    # -- size ------------------------------------------------------------------------------------
    def check_growth(self, current: int, target: int) -> None:
        """Raise ProviderError when the pool may not grow from ``current`` to ``target`` nodes now
        (its max_duration deadline is near: Cluster.no_growth)."""
        refused = self.cluster.no_growth() if target > current else None
        if refused is not None:
            raise ProviderError(f"the pool does not grow from {current} to {target} node(s): {refused}")

    def scale_to(self, target: int, idle: float | None = None) -> None:
        """Add or remove nodes (the last ranks leave, once their running tasks are done). ``idle``:
        how long the pool had been idle, when the autoscaler shrinks it (said when it sleeps)."""
        with self.resize_lock:
            with self.lock:
                current = len(self.table)
            if target > current:
                self.check_growth(current, target)
                self.emit(ev.InstanceRequested(pool=self.pool_id, provider=self.spec.provider.kind,
                                               count=target - current))
                self.add_nodes(target - current)
                return
            if target == current:
                return
            with self.lock:
                gone, self.table = self.table[target:], self.table[:target]
            leaving = [m.channel for m in gone]
            endpoints = [m.endpoint for m in gone]
            for hook in list(self.on_leaving):
                try:
                    hook(gone)
                except Exception:
                    log.exception("pool %s: a hook for the nodes leaving failed", self.name or self.pool_id)
            deadline = time.monotonic() + self.options.shutdown_timeout
            while any(ch.inflight for ch in leaving) and time.monotonic() < deadline:
                self.stop.wait(0.05)
            for ch in leaving:
                ch.close(shutdown_agent=True)
            self.cluster.stop(endpoints)
            for ch in leaving:
                self.emit(ev.InstanceDestroyed(pool=self.pool_id, node=ch.node))
            if target == 0:  # asleep: the head went, and the collections' state with it
                why = f"after {idle:.0f} s idle" if idle is not None else "by a resize"
                self.on_head_gone(f"the pool scaled to zero nodes {why}, and its head node, which held them, "
                                  f"stopped")
                log.info("pool %s: asleep (no node) %s", self.name or self.pool_id, why)
                self.emit(ev.ClusterAsleep(pool=self.pool_id, idle_seconds=idle or 0.0))
            self.configure_all()

    # -- the lease -------------------------------------------------------------------------------
    def start_heartbeat(self, ttl: float) -> None:
        threading.Thread(target=self._heartbeat, args=(ttl,), name="skyward-lease", daemon=True).start()

    def _heartbeat(self, ttl: float) -> None:
        interval = max(0.2, min(2.0, ttl / 4)) if ttl > 0 else 2.0
        # A node silent this long (no answer to a ping, no byte at all) is lost: its tasks move.
        limit = max(10.0, 5 * interval)
        while not self.stop.wait(interval):
            for ch in self.channels:
                ch.ping()
            for ch in self.channels:
                ch.check_silence(limit)
            for tick in list(self.on_heartbeat):
                try:
                    tick()
                except Exception:  # a check must never stop the lease
                    log.exception("pool %s: a heartbeat check failed", self.pool_id)

    def close(self) -> list[NodeChannel] | None:
        """Mark the pool closed and hand back its channels (None when it already was)."""
        with self.changed:
            if self.closed:
                return None
            self.closed = True
            table, self.table = self.table, []
            self.changed.notify_all()
        self.stop.set()
        return [m.channel for m in table]

    # -- for healing: a node's readiness ---------------------------------------------------------
    def at(self, rank: int, ch: NodeChannel) -> Any | None:
        """The endpoint at ``rank`` if ``ch`` is still the node there (else None)."""
        with self.lock:
            m = self._at(rank, ch)
            return m.endpoint if m is not None else None

    def claim_for_replacement(self, rank: int, ch: NodeChannel) -> bool | None:
        """Mark ``ch`` (at ``rank``) as being replaced; None when it needs no replacement (the
        pool closed, it is being replaced or given up, or it left); else whether it had never
        passed a health check."""
        with self.lock:
            m = self._at(rank, ch)  # None: the pool shrank past it meanwhile
            if self.closed or m is None or m.state in (NodeState.REPLACING, NodeState.GIVEN_UP):
                return None
            unchecked = m.state is NodeState.UNCHECKED
            m.state = NodeState.REPLACING
            return unchecked

    def replaced(self, ch: NodeChannel) -> None:
        """The replacement of ``ch`` ended, however it did (a node swapped in has left the old
        one's record behind; one given up stays so)."""
        with self.changed:
            m = self._member(ch)
            if m is not None and m.state is NodeState.REPLACING:
                m.state = NodeState.LOST
            self.changed.notify_all()

    def swap(self, rank: int, old: NodeChannel, endpoint: Any, ch: NodeChannel) -> bool:
        """Put a new node in ``old``'s place (unchecked until configured); False when the pool
        closed or shrank past ``rank`` meanwhile."""
        with self.changed:
            if self.closed or self._at(rank, old) is None:
                return False
            # no tasks before its CONFIGURE (and its first health check)
            self.table[rank] = Member(rank, endpoint, ch, NodeState.UNCHECKED)
            return True

    def insert(self, rank: int, endpoint: Any, ch: NodeChannel) -> None:
        """A node in place of a dead one of an attached pool, at ``rank``."""
        with self.lock:
            self.table.insert(rank, Member(rank, endpoint, ch, self._first_state()))
            for later in self.table[rank + 1:]:
                later.rank += 1

    def rank_for_index(self, index: int) -> int:
        with self.lock:
            return sum(1 for m in self.table if m.endpoint.index < index)

    def mark_checked(self, ch: NodeChannel) -> bool:
        """``ch`` takes tasks from now on; False when it already did (or no longer can)."""
        with self.changed:
            m = self._member(ch)
            if m is None or m.state is not NodeState.UNCHECKED:
                return False
            m.state = NodeState.READY
            self.changed.notify_all()
            return True

    def give_up(self, ch: NodeChannel, error: BaseException) -> int:
        """``ch`` will not be replaced; returns how many nodes are still ready."""
        with self.changed:
            m = self._member(ch)
            if m is not None:
                m.state, m.why = NodeState.GIVEN_UP, error
            self.changed.notify_all()
            return len(self.ready())

    def warming(self) -> bool:
        """Whether a node has yet to pass its first health check: one unchecked, or one being
        replaced (its replacement comes unchecked)."""
        with self.lock:
            return any(m.state in (NodeState.UNCHECKED, NodeState.REPLACING) for m in self.table)

    def ranks_of(self, node: int) -> list[tuple[int, NodeChannel]]:
        with self.lock:
            return [(m.rank, m.channel) for m in self.table if m.channel.node == node]


def together() -> contextlib.AbstractContextManager[None]:
    """Frames this thread sends to many nodes in the block leave in one write where the links
    share a connection (bootstrap/muxlink.batch); nothing where no multiplexer exists in this
    process, which needs muxlink imported first (Remote.reach does): a Local pool's start does
    not load it."""
    muxlink = sys.modules.get("skyward.bootstrap.muxlink")
    return contextlib.nullcontext() if muxlink is None else muxlink.batch()


class _SharedJSON:
    """JSON of many dicts that share large lists (every node's configuration holds the peer
    lists of its group and of the pool): each list object is encoded once and its text put
    into each dict's. At 1,000 nodes a configuration is 120 KB, 1.2 ms to encode, once per node
    whenever the pool changes; the lists are most of it."""

    _LARGE = 16  # lists shorter than this are encoded in place

    def __init__(self) -> None:
        self._texts: dict[int, tuple[list[Any], str]] = {}  # id -> (the list, kept alive; its JSON)

    def dumps(self, value: Any) -> bytes:
        return self._text(value).encode()

    def _text(self, value: Any) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{json.dumps(str(k))}: {self._text(v)}" for k, v in value.items()) + "}"
        if isinstance(value, list) and len(value) >= self._LARGE:
            known = self._texts.get(id(value))
            if known is None or known[0] is not value:
                known = self._texts[id(value)] = (value, json.dumps(value))
            return known[1]
        return json.dumps(value)
