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
    """One node: its index in the pool, its market, and the host key it will present."""

    index: int
    spot: bool
    host_key: str  # public, "ssh-ed25519 AAAA..."
    host_key_private: str = field(repr=False, default="")

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

    def with_nodes(self, nodes: tuple[NodePlan, ...]) -> PoolPlan:
        return replace(self, nodes=nodes)

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
        return cls(nodes=nodes, disks=disks, buckets=buckets, ssh_cidrs=tuple(data.pop("ssh_cidrs")),
                   serve_ports=ports, **data)

    def record(self) -> dict[str, Any]:
        """The plan without secrets, for the stack config."""
        data = asdict(self)
        for node in data["nodes"]:
            node.pop("host_key_private")
        return data


def label_value(value: str) -> str:
    """``value`` as a GCP label value (also a fine AWS tag): lower-case letters, digits, ``_``
    and ``-``, at most 63 characters."""
    import re

    return re.sub(r"[^a-z0-9_-]+", "-", value.lower())[:63]
