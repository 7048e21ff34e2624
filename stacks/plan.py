"""What a cloud stack program declares, as plain data.

A provider turns (Spec, chosen Offer, its own settings) into a PoolPlan; the stack program
turns the PoolPlan into resources. Keeping the plan plain data makes the programs testable
with Pulumi's mocks from a plan alone, and lets the plan be recorded in the stack config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class NodePlan:
    """One node: its index in the pool (unique across its groups), its market, the host key it
    will present, and its group ("" in a pool of one kind of node: the plan's own fields)."""

    index: int
    spot: bool
    host_key: str  # public, "ssh-ed25519 AAAA..."
    host_key_private: str = field(repr=False, default="")
    group: str = ""

    @property
    def name(self) -> str:
        return f"node-{self.index}"


@dataclass(frozen=True, slots=True)
class DiskPlan:
    size_gb: int
    mount: str
    type: str | None = None
    iops: int | None = None  # provisioned IOPS (EBS io1/io2 need them; stacks/disks.py)


@dataclass(frozen=True, slots=True)
class BucketPlan:
    """A sky.Volume on the provider's own store: what the nodes' role may do, and where."""

    bucket: str
    prefix: str = ""  # "" = the whole bucket
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class PortPlan:
    """A TCP port of one node opened to some networks: an ``on="head"`` endpoint's ``allow_from=``
    (skyward.serve.endpoint). Only that node gets the rule; a node no longer in the plan, none."""

    node: int  # the node's index
    port: int
    cidrs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """One group of a pool of several (skyward.core.group) in the pool's one stack: what its nodes
    have of their own. Everything else -- region, zone, network, security group or firewalls, the
    client key, expiry, buckets -- is the pool's. ``settings`` go over the pool's (GCP: the machine
    type and accelerator; AWS: the AMI family)."""

    name: str
    instance_type: str
    disk_gb: int
    disks: tuple[DiskPlan, ...] = ()
    image: str | None = None
    gpu: bool = False
    architecture: str = "x86_64"
    ttl: int = 600
    grace: int = 900
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """Everything common to the AWS and GCP programs."""

    pool: str  # the pool's name, tagged on every resource
    stack: str
    region: str
    zone: str | None
    instance_type: str
    nodes: tuple[NodePlan, ...]
    ssh_user: str
    ssh_public_key: str
    ssh_cidrs: tuple[str, ...]  # who may reach port 22: the client's /32 plus any the user added
    disk_gb: int
    disks: tuple[DiskPlan, ...] = ()
    buckets: tuple[BucketPlan, ...] = ()  # sky.Volume(storage=None): granted to the nodes (buckets.py)
    image: str | None = None  # AMI id / GCP image; None: the program's default for the offer
    gpu: bool = False
    architecture: str = "x86_64"
    ttl: int = 600  # the user-data watchdog powers a node off after this long without an agent
    grace: int = 900  # extra time before the first agent may start (the bootstrap)
    created: int = 0  # epoch seconds
    expires: int | None = None  # epoch seconds of the hard cap, None: no cap (the lease decides)
    version: str = ""
    settings: dict[str, Any] = field(default_factory=dict)  # provider specifics (subnet, project...)
    serve_ports: tuple[PortPlan, ...] = ()  # ports of one node opened to allow_from= (pool.serve)
    # A pool of several groups: each group's own fields (the plan's own are the first group's);
    # every node names its group. () for a pool of one kind of node.
    groups: tuple[GroupPlan, ...] = ()

    def with_nodes(self, nodes: tuple[NodePlan, ...]) -> PoolPlan:
        return replace(self, nodes=nodes)

    def group_names(self) -> tuple[str, ...]:
        """The groups whose nodes the program declares: ("",) for a pool of one kind of node."""
        return tuple(g.name for g in self.groups) or ("",)

    def of(self, group: str) -> PoolPlan:
        """The plan as one group's nodes see it: its instance type, disks, image, hardware, ttl
        and settings over the pool's, and only its nodes. ``""``: the plan itself."""
        if not group:
            return self
        g = next((g for g in self.groups if g.name == group), None)
        if g is None:
            raise KeyError(f"stack {self.stack} has no group {group!r} (groups: {', '.join(self.group_names())})")
        settings = {**self.settings, **g.settings}
        pinned = dict(settings.get("pinned") or {})
        for key, per_group in (("ami", "amis"), ("image", "images")):  # looked up per group (stacks/aws.py, gcp.py)
            if group in (pinned.get(per_group) or {}):
                pinned[key] = pinned[per_group][group]
        if pinned:
            settings["pinned"] = pinned
        return replace(self, instance_type=g.instance_type, disk_gb=g.disk_gb, disks=g.disks, image=g.image,
                       gpu=g.gpu, architecture=g.architecture, ttl=g.ttl, grace=g.grace, settings=settings,
                       nodes=tuple(n for n in self.nodes if n.group == group), groups=())

    def labels(self) -> dict[str, str]:
        """Tags/labels on every resource: lower-case keys and values, valid on AWS and GCP."""
        return {
            "skyward-pool": label_value(self.pool),
            "skyward-stack": label_value(self.stack),
            "skyward-expires": str(self.expires) if self.expires is not None else "never",
            "skyward-ttl": str(self.ttl),
            "skyward-version": label_value(self.version.replace(".", "_")),
            "managed-by": "skyward",
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoolPlan:
        """The plan of ``dataclasses.asdict(plan)`` (a named pool's description keeps it)."""
        data = dict(data)
        nodes = tuple(NodePlan(**n) for n in data.pop("nodes"))
        disks = tuple(DiskPlan(**d) for d in data.pop("disks", ()))
        buckets = tuple(BucketPlan(**b) for b in data.pop("buckets", ()))
        ports = tuple(PortPlan(int(p["node"]), int(p["port"]), tuple(p["cidrs"])) for p in data.pop("serve_ports", ()))
        groups = tuple(GroupPlan(**{**g, "disks": tuple(DiskPlan(**d) for d in g.get("disks", ()))})
                       for g in data.pop("groups", ()))
        return cls(nodes=nodes, disks=disks, buckets=buckets, ssh_cidrs=tuple(data.pop("ssh_cidrs")), groups=groups,
                   serve_ports=ports, **data)

    def record(self) -> dict[str, Any]:
        """The plan without secrets, for the stack config."""
        data = asdict(self)
        for node in data["nodes"]:
            node.pop("host_key_private")
            if not node["group"]:  # a pool of one kind of node records what it always did
                node.pop("group")
        if not data["groups"]:
            data.pop("groups")
        return data


def label_value(value: str) -> str:
    """``value`` as a GCP label value (also a fine AWS tag): lower-case letters, digits, ``_``
    and ``-``, at most 63 characters."""
    import re

    return re.sub(r"[^a-z0-9_-]+", "-", value.lower())[:63]
