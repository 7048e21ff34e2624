"""What every provider gives the pool: a Cluster of reachable nodes running the agent."""

from __future__ import annotations

import abc
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from skyward.bootstrap.remote import Remote
    from skyward.bootstrap.routes import Stream, Target
    from skyward.records.pkglock import Package
    from skyward.spec import Options, Spec

    from .nodetable import NodeTable


@dataclass(frozen=True)
class NodeEndpoint:
    """One running node: where its agent is and how to open a connection to it."""

    index: int
    private_ip: str
    public_ip: str | None
    hostname: str
    connect: Callable[[], socket.socket]
    # Who answers there: the agent's own identity, from its start-up line (a random id it made
    # at start). The channel refuses an agent whose WELCOME says another one (a relay that
    # hands the client another node of the same pool); "" where the provider does not know it.
    agent_id: str = ""


@dataclass(frozen=True)
class HereShell:
    """The node is this machine (sky.Local): a command runs with bash here, in the node's folder."""


@dataclass(frozen=True)
class ExecShell:
    """A command runs through a program here that enters the node (sky.Container: the runtime's
    ``exec``): ``argv(tty)`` is its command line, before ``bash -c SCRIPT``."""

    argv: Callable[[bool], list[str]]


@dataclass(frozen=True)
class SSHShell:
    """A command runs in a session of an SSH connection: the node's own (sky.SSH, clouds), or a
    bastion's, where ``wrap(command, tty)`` gives the line that carries it on to the node
    (sky.Slurm: ``srun`` into the node's job, on the login node)."""

    remote: Remote
    wrap: Callable[[str, bool], str] | None = None


NodeShell = HereShell | ExecShell | SSHShell


class Firewall(Protocol):
    """What admits traffic to a pool's nodes where skyward manages it (a cloud pool's stack:
    skyward.stacks.cloudpool.CloudPool): a port of one node opened to some networks, and closed."""

    def open_port(self, node: int, port: int, cidrs: Sequence[str]) -> None: ...

    def close_port(self, node: int, port: int) -> None: ...

# How long before a pool's max_duration deadline it stops starting nodes (growth, wakes,
# replacements): a cloud node takes minutes to boot and bootstrap, and one started later would be
# deleted at the deadline about when it could take its first task, billed for nothing.
GROWTH_MARGIN = 600.0


class Cluster(abc.ABC):
    """A provider's live nodes for one pool; destroyed by ``close`` (idempotent)."""

    token: str
    head_port: int
    interface: str = "lo"
    # A directory the client and the nodes both see (Local only): large buffers travel as
    # files there instead of through the sockets. None for remote nodes.
    spill_dir: Path | None = None
    # The spec the cluster was made for: plugin transforms and bootstrap factories read it
    # (set by the provider before it calls skyward.plugins.compose.prepare).
    spec: Spec
    # What the nodes were given, exactly (skyward.records.pkglock.describe): the pool's record keeps it.
    # None where the provider cannot say (an attached pool: its record was written at creation).
    package_lock: dict[str, Any] | None = None
    # An attached pool replaces the described nodes it found dead before its first task (set by
    # skyward.named.pools for programs that attach; inspection commands such as `exec` leave it off).
    heal_at_attach: bool = False
    # The cluster's nodes from claim to release (providers/nodetable.py); None for a cluster
    # that keeps none (it then has no unreachable nodes).
    table: NodeTable[Any] | None = None
    # When the pool's nodes are deleted for good (a cloud pool's ``max_duration``: epoch
    # seconds), else None; no node is started within ``growth_margin`` seconds of it.
    deadline: float | None = None
    growth_margin: float = GROWTH_MARGIN
    # The pool's firewall where skyward manages one (a cloud pool's stack), else None: then
    # whatever can reach a node's address reaches its ports, as the hosts' own firewalls allow.
    firewall: Firewall | None = None

    def no_growth(self) -> str | None:
        """Why no new node may start now (the pool's deadline is near or past), else None."""
        if self.deadline is None:
            return None
        left = self.deadline - time.time()
        if left >= self.growth_margin:
            return None
        when = time.strftime("%H:%M:%S UTC", time.gmtime(self.deadline))
        ends = f"ended {-left:.0f} s ago" if left <= 0 else f"ends in {left:.0f} s"
        return (f"the pool's max_duration {ends} (at {when}), when every node is deleted; no new node "
                f"starts in its last {self.growth_margin:.0f} s, where it would be deleted about as soon "
                f"as it booted. Give the next pool a longer max_duration if it needs to grow or heal that late")

    @property
    def node_count(self) -> int:
        """How many nodes the pool starts with (``spec.nodes.desired``; 1 without a spec)."""
        spec = getattr(self, "spec", None)
        return spec.node_spec.desired if spec is not None else 1

    @abc.abstractmethod
    def start(self, count: int) -> list[NodeEndpoint]:
        """Start ``count`` more nodes (indices continue after the existing ones)."""

    @abc.abstractmethod
    def stop(self, endpoints: list[NodeEndpoint]) -> None:
        """Stop these nodes (their agents were already asked to shut down)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Destroy every node and everything created for them."""

    def start_each(self, count: int) -> Iterator[NodeEndpoint | BaseException]:
        """Like ``start``, but each node as soon as it is ready (``Nodes(min=)``: work starts
        before the slow ones are there); a node that fails comes as its exception, the others
        go on. Default: ``start`` (every node at once)."""
        yield from self.start(count)

    def replace(self, lost: NodeEndpoint) -> NodeEndpoint:
        """A new node in place of a lost one (the pool gives it the lost node's rank), with a
        new index. Raise when this attempt failed; the pool tries again up to
        ``Options.max_provision_attempts`` times, passing the same ``lost``. Default: start
        one node, then stop the lost one."""
        new = self.start(1)[0]
        try:
            self.stop([lost])
        except Exception:  # the lost node's leftovers must not undo its replacement
            import logging

            logging.getLogger("skyward").exception("stopping lost node %d failed", lost.index)
        return new

    def preempted(self, index: int) -> str | None:
        """After ``replace``: why node ``index`` went away when its provider took it back (a spot
        instance reclaimed), else None. Default: None."""
        return None

    def unreachable(self) -> dict[int, str]:
        """Described nodes of an attached pool that ``start`` skipped because they could not be
        reached: ``{index: why}``, each judged on its own. Empty for nodes this process started."""
        if self.table is None:
            return {}
        with self.table.lock:
            return dict(self.table.unreachable)

    def replaced(self, index: int) -> None:
        """Node ``index``, listed by ``unreachable()``, was replaced: it is no longer missing."""
        if self.table is not None:
            self.table.replaced(index)

    def loss_reason(self, index: int, why: str) -> str:
        """Why node ``index`` was lost, as InstanceLost says it: ``why`` (what its connection saw:
        "connection closed") with what the provider knows besides (a Slurm job's state and reason).
        Called when the loss is seen, before the replacement; it must answer within a few seconds.
        Default: ``why``."""
        return why

    def node_lost(self, index: int) -> None:
        """The pool lost its connection to node ``index`` (it stays in the pool's records until
        stopped). Providers let go of what would only hang now; its agent stops by itself when
        its lease runs out. Default: nothing to do."""
        return None

    # -- reaching a node: its ports and sockets, its shell (skyward ssh/exec/cp, notebook, serving) --
    def open_stream(self, index: int, target: Target) -> Stream:
        """A stream to ``target`` on node ``index``: a TCP port (int) the node listens on, or a
        Unix socket (str: its path on the node), opened the way the pool reaches that node, in the
        fallback order of skyward.bootstrap.routes (direct, a channel, a relay). Raise
        ``ProviderError`` naming the node when it cannot be reached. Default: none can."""
        from skyward.errors import ProviderError

        raise ProviderError(f"{type(self).__name__} opens no streams to its nodes in this version of skyward")

    def shell(self, index: int) -> NodeShell | None:
        """How a command reaches node ``index`` (see HereShell, ExecShell, SSHShell); None (the
        default) where this provider gives no shell on its nodes. Raise ``ProviderError`` when
        the node is not connected."""
        return None

    # -- pools that outlive the process that made them (`skyward up`, sky.Compute(name=...)) --
    def describe(self) -> dict[str, Any]:
        """Everything another process needs to reach these nodes again, and to destroy them.

        The contract (the pool registry stores this dict as JSON in a 0600 file and hands it
        back, unchanged, to ``attach`` / ``destroy`` / ``alive`` of the same provider kind):

        * JSON types only (str, int, float, bool, None, lists, dicts with str keys).
        * ``"provider"``: the provider's ``kind`` (``"local"``, ``"ssh"``, ...).
        * ``"token"``: the agents' token; ``"head_port"``, ``"interface"``: as on the Cluster.
        * ``"nodes"``: one dict per running node, in index order, each with at least
          ``"index"``, ``"private_ip"``, ``"public_ip"`` (or None), ``"hostname"``, and how to
          open a connection to its agent (Local: ``"port"``; SSH: host, port, user, key path,
          host key, the agent's port on the node). Optional ``"log"``: the agent log's path on
          that node (``skyward logs`` reads it there).
        * whatever ``destroy`` needs to leave nothing behind (process ids, folders, a stack).

        Secrets (token, key paths) may be included: the registry file is private to the user.
        Called again after a resize, so it must describe the nodes running now.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot describe itself for named pools yet")

    def detach(self) -> None:
        """Let go of the nodes without stopping them: this process is done with the pool, the
        pool stays up (the process that ran ``skyward up``, or one that attached). The object
        is not used afterwards; the agents' lease (``ttl``) now decides when the nodes stop.
        Default: nothing to release."""
        return None


class ProviderConfig:
    """Base of sky.Local, sky.SSH, sky.AWS, sky.GCP: configuration plus a factory of clusters."""

    is_skyward_provider: ClassVar[bool] = True
    kind: ClassVar[str] = "?"
    # Whether a server on a node that only the pool's own streams should reach (a notebook)
    # listens on the node's private address: where the streams come from another machine
    # (Slurm's, from the login node) and never reach the node's loopback. Else on the loopback.
    serve_on_private_ip: ClassVar[bool] = False

    def check(self, spec: Spec) -> str | None:
        """Why this provider cannot serve ``spec`` (None when it can)."""
        return None

    def hourly_cost(self, spec: Spec) -> float | None:
        """Estimated cost per node-hour in USD (None when unknown)."""
        return None

    def preflight(self, spec: Spec) -> None:
        """Fail now, before anything is written or created, when this machine lacks what the
        provider needs (a CLI, an SDK extra); the error says how to install it."""
        return None

    def launch(self, spec: Spec, pool_id: str) -> Cluster | None:
        """The cluster for a new pool with its nodes already starting, for a provider that can
        start them at once (Local: processes), called before the pool's own modules load so
        that both overlap; the pool connects to them as to ``create``'s. None (the default):
        the pool calls ``create`` instead. A failure here only loses the head start: the pool
        then calls ``create``, which reports it."""
        return None

    def create(self, spec: Spec, pool_id: str, options: Options | None = None, name: str | None = None,
               pin: tuple[Package, ...] | None = None) -> Cluster:
        """The cluster for one pool (``options``: the pool's Options, for timeouts; ``name``: a
        named pool's name, which cloud stacks carry in theirs; ``pin``: the packages of the pool
        being reproduced, installed as they are, nothing resolved)."""
        raise NotImplementedError

    def create_together(self, specs: dict[str, Spec], pool_id: str, options: Options | None = None,
                        name: str | None = None, pin: tuple[Package, ...] | None = None) -> dict[str, Cluster] | None:
        """The clusters of several groups of one pool on this provider (skyward.core.group), made
        together where the provider can share what a pool has once (a cloud's stack, network and
        security group): group name -> its cluster. None (the default): the pool calls ``create``
        for each group."""
        return None

    # -- named pools: the other half of Cluster.describe ---------------------------------------
    def attach(self, description: dict[str, Any]) -> Cluster:
        """A Cluster for nodes that already run, from another process's ``Cluster.describe()``.

        Provisions nothing and does not stop anything it is given. On the returned cluster:

        * ``start(count)`` hands out the described nodes first, in index order, starting
          nothing (the pool calls it once with the number of described nodes); a count beyond
          them starts new nodes (a resize), with indices after the described ones. A described
          node that cannot be reached is skipped and listed by ``unreachable()`` with why (the
          pool attaches to the others); when none can be, ``start`` raises.
        * ``stop(endpoints)`` stops those nodes (their agents were already told to shut down).
        * ``detach()`` lets go and leaves every node running (the normal end of an attach).
        * ``close()`` destroys every node, described or new.
        * ``describe()`` works again (after a resize the registry stores the new description).
        * ``token``, ``head_port``, ``interface``, ``spill_dir`` as described.

        Raise ``ProviderError`` (naming the node and what to do) when the nodes cannot be
        reached; the caller then treats the pool as gone. Keep it quick: attaching to a Local
        pool and running a first task takes well under a second.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot attach to running pools yet")

    def destroy(self, description: dict[str, Any]) -> None:
        """Destroy a described cluster that no process holds (``skyward down``, expired pools).

        Idempotent: nodes or folders already gone are fine. When it returns, no agent of the
        pool runs and nothing created for it remains. Ask the agents to shut down first (so
        they stop their workers), then make sure. Raise ``ProviderError`` only when something
        may be left behind, saying what."""
        raise NotImplementedError(f"{type(self).__name__} cannot destroy described pools yet")

    def alive(self, description: dict[str, Any]) -> bool | None:
        """Cheaply and without connecting: does any described node still run? ``None`` when
        that cannot be told without connecting (the registry then goes by the ttl)."""
        return None

    def nodes_alive(self, description: dict[str, Any]) -> list[bool | None]:
        """Like ``alive``, node by node, in the order of ``description["nodes"]`` (``skyward
        ls`` shows the nodes that are down). Default: None for each (cannot tell)."""
        return [None for _ in description.get("nodes", [])]


def require_kind(description: dict[str, Any], kind: str) -> None:
    """A pool record handed to the wrong provider (or written by an older skyward)."""
    from skyward.errors import ProviderError

    if description.get("provider") != kind:
        raise ProviderError(
            f"this pool's record is for provider {description.get('provider')!r}, not {kind!r}; "
            f"it was written by another provider or an older skyward. Remove it with `skyward down`."
        )
