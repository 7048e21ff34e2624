"""A cloud pool's life as stack updates: create, grow, shrink, destroy.

The provider (sky.AWS, sky.GCP) builds the first PoolPlan and hands it here with its stack
program. Growing adds nodes to the plan and runs ``up``; shrinking removes them and runs
``up``; closing refreshes, destroys and removes the stack (its history saved first). Each
``up`` records the pool's whole description (spec, offer, plan, skyward version) in the stack
config, so the stack alone says what the pool was and how to make it again.

What comes out is a NodeAddress per node: where to connect, as whom, with which key, and the
host key the node will present -- the input of the SSH bootstrap.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyward.errors import ProviderError, StackError
from skyward.observe import events as ev
from skyward.version import __version__

from . import keys, notes
from .engine import Connect, PoolStack, local_connect
from .plan import NodePlan, PoolPlan, PortPlan

if TYPE_CHECKING:
    from skyward.catalogue import Offer
    from skyward.spec import Spec

# The spot fallback, the same on both clouds: with allocation="spot-if-available", spot nodes
# whose update failed for want of spot capacity or spot quota are asked for again on-demand,
# once, and the log says so and why; allocation="spot" never falls back. (An on-demand quota
# error is not a reason: on-demand would hit it too.)
_NO_SPOT = re.compile(
    r"InsufficientInstanceCapacity|InsufficientCapacity|SpotMaxPriceTooLow|MaxSpotInstanceCountExceeded|"
    r"capacity-not-available|UnfulfillableCapacity|ZONE_RESOURCE_POOL_EXHAUSTED|resource pool exhausted|"
    r"does not have enough resources|stockout|Quota '(?:PREEMPTIBLE_[A-Z0-9_]+)' exceeded",
    re.IGNORECASE,
)
# Errors of a first creation that another zone of the region may not have.
# Matched by the clouds' own sentences: AWS's "Unsupported" code also answers launch requests no
# zone would take ("The requested configuration is currently not supported"), and GCP's
# "Unsupported ..." errors are about the request, not the zone.
_NO_ZONE_CAPACITY = re.compile(
    r"InsufficientInstanceCapacity|ZONE_RESOURCE_POOL_EXHAUSTED|resource pool exhausted|"
    r"does not have enough resources|is not supported in your requested Availability Zone|"
    r"not available in zone|Machine type with name '[^']+' does not exist in zone|UnfulfillableCapacity",
    re.IGNORECASE,
)
# A grant right after its service account was made may not see it yet (IAM is eventually
# consistent: Google's IAM overview, "Consistency"; terraform-provider-google #2939, #18024); the
# provider's own read right after the create may get a 404 or a 403 "(or it may not exist)"
# (#15042); and a create retried after its answer was lost finds the account made (#18087; the
# programs set create_ignore_already_exists, GoogleCloudPlatform/magic-modules #10813, so this
# one is a second line of defence).
_SA_NOT_VISIBLE = re.compile(
    r"Service account \S+ does not exist|serviceAccount:\S+ does not exist|"
    r"Error reading Service Account[^\n]*Error 40[34]|"
    r"'?iam\.serviceAccounts\.get'? denied[^\n]*may not exist|"
    r"Service account \S+ already exists",
    re.I,
)
# Compute Engine's answer to an insert naming a service account it cannot see yet. It reads as a
# missing iam.serviceAccounts.actAs, so it is a race only where the preflight saw that one held.
_SA_NO_ACCESS = re.compile(r"The user does not have access to service account", re.I)
_IAM_RETRY_SECONDS = (10.0, 20.0, 40.0, 60.0)
_MAX_ZONE_ATTEMPTS = 6  # AWS: the program knows the zones; the pool stops asking after this many


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """One node as its stack's outputs and plan describe it."""

    index: int
    address: str  # public IP: where the client connects
    private_ip: str
    hostname: str
    host_key: str  # the public host key the node was given (no trust on first use)
    user: str
    key: str  # path of the pool's private client key
    instance_id: str = ""
    port: int = 22


    def host_fields(self) -> dict[str, Any]:
        """Keyword arguments of skyward.providers.ssh.Host."""
        return {"address": self.address, "port": self.port, "user": self.user, "key": self.key,
                "private_ip": self.private_ip, "hostname": self.hostname, "host_key": self.host_key}


class CloudPool:
    """The stack of one cloud pool and the plan it was last brought up with."""

    def __init__(
        self,
        plan: PoolPlan,
        program: Callable[[PoolPlan], Any],
        *,
        pool_id: str,
        key_path: Path,
        spot: bool,
        fallback_to_on_demand: bool,
        record: dict[str, Any] | None = None,
        secrets: dict[str, str] | None = None,
        plugins: dict[str, str] | None = None,
        connect: Connect | None = None,
        backend: str | None = None,
        track: str | None = None,
        markets: dict[str, tuple[bool, bool]] | None = None,
    ) -> None:
        from .backend import backend_url

        self.plan = plan
        self.backend = backend or backend_url()  # where the stack lives (PULUMI_BACKEND_URL at creation)
        self.pool_id = pool_id
        self.key_path = key_path
        self.spot = spot
        self.fallback = fallback_to_on_demand
        self._record = record or {}
        self._secrets = secrets or {}
        self._lock = threading.Lock()
        self._closed = False
        self._by_address: dict[str, int] = {}
        # An unnamed pool's kind ("aws"/"gcp"): it leaves a note (notes.py) while it exists,
        # so that `skyward ls` / `down --expired` find it if this process dies without teardown.
        self._track = track
        # The pool's lock (skyward.records.pkglock), once its nodes installed it: kept in the stack config.
        self._lock_json: str | None = None
        # A pool of several groups (plan.groups): each group's market (spot, fallback allowed),
        # and the groups whose clusters closed (the last one destroys the stack).
        self._markets = {g: _Market(*m) for g, m in (markets or {}).items()}
        self._closed_groups: set[str] = set()
        self.stack = PoolStack(
            plan.stack, _Program(self, program), pool=pool_id, plugins=plugins or {},
            connect=connect or local_connect,
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, count: int) -> list[NodeAddress]:
        """The first ``up``; anything it created is destroyed again when it fails."""
        return self.start_groups({"": count})[""]

    def start_groups(self, counts: dict[str, int]) -> dict[str, list[NodeAddress]]:
        """The first ``up`` of a pool of several groups: every group's nodes in one update
        (``{"": count}``: a pool of one kind of node). Anything it created is destroyed again
        when it fails."""
        try:
            if self._track:
                notes.note(self, self._track)  # before anything exists in the cloud
            nodes = self._grow(counts)
            if self._track:
                notes.note(self, self._track)  # with what the first up pinned
            return nodes
        except BaseException as exc:
            self._emit(ev.Log(pool=self.pool_id, level="WARNING",
                              message=f"stack {self.plan.stack}: creating the pool failed ({exc}); removing what was made"))
            try:
                self.close()
            except Exception as cleanup:  # the first error is the one to show; this one is logged too
                self._emit(ev.Error(pool=self.pool_id, message=str(cleanup)))
            raise

    def grow(self, count: int, group: str = "") -> list[NodeAddress]:
        """Add ``count`` nodes (to ``group``, in a pool of several; one stack update) and return
        them. When the update fails the plan is put back as it was, so the next update does not
        create nodes that never came."""
        return self._grow({group: count})[group]

    def _grow(self, counts: dict[str, int]) -> dict[str, list[NodeAddress]]:
        with self._lock:
            before = self.plan
            new: tuple[NodePlan, ...] = ()
            for group, count in counts.items():
                new += self._new_nodes(count, group, taken=new)
            self.plan = before.with_nodes(before.nodes + new)
            try:
                outputs = self._up_with_retries(before, new, len(new))
            except BaseException:
                self.plan = before
                raise
            self._pin(outputs)
            return {g: self._addresses(outputs, [n.index for n in new if n.group == g]) for g in counts}

    def _up_with_retries(self, before: PoolPlan, new: tuple[NodePlan, ...], count: int) -> dict[str, Any]:
        """``up``, trying the next zone on a first creation that found no capacity (or a zone
        without the type), then on-demand for spot nodes when allowed."""
        first = not before.nodes and not (before.settings.get("pinned") or {})
        iam_waits = list(_IAM_RETRY_SECONDS)
        while True:
            try:
                return self._up()
            except StackError as exc:
                text = f"{exc} {exc.output}"
                race = _SA_NOT_VISIBLE.search(text)
                if race is None and self._act_as_confirmed():
                    race = _SA_NO_ACCESS.search(text)
                if iam_waits and race:
                    wait = iam_waits.pop(0)
                    self._emit(ev.Log(pool=self.pool_id, level="WARNING", message=(
                        f"stack {self.plan.stack}: a new service account is not visible to IAM yet "
                        f"({race.group(0)}); updating again in {wait:g}s")))
                    time.sleep(wait)
                    continue
                zone_error = _NO_ZONE_CAPACITY.search(text)
                if first and not self.plan.zone and zone_error and self._next_zone():
                    self._emit(ev.Log(pool=self.pool_id, level="WARNING", message=(
                        f"stack {self.plan.stack}: the zone had no capacity for {self.plan.instance_type} "
                        f"({zone_error.group(0)}); trying the next zone of {self.plan.region}")))
                    continue
                no_spot = _NO_SPOT.search(text)
                # The groups whose new nodes may go on-demand (the pool itself: group "").
                falling = {n.group for n in new if n.spot and self._market(n.group).fallback}
                if falling and no_spot:
                    moved = sum(1 for n in new if n.group in falling)
                    self._emit(ev.Log(pool=self.pool_id, level="WARNING", message=(
                        f"stack {self.plan.stack}: {moved} node(s) went on-demand: spot was refused "
                        f"({no_spot.group(0)}) and allocation is spot-if-available")))
                    new = tuple(replace(n, spot=False) if n.group in falling else n for n in new)
                    settings = {k: v for k, v in self.plan.settings.items() if k != "zone_attempt"}
                    self.plan = replace(self.plan, nodes=before.nodes + new, settings=settings)
                    for group in falling:
                        self._market(group).fallback = False
                    continue
                raise

    def _act_as_confirmed(self) -> bool:
        """Whether the GCP preflight saw this caller hold iam.serviceAccounts.actAs on the project."""
        from .gcp_permissions import confirmed

        return confirmed(str(self.plan.settings.get("project") or ""), "iam.serviceAccounts.actAs")

    def _next_zone(self) -> bool:
        """Move a plan that has not been created yet to its next candidate zone (False: none left)."""
        settings = dict(self.plan.settings)
        attempt = int(settings.get("zone_attempt") or 0) + 1
        zones = settings.get("zones")
        if attempt >= (len(zones) if zones else _MAX_ZONE_ATTEMPTS):
            return False
        settings["zone_attempt"] = attempt
        self.plan = replace(self.plan, settings=settings)
        return True

    def _pin(self, outputs: dict[str, Any]) -> None:
        """Record what the first update looked up (image, subnet, zone) in the plan: every later
        update uses these, so nothing it looked up again can replace a running node."""
        placement = {k: v for k, v in (outputs.get("placement") or {}).items() if v}
        if placement and placement != self.plan.settings.get("pinned"):
            self.plan = replace(self.plan, settings={**self.plan.settings, "pinned": placement})

    def replace(self, gone: Any) -> tuple[NodeAddress, str | None]:
        """A new node in place of lost node ``gone`` (index, NodeAddress or ssh Host): refresh
        (the state learns what the cloud did), then one update that drops the old instance and
        creates the new one -- one more entry in the stack's history. Returns the new node and,
        when the old one was a spot instance the cloud took back, why (else None)."""
        index = self._index_of(gone)
        with self._lock:
            try:
                self.stack.refresh()
            except StackError as exc:  # the update below still replaces the node
                self._emit(ev.Log(pool=self.pool_id, level="WARNING",
                                  message=f"stack {self.plan.stack}: refresh before replacing node {index} failed: {exc}"))
            reclaimed = self._reclaimed(index)
            previous = self.plan
            group = next((n.group for n in previous.nodes if n.index == index), "")
            new = self._new_nodes(1, group)  # numbered after every node so far: never the lost one's index
            before = previous.with_nodes(tuple(n for n in previous.nodes if n.index != index))
            self.plan = before.with_nodes(before.nodes + new)
            try:
                outputs = self._up_with_retries(before, new, 1)
            except BaseException:
                self.plan = previous
                raise
            self._pin(outputs)
            return self._addresses(outputs, [new[0].index])[0], reclaimed

    def _reclaimed(self, index: int) -> str | None:
        """Why a lost spot node went away when the refreshed state says the cloud stopped or
        removed its instance; None for on-demand nodes and instances still running."""
        node = next((n for n in self.plan.nodes if n.index == index), None)
        if node is None or not node.spot:
            return None
        try:
            resources = (self.stack.export().get("deployment") or {}).get("resources") or []
        except StackError:
            return None
        for r in resources:
            urn = r.get("urn")
            if urn == index or str(urn).endswith(f"::node-{index}"):
                outputs = r.get("outputs") or {}
                # aws.ec2.Instance: instanceState; gcp.compute.Instance: currentStatus (TERMINATED is
                # a stopped VM); gcp.tpu.V2Vm: state (a preempted TPU VM stays PREEMPTED until deleted).
                state = str(outputs.get("instanceState") or outputs.get("currentStatus") or outputs.get("state")
                            or outputs.get("status") or "").lower()
                if state in ("terminated", "shutting-down", "stopped", "stopping", "suspended", "suspending",
                             "preempted"):
                    return f"the cloud stopped its spot instance (state {state})"
                return None
        return "the cloud removed its spot instance (a refresh found it gone)"

    def shrink(self, nodes: Iterable[Any]) -> None:
        """Remove these nodes (indices, NodeAddresses or ssh Hosts) from the pool: one stack update.
        Down to no node at all, that update leaves the pool asleep (``Nodes(desired=0)``): its
        network, security group and key pair stay, no instance does, and it costs nothing until
        ``grow`` wakes it. (Closing destroys the stack instead, without shrinking first.)"""
        gone = {self._index_of(n) for n in nodes}
        with self._lock:
            if not gone or self._closed:
                return
            self.plan = self.plan.with_nodes(tuple(n for n in self.plan.nodes if n.index not in gone))
            self._up()

    def open_port(self, node: int, port: int, cidrs: Sequence[str]) -> None:
        """Let ``cidrs`` reach TCP ``port`` of node ``node`` (index), and no other node: one stack
        update (``plan.serve_ports``; the programs declare the rule). When the update fails the
        plan is put back and the error goes on."""
        with self._lock:
            if self._closed:
                raise ProviderError(f"stack {self.plan.stack}: the pool is closed; no port can be opened")
            before = self.plan
            kept = tuple(p for p in before.serve_ports if (p.node, p.port) != (node, port))
            self.plan = replace(before, serve_ports=(*kept, PortPlan(node, port, tuple(cidrs))))
            try:
                self._up()
            except BaseException:
                self.plan = before
                raise
        self._emit(ev.Log(pool=self.pool_id, level="INFO", message=(
            f"stack {self.plan.stack}: TCP port {port} of node {node} open to {', '.join(cidrs)}")))

    def close_port(self, node: int, port: int) -> None:
        """Take the rule of ``open_port(node, port, ...)`` away: one stack update. The plan is
        without it even when that update fails, so the pool's next update takes it away."""
        with self._lock:
            kept = tuple(p for p in self.plan.serve_ports if (p.node, p.port) != (node, port))
            if self._closed or kept == self.plan.serve_ports:
                return
            self.plan = replace(self.plan, serve_ports=kept)
            self._up()
        self._emit(ev.Log(pool=self.pool_id, level="INFO",
                          message=f"stack {self.plan.stack}: TCP port {port} of node {node} closed again"))

    def close(self) -> None:
        """Refresh, destroy and remove the stack; forget the pool's client key. Idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                self.stack.destroy()
            except StackError as exc:
                raise StackError(
                    f"{exc}\nThe stack {self.plan.stack} and its resources are still there; destroy them with "
                    f"skyward.stacks.open_stack({self.plan.stack!r}).destroy() once the cause is fixed.",
                    stack=exc.stack, operation=exc.operation, output=exc.output,
                ) from exc
            self._closed = True
            self.stack.remove()
            keys.forget(self.plan.stack)
            notes.forget(self.plan.stack)
        with _OPEN_LOCK:
            _OPEN.pop(f"{self.backend}|{self.plan.stack}", None)

    # -- a pool of several groups: each group's cluster works through a view -----------------
    def group(self, name: str) -> CloudGroup:
        """The view of group ``name`` that its cluster grows, shrinks, heals and closes through."""
        self.plan.of(name)  # KeyError for a group the plan does not have
        return CloudGroup(self, name)

    def close_group(self, group: str) -> None:
        """Group ``group``'s cluster closed: its nodes leave the stack (one update) while another
        group's cluster is open; the last one to close destroys the stack (``close``)."""
        with self._lock:
            if self._closed:
                return
            self._closed_groups.add(group)
            if not self._closed_groups >= set(self.plan.group_names()):
                left = tuple(n for n in self.plan.nodes if n.group != group)
                if len(left) != len(self.plan.nodes):
                    self.plan = self.plan.with_nodes(left)
                    self._up()
                return
        self.close()

    # -- named pools: what another process needs to reopen this stack -----------------------
    def describe(self) -> dict[str, Any]:
        """JSON-able: the stack's name, project and backend, the plan with the nodes' private
        host keys (an update must not change a running node's user data, which would replace
        it), the pool's record and secrets for the stack config, and node addresses."""
        from .backend import PROJECT

        with self._lock:
            return {
                "name": self.plan.stack, "project": PROJECT, "backend": self.backend,
                "pool_id": self.pool_id, "plan": dataclasses.asdict(self.plan),
                "key_path": str(self.key_path), "spot": self.spot, "fallback": self.fallback,
                "record": json.loads(json.dumps(self._record, default=str)), "secrets": dict(self._secrets),
                "plugins": dict(self.stack.plugins), "addresses": dict(self._by_address),
                "lock": self._lock_json,
                **({"markets": {g: [m.spot, m.fallback] for g, m in self._markets.items()},
                    "closed_groups": sorted(self._closed_groups)} if self._markets else {}),
            }

    @classmethod
    def from_description(cls, description: dict[str, Any], program: Callable[[PoolPlan], Any],
                         connect: Connect | None = None) -> CloudPool:
        """The CloudPool of a described stack (its resources exist; nothing is run here).
        Without ``connect``, the stack is reopened on the backend it was made on."""
        import functools

        backend = str(description["backend"])
        key = f"{backend}|{description['name']}"
        if description["plan"].get("groups"):  # the groups of one pool share one CloudPool here
            with _OPEN_LOCK:
                open_ = _OPEN.get(key)
                if open_ is not None and not open_._closed:
                    return open_
        cloud = cls(
            PoolPlan.from_dict(description["plan"]), program, pool_id=str(description["pool_id"]),
            key_path=Path(description["key_path"]), spot=bool(description["spot"]),
            fallback_to_on_demand=bool(description["fallback"]), record=dict(description.get("record") or {}),
            secrets=dict(description.get("secrets") or {}), plugins=dict(description.get("plugins") or {}),
            connect=connect or functools.partial(local_connect, backend_url=backend), backend=backend,
            markets={str(g): (bool(m[0]), bool(m[1])) for g, m in (description.get("markets") or {}).items()},
        )
        cloud._by_address = {str(a): int(i) for a, i in (description.get("addresses") or {}).items()}
        cloud._lock_json = description.get("lock")
        cloud._closed_groups = set(description.get("closed_groups") or ())
        if cloud.plan.groups:
            with _OPEN_LOCK:
                _OPEN[key] = cloud
        return cloud

    # -- plumbing --------------------------------------------------------------------------
    def _index_of(self, node: Any) -> int:
        if isinstance(node, int):
            return node
        if isinstance(node, NodeAddress):
            return node.index
        try:
            return self._by_address[node.address]
        except (AttributeError, KeyError):
            raise ProviderError(f"stack {self.plan.stack}: {node!r} is not one of this pool's nodes") from None

    def _new_nodes(self, count: int, group: str = "", taken: tuple[NodePlan, ...] = ()) -> tuple[NodePlan, ...]:
        """``count`` new nodes of ``group``, numbered after every node of the pool (and ``taken``)."""
        start = max((n.index for n in (*self.plan.nodes, *taken)), default=-1) + 1
        spot = self._market(group).spot
        nodes = []
        for index in range(start, start + count):
            host = keys.ed25519(f"{self.plan.stack}-node-{index}")
            nodes.append(NodePlan(index=index, spot=spot, host_key=host.public, host_key_private=host.private,
                                  group=group))
        return tuple(nodes)

    def _market(self, group: str) -> Any:
        """Whose ``spot`` and ``fallback`` a group's new nodes follow: the pool's for group ""."""
        return self._markets[group] if group else self

    def _up(self) -> dict[str, Any]:
        self.stack.config = {
            "pool": json.dumps(self._record, default=str),
            "plan": json.dumps(self.plan.record()),
            "version": self.plan.version,
            **({"lock": self._lock_json} if self._lock_json else {}),
        }
        # These go to the stack's settings file (engine.PoolStack._write_config), whatever the
        # pool's size. Secrets are not config: secret config values reach the Pulumi CLI as
        # command-line arguments (visible in `ps`, limited to 128 KiB each). The program exports
        # them as a secret output instead (encrypted in the state); the nodes' private host keys
        # are in their (secret) user data there, and in a named pool's 0600 record.
        return self.stack.up()

    def keep_lock(self, lock: dict[str, Any], group: str = "") -> None:
        """Put the pool's lock (what its nodes installed, the image id...) in the stack config,
        now and with every later update: the stack alone says how to make the pool again. In a
        pool of several groups, each group's lock is kept under its name: ``{"groups": {...}}``."""
        with self._lock:
            if group:
                kept = json.loads(self._lock_json) if self._lock_json else {}
                lock = {"groups": {**(kept.get("groups") or {}), group: lock}}
            self._lock_json = json.dumps(lock, sort_keys=True, default=str)
            self.stack.set_config({"lock": self._lock_json})

    def lock_facts(self, group: str = "") -> dict[str, Any]:
        """The cloud part of the pool's (or ``group``'s) lock: the concrete image the lookup
        resolved (pinned after the first update), the instance type, region, zone and subnet."""
        plan = self.plan.of(group)
        pinned = plan.settings.get("pinned") or {}
        return {"image": plan.image or pinned.get("ami") or pinned.get("image"), "instance_type": plan.instance_type,
                "region": plan.region, "zone": plan.zone or pinned.get("zone"), "subnet": pinned.get("subnet"),
                "stack": plan.stack,
                # GCP: where its disks are, should a node leave one behind (stacks/gcp_disks.py)
                **({"project": plan.settings["project"]} if plan.settings.get("project") else {})}

    def _addresses(self, outputs: dict[str, Any], indices: Sequence[int]) -> list[NodeAddress]:
        by_index = {int(n["index"]): n for n in outputs.get("nodes") or []}
        plans = {n.index: n for n in self.plan.nodes}
        found = []
        for i in indices:
            out = by_index.get(i)
            if out is None or not out.get("public_ip"):
                raise ProviderError(
                    f"stack {self.plan.stack}: node {i} has no public address in the stack outputs "
                    f"({out!r}); the client reaches nodes over their public IP, so use a subnet that "
                    f"gives instances one (or the default VPC / network)."
                )
            self._by_address[str(out["public_ip"])] = i
            found.append(NodeAddress(
                index=i, address=str(out["public_ip"]), private_ip=str(out.get("private_ip") or out["public_ip"]),
                hostname=str(out.get("hostname") or f"node-{i}"), host_key=plans[i].host_key,
                user=self.plan.ssh_user, key=str(self.key_path), instance_id=str(out.get("id") or ""),
                port=int(out.get("port") or 22),
            ))
        return found

    def _emit(self, event: ev.Event) -> None:
        ev.bus.emit(event)


@dataclass(slots=True)
class _Market:
    """A group's market in a pool of several: spot or not, and whether spot may fall back."""

    spot: bool
    fallback: bool


# The pools of several groups reopened in this process (named pools): each group's cluster is
# attached on its own, and all must update the one plan.
_OPEN: dict[str, CloudPool] = {}
_OPEN_LOCK = threading.Lock()


class CloudGroup:
    """One group of a pool of several, as its cluster sees the pool's one stack: growing adds
    nodes of this group, replacing a lost node makes one of this group, closing removes this
    group's nodes (the last group to close destroys the stack). ``plan`` is the group's view."""

    def __init__(self, cloud: CloudPool, name: str) -> None:
        self.cloud, self.name = cloud, name

    @property
    def plan(self) -> PoolPlan:
        return self.cloud.plan.of(self.name)

    @property
    def stack(self) -> PoolStack:
        return self.cloud.stack

    def grow(self, count: int) -> list[NodeAddress]:
        return self.cloud.grow(count, self.name)

    def shrink(self, nodes: Iterable[Any]) -> None:
        self.cloud.shrink(nodes)

    def replace(self, gone: Any) -> tuple[NodeAddress, str | None]:
        return self.cloud.replace(gone)

    def close(self) -> None:
        self.cloud.close_group(self.name)

    def describe(self) -> dict[str, Any]:
        return {**self.cloud.describe(), "group": self.name}

    def lock_facts(self) -> dict[str, Any]:
        return self.cloud.lock_facts(self.name)

    def keep_lock(self, lock: dict[str, Any]) -> None:
        self.cloud.keep_lock(lock, self.name)


class _Program:
    """The pool's inline program: the stack program of the current plan, plus the pool's
    secrets as one secret output. ``plan`` is what the program declares from (a fake
    workspace reads it instead of running the program)."""

    def __init__(self, cloud: CloudPool, program: Callable[[PoolPlan], Any]) -> None:
        self._cloud, self._program = cloud, program

    @property
    def plan(self) -> PoolPlan:
        return self._cloud.plan

    def __call__(self) -> Any:
        declared = self._program(self._cloud.plan)
        if self._cloud._secrets:
            import pulumi

            pulumi.export("secrets", pulumi.Output.secret(json.dumps(self._cloud._secrets)))
        return declared


def spec_record(spec: Spec, offer: Offer, provider: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """(the pool's description for the stack config, its secret parts).

    The description is plain config, which every update's history repeats and a shared backend
    shows the whole team: it names the env variables but not their values, keeps Storage keys
    as fingerprints and index URLs without their credentials, and has every other registered
    secret masked (``secrets.scrub``). The secret parts -- all env values, the Storage keys
    given as strings, the index URLs with credentials -- are the program's secret output
    (encrypted in the state), so the stack still says how to make the pool again."""
    from skyward.observe.secrets import has_credentials, scrub

    image = spec.image
    record = {
        "skyward": __version__,
        "provider": _plain(provider),
        "offer": _plain(offer),
        "accelerator": str(spec.accelerator) if spec.accelerator is not None else None,
        "nodes": _plain(spec.nodes),
        **{name: getattr(spec, name) for name in (
            "vcpus", "memory_gb", "disk_gb", "architecture", "allocation", "region", "max_hourly_cost", "ttl")},
        "image": {
            "python": image.python, "pip": list(image.pip), "apt": list(image.apt),
            "pip_indexes": [_plain(ix) for ix in image.pip_indexes], "includes": list(image.includes),
            "excludes": list(image.excludes), "env": sorted(image.env), "shell_vars": dict(image.shell_vars),
            "skyward_source": image.skyward_source, "bootstrap_timeout": image.bootstrap_timeout,
            "metrics": repr(image.metrics),
        },
        "volumes": [_plain(v) for v in spec.volumes],
        "plugins": [_plain(p) for p in spec.plugins],
    }
    secrets = {"env": json.dumps(dict(image.env))} if image.env else {}
    keys = [{"volume": i, **{k: getattr(v.storage, k) for k in ("access_key", "secret_key", "session_token")
                             if isinstance(getattr(v.storage, k), str)}}
            for i, v in enumerate(spec.volumes) if getattr(v, "storage", None) is not None]
    if any(len(k) > 1 for k in keys):
        secrets["storage"] = json.dumps([k for k in keys if len(k) > 1])
    indexes = [ix.url for ix in image.pip_indexes if has_credentials(ix.url)]
    if indexes:
        secrets["indexes"] = json.dumps(indexes)
    return scrub(record), secrets


def _plain(value: Any) -> Any:
    """A JSON-able view of a dataclass (callables by name; a Storage without its keys), else its repr."""
    view = getattr(value, "record_view", None)
    if callable(view) and not isinstance(value, type):
        return view()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"type": type(value).__name__}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if callable(getattr(item, "record_view", None)) or (dataclasses.is_dataclass(item)
                                                                  and not isinstance(item, type)):
                item = _plain(item)
            elif callable(item):
                item = getattr(item, "__qualname__", repr(item))
            elif dataclasses.is_dataclass(item):
                item = _plain(item)
            elif not isinstance(item, str | int | float | bool | type(None) | list | tuple | dict):
                item = repr(item)
            out[f.name] = item
        return out
    return repr(value)


def new_plan(
    spec: Spec,
    offer: Offer,
    *,
    stack: str,
    pool: str,
    zone: str | None,
    image: str | None,
    user: str,
    settings: dict[str, Any],
    cidrs: tuple[str, ...],
    public_key: str,
    max_duration: float | None,
) -> PoolPlan:
    """The PoolPlan of a new pool, with no nodes yet (``launch`` and ``preview`` share it)."""
    import time

    from skyward.volumes import Disk, Volume

    from .plan import BucketPlan, DiskPlan

    gpu = offer.accelerator is not None
    now = int(time.time())
    return PoolPlan(
        pool=pool, stack=stack, region=offer.region, zone=zone,
        instance_type=offer.instance_type, nodes=(), ssh_user=user, ssh_public_key=public_key,
        ssh_cidrs=cidrs, disk_gb=spec.disk_gb or (120 if gpu else 30),
        disks=tuple(DiskPlan(v.size_gb, v.mount, v.type, v.iops) for v in spec.volumes if isinstance(v, Disk)),
        buckets=tuple(BucketPlan(v.bucket, v.prefix, v.read_only) for v in spec.volumes
                      if isinstance(v, Volume) and v.storage is None),
        image=image, gpu=gpu, architecture=offer.architecture, ttl=spec.ttl,
        grace=spec.image.bootstrap_timeout + 600, created=now,
        expires=now + int(max_duration) if max_duration else None, version=__version__, settings=settings,
    )


def placeholder_nodes(count: int, *, spot: bool) -> tuple[NodePlan, ...]:
    """Nodes with a throwaway host key, one for all (for a preview, which shows no key: the real
    ones, one per node, are made at ``up``)."""
    host = keys.ed25519("preview-node")
    return tuple(NodePlan(index=index, spot=spot, host_key=host.public, host_key_private=host.private)
                 for index in range(count))


def launch(
    kind: str,
    spec: Spec,
    pool_id: str,
    offer: Offer,
    program: Callable[[PoolPlan], Any],
    *,
    provider: Any,
    zone: str | None,
    image: str | None,
    user: str,
    settings: dict[str, Any],
    allow_ssh_from: Sequence[str],
    detect_address: bool,
    max_duration: float | None,
    plugins: dict[str, str],
    connect: Connect | None,
    pool_name: str | None = None,
) -> CloudPool:
    """The CloudPool of a new pool: its key, plan and stack (nothing is created in the cloud yet)."""
    from .backend import stack_name
    from .network import client_cidrs

    where = f"sky.{kind.upper()}(allow_ssh_from=...)"
    cidrs = client_cidrs(allow_ssh_from, detect_address, where)
    stack = stack_name(pool_name, pool_id)
    key_path, client = keys.client_key(stack)
    plan = new_plan(
        spec, offer, stack=stack, pool=pool_name or pool_id, zone=zone, image=image, user=user,
        settings=settings, cidrs=cidrs, public_key=client.public, max_duration=max_duration,
    )
    record, secrets = spec_record(spec, offer, provider)
    market = offer.market(spec.allocation)
    return CloudPool(
        plan, program, pool_id=pool_id, key_path=key_path, spot=market == "spot",
        fallback_to_on_demand=spec.allocation in ("spot-if-available", "cheapest") and offer.on_demand is not None,
        record=record, secrets=secrets, plugins=plugins, connect=connect,
        track=kind if pool_name is None else None,
    )


# Settings that are the pool's, not a group's: where the pool is, and what its first update pinned.
_POOL_SETTINGS = ("zones", "zone_attempt", "pinned", "subnet", "profile", "project", "network", "subnetwork")


def launch_groups(
    kind: str,
    specs: dict[str, Spec],
    pool_id: str,
    offers: dict[str, Offer],
    program: Callable[[PoolPlan], Any],
    *,
    provider: Any,
    stack_args: dict[str, dict[str, Any]],
    settings: dict[str, Any],
    plugins: dict[str, str],
    connect: Connect | None,
    pool_name: str | None = None,
) -> CloudPool:
    """The CloudPool of a new pool of several groups on one cloud: one stack, one network and
    security group (or firewalls), one client key; each group's nodes with their own instance
    type, market, disks and image (``PoolPlan.groups``). ``stack_args``: each group's provider
    arguments (``_stack_args``); ``settings``: the pool's (where the pool is: the first group's,
    with the zones every group can use). Nothing is created in the cloud yet."""
    from .backend import stack_name
    from .network import client_cidrs
    from .plan import GroupPlan

    first = next(iter(specs))
    args = stack_args[first]
    where = f"sky.{kind.upper()}(allow_ssh_from=...)"
    cidrs = client_cidrs(args["allow_ssh_from"], args["detect_address"], where)
    stack = stack_name(pool_name, pool_id)
    key_path, client = keys.client_key(stack)
    groups = []
    for name, spec in specs.items():
        a = stack_args[name]
        view = new_plan(spec, offers[name], stack=stack, pool=pool_name or pool_id, zone=args["zone"], image=a["image"],
                        user=args["user"], settings={}, cidrs=cidrs, public_key=client.public,
                        max_duration=args["max_duration"])
        groups.append(GroupPlan(
            name=name, instance_type=view.instance_type, disk_gb=view.disk_gb, disks=view.disks, image=view.image,
            gpu=view.gpu, architecture=view.architecture, ttl=view.ttl, grace=view.grace,
            settings={k: v for k, v in a["settings"].items() if k not in _POOL_SETTINGS},
        ))
    plan = new_plan(
        specs[first], offers[first], stack=stack, pool=pool_name or pool_id, zone=args["zone"], image=args["image"],
        user=args["user"], settings=settings, cidrs=cidrs, public_key=client.public, max_duration=args["max_duration"],
    )
    plan = replace(plan, groups=tuple(groups))
    records: dict[str, Any] = {}
    secrets: dict[str, str] = {}
    markets: dict[str, tuple[bool, bool]] = {}
    for name, spec in specs.items():
        records[name], group_secrets = spec_record(spec, offers[name], provider)
        secrets.update({f"{name}/{k}": v for k, v in group_secrets.items()})
        markets[name] = (offers[name].market(spec.allocation) == "spot",
                         spec.allocation in ("spot-if-available", "cheapest") and offers[name].on_demand is not None)
    return CloudPool(
        plan, program, pool_id=pool_id, key_path=key_path, spot=markets[first][0],
        fallback_to_on_demand=markets[first][1], record={"skyward": __version__, "groups": records},
        secrets=secrets, plugins=plugins, connect=connect, track=kind if pool_name is None else None, markets=markets,
    )
