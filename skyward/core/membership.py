"""Node membership: connecting nodes, configuring their topology, noticing lost nodes,
the lease heartbeat, resizing and autoscaling. A mixin of ``Pool`` (skyward.core.pool)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from skyward.bootstrap.channel import NodeChannel

from ..metrics import to_config
from ..observe import events as ev
from ..observe import secrets
from ..spec import Nodes, NodeSpec
from .autoscale import ScaleState, decide
from .dispatch import Dispatch

log = logging.getLogger("skyward")


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


class Membership(Dispatch):
    """Which nodes the pool has, and keeping that true."""

    _endpoints: list[Any]
    _nodes: Nodes
    _resize_lock: threading.Lock
    _print_lock: threading.Lock
    _autoscaler: threading.Thread | None
    _stop: threading.Event
    name: str | None

    def _node_plugins(self) -> str | None:
        """The plugins' node-side hooks as they travel in CONFIGURE (computed once)."""
        if not self.spec.plugins:
            return None
        if not hasattr(self, "_plugins_blob"):
            from ..plugins.compose import encode_for_nodes

            self._plugins_blob = encode_for_nodes(self.spec.plugins)
        return self._plugins_blob

    def _heartbeat(self, ttl: float) -> None:
        interval = max(0.2, min(2.0, ttl / 4)) if ttl > 0 else 2.0
        # A node silent this long (no answer to a ping, no byte at all) is lost: its tasks move.
        limit = max(10.0, 5 * interval)
        while not self._stop.wait(interval):
            for ch in list(self._channels):
                ch.ping()
            for ch in list(self._channels):
                ch.check_silence(limit)

    def _add_nodes(self, count: int) -> None:
        endpoints = self._cluster.start(count)
        for e in endpoints:
            self._emit(ev.InstanceProvisioned(
                pool=self.id, node=e.index, hostname=e.hostname, private_ip=e.private_ip,
            ))
        self._emit(ev.ClusterProvisioned(pool=self.id, nodes=len(self._channels) + len(endpoints)))
        with ThreadPoolExecutor(max_workers=min(16, len(endpoints))) as ex:
            channels = list(ex.map(self._connect, endpoints))
        for ch in channels:
            self._emit(ev.InstanceBootstrapped(pool=self.id, node=ch.node))
        with self._lock:
            self._endpoints.extend(endpoints)
            self._channels.extend(channels)
        self._configure_all()

    def _connect(self, endpoint: Any) -> NodeChannel:
        ch = self._open_channel(endpoint)
        self._compare_versions(ch)
        return ch

    def _compare_versions(self, ch: NodeChannel) -> None:
        """Warn, once per package, when a node has another version of a package this machine
        has too: values made of it may not unpickle on the other side (issue: a pinned
        Image(pip=["numpy==1.26.4"]) with numpy 2 here)."""
        from skyward.bootstrap import versions

        theirs = ch.facts.get("packages")
        if not isinstance(theirs, dict):
            return  # an agent of an older version: it does not say
        with self._lock:
            found = [d for d in versions.differences(versions.installed(), theirs) if d[0] not in self._drift]
            for name, here, there in found:
                self._drift[name] = (here, there, ch.node)
        if found:
            listed = ", ".join(f"{name} {there} (here {here})" for name, here, there in found)
            log.warning(
                "pool %s: node %d has other versions of packages this machine has too: %s. A value "
                "made of one of them (an argument, a result) may fail to unpickle on the other side; "
                "install the same version here, or pin the node's to this machine's in Image(pip=[...]).",
                self.name or self.id, ch.node, listed)

    def _open_channel(self, endpoint: Any) -> NodeChannel:
        return NodeChannel(
            endpoint.connect(),
            node=endpoint.index,
            token=self._cluster.token,
            ttl=self.spec.ttl,
            on_output=self._print_output,
            on_lost=self._node_lost,
            on_metric=self._metric,
            on_submit=self._route_nested,
            on_stopping=self._pool_stopped,
        )

    def _pool_stopped(self, node: int, message: str) -> None:
        """An agent says the pool is being stopped from outside (``skyward down``): say it once,
        and close this side in the background (dispatch from now on raises PoolStoppedError)."""
        with self._lock:
            if self._stopped is not None or self._closed:
                return
            self._stopped = message
        log.warning("%s", message)
        close: Any = getattr(self, "close")  # noqa: B009 - the Pool's, which this is a part of
        threading.Thread(target=close, name="skyward-stopped", daemon=True).start()

    def _metric(self, node: int, sample: dict[str, Any]) -> None:
        if ev.bus.wants(self.id, ev.Metric):
            self._emit(ev.Metric(
                pool=self.id, node=node, name=sample["name"], value=float(sample["value"]),
                unit=sample.get("unit", ""),
            ))

    def _node_lost(self, node: int, why: BaseException) -> None:
        if not self._closed:
            log.warning("pool %s: node %d was lost (%s)", self.id, node, why)
            self._emit(ev.InstanceLost(pool=self.id, node=node, reason=str(why) or type(why).__name__))
            try:
                self._cluster.node_lost(node)
            except Exception:  # the provider's bookkeeping must not break the pool
                log.exception("pool %s: the provider failed to drop lost node %d", self.id, node)

    def _configure_all(self) -> None:
        with self._lock:
            pairs = list(zip(self._endpoints, self._channels, strict=True))
        settings = self.worker.agent_settings()
        metrics = to_config(self.spec.image.metrics)  # Image normalized them already
        state = self._state_address(pairs)  # where the head node serves collections (dispatch.py)
        for position, (_, ch) in enumerate(pairs):
            ch.configure({
                "topology": self._topology(position, pairs),
                "worker": settings,
                "metrics": metrics,
                "spill": str(self._cluster.spill_dir) if self._cluster.spill_dir else None,
                "plugins": self._node_plugins(),
                "state": state,
            })

    def _topology(self, position: int, pairs: list[tuple[Any, NodeChannel]]) -> dict[str, Any]:
        acc = self.spec.accelerator
        assert acc is None or not isinstance(acc, str)  # Spec converts strings
        count = float(getattr(acc, "count", 0) or 0)
        return {
            "node": position,
            "total_nodes": len(pairs),
            "head_addr": pairs[0][0].private_ip,
            "head_port": self._cluster.head_port,
            "job_id": self.id,
            "peers": [
                {"node": i, "private_ip": e.private_ip, "public_ip": e.public_ip}
                for i, (e, _) in enumerate(pairs)
            ],
            "accelerators": count,
            "total_accelerators": count * len(pairs),
            "accelerator": None if acc is None else {
                "type": acc.name, "count": count, "memory_gb": acc.memory_gb,
                "is_trainium": acc.name.lower().startswith("trainium"),
            },
            "network": {"interface": self._cluster.interface, "bandwidth_gbps": None},
        }

    def current_nodes(self) -> int:
        """How many nodes are connected and ready now."""
        return sum(1 for ch in self._channels if ch.lost is None)

    @property
    def is_active(self) -> bool:
        """True from the moment the pool is ready until it is closed."""
        return not self._closed

    @property
    def concurrency(self) -> int:
        """How many tasks the pool runs at once: the ready nodes' slots together."""
        return self.current_nodes() * self.worker.slots

    def snapshot(self) -> PoolSnapshot:
        """The nodes as they are now: rank, state, host, slots and the tasks each is running."""
        with self._lock:
            pairs = list(zip(self._endpoints, self._channels, strict=False))
        slots = self.worker.slots
        nodes = []
        for rank, (endpoint, ch) in enumerate(pairs):
            inflight = ch.inflight
            nodes.append(NodeSnapshot(
                rank=rank, node=ch.node, state="ready" if ch.lost is None else "lost",
                host=endpoint.hostname, private_ip=endpoint.private_ip, public_ip=endpoint.public_ip,
                slots=slots, running=min(inflight, slots), queued=max(0, inflight - slots),
            ))
        return PoolSnapshot(pool=self.id, name=self.name, active=self.is_active, nodes=tuple(nodes))

    def resize(self, nodes: NodeSpec) -> None:
        """Change the pool's size (and, with sky.Nodes, its elastic range) now.

        Removed nodes finish their running tasks first. With ``Nodes(desired, max=...)`` the
        pool keeps autoscaling between ``desired`` and ``max``.
        """
        self._check_open()
        target = Nodes.of(nodes)
        if isinstance(nodes, int) and self._nodes.max is not None and target.desired <= self._nodes.max:
            target = Nodes(desired=target.desired, max=self._nodes.max)  # keep the elastic range
        self._nodes = target
        self._scale_to(target.desired)
        self._start_autoscaler()

    def _scale_to(self, target: int) -> None:
        with self._resize_lock:
            with self._lock:
                current = len(self._channels)
            if target > current:
                self._add_nodes(target - current)
                return
            if target == current:
                return
            with self._lock:
                leaving = self._channels[target:]
                endpoints = self._endpoints[target:]
                self._channels = self._channels[:target]
                self._endpoints = self._endpoints[:target]
            deadline = time.monotonic() + self.options.shutdown_timeout
            while any(ch.inflight for ch in leaving) and time.monotonic() < deadline:
                self._stop.wait(0.05)
            for ch in leaving:
                ch.close(shutdown_agent=True)
            self._cluster.stop(endpoints)
            for ch in leaving:
                self._emit(ev.InstanceDestroyed(pool=self.id, node=ch.node))
            self._configure_all()

    # -- elastic pools -----------------------------------------------------------------------
    def _start_autoscaler(self) -> None:
        if self._nodes.max is None or self._nodes.max <= self._nodes.desired:
            return
        with self._lock:
            if self._autoscaler is not None or self._closed:
                return
            self._autoscaler = threading.Thread(target=self._autoscale, name="skyward-autoscale", daemon=True)
        self._autoscaler.start()

    def _autoscale(self) -> None:
        """Tasks already queued on a node stay there; new nodes take their share of what is
        dispatched after they join (round-robin for >>, the next chunks of a running map)."""
        state = ScaleState(last_change=time.monotonic())
        while not self._stop.wait(min(1.0, self.options.reconcile_tick_interval)):
            with self._lock:
                live = [ch for ch in self._channels if ch.lost is None]
                size = len(self._channels)  # a lost node being replaced still counts: no scale-up
            busy = sum(ch.inflight for ch in live)
            target = decide(self._nodes, size, busy, self.worker.slots, time.monotonic(),
                            state, self.options)
            if target is None:
                continue
            log.info("autoscale: %d task(s) in flight on %d node(s); scaling to %d", busy, len(live), target)
            try:
                self._scale_to(target)
            except Exception as exc:  # a failed scale step must not end the pool
                if self._closed:
                    return
                log.warning("autoscale step failed: %s", exc)

    # -- output ------------------------------------------------------------------------------
    def _print_output(self, node: int, task: int, stream: int, data: bytes) -> None:
        text = secrets.redact(data.decode("utf-8", "replace"))
        if ev.bus.wants(self.id, ev.Log):
            self._emit(ev.Log(pool=self.id, level="stderr" if stream == 2 else "stdout", message=text, node=node))
        lines = text.splitlines()
        out = sys.stderr if stream == 2 else sys.stdout
        prefix = f"[node {node}] "
        with self._print_lock:
            try:
                out.write("".join(prefix + line + "\n" for line in lines))
                out.flush()
            except (OSError, ValueError):
                pass
