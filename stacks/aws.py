"""The AWS stack program: what one pool is on EC2.

* the pool's network: the given subnet (and its VPC), or a default subnet of the default VPC
  in a zone that offers the instance type (sorted, the ``zone_attempt``-th one: the pool
  tries the next zone when one has no capacity), or in the given zone;
* a security group: TCP 22 from the client's address (/32) and any CIDRs the user added,
  all traffic between members of the group, nothing else in; everything out;
* per node with ports opened by ``pool.serve(on="head", allow_from=...)`` (``plan.serve_ports``):
  a security group of its own, attached to that node's instance only, admitting TCP on those
  ports from those CIDRs (and nothing else: the pool's group keeps the rest); it goes when the
  plan no longer has the ports;
* a key pair from the pool's ed25519 client key;
* one instance per node: spot (one-time, terminated on interruption) or on-demand, as the
  plan says per node; shutting down from inside terminates it; IMDSv2 required (the user
  data holds the node's private host key); root volume of disk_gb and one EBS volume per
  ``sky.Disk``, all deleted when the instance terminates (also when it terminates itself,
  after a client crash); the AMI given, or the latest Ubuntu (CPU) / Deep Learning base (GPU)
  image for the architecture; user data with its host key, disk mounts and the TTL
  watchdog; tags with the pool name, expiry and skyward version.

Lookups are resolved once: the first ``up`` exports the AMI, subnet and zone it chose
(``placement``), the pool records them in its plan (``settings["pinned"]``), and every later
``up`` (grow, shrink, resize) uses those values, so a newer AMI or another default subnet
never replaces a running node.

A pool of several groups (``plan.groups``) is one such stack: the network, security group, key
pair and role are the pool's; each node's instance is made from its group's view of the plan
(``PoolPlan.of``: instance type, disks, image, ttl), in a zone that offers every group's
instance type, tagged ``skyward-group``; each group's AMI is pinned (``placement["amis"]``).

Outputs: ``nodes``, one entry per node (index, id, public and private IP, hostname), and
``placement`` (ami, subnet, zone).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any

from . import buckets, disks
from .plan import NodePlan, PoolPlan, label_value
from .userdata import cloud_config

UBUNTU_OWNER = "099720109477"  # Canonical
_AMIS = {
    ("cpu", "x86_64"): (UBUNTU_OWNER, "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"),
    ("cpu", "arm64"): (UBUNTU_OWNER, "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-arm64-server-*"),
    ("gpu", "x86_64"): ("amazon", "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"),
    # The OSS (open kernel module) driver drives Turing and newer, which is every NVIDIA GPU AWS
    # still sells: the V100 machines (p3, p3dn) are retired (providers/aws.RETIRED_FAMILIES).
    ("gpu", "arm64"): ("amazon", "Deep Learning ARM64 Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"),
    ("neuron", "x86_64"): ("amazon", "Deep Learning AMI Neuron (Ubuntu 22.04) *"),
}
_DEVICE_LETTERS = disks.AWS_DEVICE_LETTERS


def ami_filter(plan: PoolPlan) -> tuple[str, str]:
    """(owner, name pattern) of the default AMI for the plan's hardware."""
    family = plan.settings.get("family") or ("gpu" if plan.gpu else "cpu")
    return _AMIS.get((family, plan.architecture)) or _AMIS[("cpu", plan.architecture)]


# AWS's rule for security group and rule descriptions (the API refuses anything else, and so
# does the provider's validation): the tests check every description the program declares.
DESCRIPTION_CHARS = r"^[a-zA-Z0-9 ._\-:/()#,@\[\]+=&;{}!$*]{0,255}$"


def describable(text: str) -> str:
    """``text`` with every character AWS refuses in a description replaced by ``-``."""
    return re.sub(r"[^a-zA-Z0-9 ._\-:/()#,@\[\]+=&;{}!$*]", "-", text)[:120]


def device_name(j: int) -> str:
    return f"/dev/sd{_DEVICE_LETTERS[j]}"


def disk_candidates(j: int) -> list[str]:
    """Where EBS volume ``j`` shows up: by its attachment name, also as an NVMe device."""
    return [f"ebs:sd{_DEVICE_LETTERS[j]}"]


@dataclass
class Declared:
    """What the program declared (the tests look at these)."""

    provider: Any
    security_group: Any
    key_pair: Any
    instances: dict[int, Any]
    subnet: Any
    ami: Any
    access: buckets.AwsAccess | None = None  # the nodes' role for sky.Volume buckets (buckets.py)
    serve_groups: dict[int, Any] = field(default_factory=dict)  # node index -> its serve_ports' group
    amis: dict[str, Any] | None = None  # group -> its AMI ("" in a pool of one kind of node)


def program(plan: PoolPlan) -> Declared:
    """Declare the pool's resources; call inside a Pulumi program (or under mocks)."""
    # Typed as Any: the SDKs' overloads reject plain dict inputs that they accept at run time.
    pulumi: Any = importlib.import_module("pulumi")
    aws: Any = importlib.import_module("pulumi_aws")

    views = {g: plan.of(g) for g in plan.group_names()}  # each group's instance type, disks, image
    for view in views.values():
        disks.aws_check(view.disks, view.instance_type)  # a plan reopened from a record, too
    tags = plan.labels()
    s = plan.settings
    provider = aws.Provider(
        "aws", region=plan.region, profile=s.get("profile"), default_tags={"tags": tags},
    )
    res = pulumi.ResourceOptions(provider=provider)
    invoke = pulumi.InvokeOptions(provider=provider)
    subnet = _subnet(aws, plan, invoke)

    group = aws.ec2.SecurityGroup(
        "nodes",
        description=f"skyward pool {describable(plan.pool)}: ssh from the client, all traffic between the nodes",
        vpc_id=subnet.vpc_id,
        ingress=[
            {"description": "ssh from the skyward client", "protocol": "tcp", "from_port": 22, "to_port": 22,
             "cidr_blocks": [c for c in plan.ssh_cidrs if ":" not in c],
             "ipv6_cidr_blocks": [c for c in plan.ssh_cidrs if ":" in c]},
            {"description": "all traffic between the nodes of the pool", "protocol": "-1", "from_port": 0,
             "to_port": 0, "self": True},
        ],
        egress=[{"description": "everything out", "protocol": "-1", "from_port": 0, "to_port": 0,
                 "cidr_blocks": ["0.0.0.0/0"], "ipv6_cidr_blocks": ["::/0"]}],
        tags={**tags, "Name": f"skyward-{plan.stack}"},
        opts=res,
    )
    serve_groups = _serve_groups(aws, plan, subnet, tags, res)
    key = aws.ec2.KeyPair("client", key_name=f"skyward-{plan.stack}", public_key=plan.ssh_public_key, tags=tags, opts=res)

    amis = {g: _ami(pulumi, aws, view, invoke) for g, view in views.items()}
    ami = amis[plan.group_names()[0]]

    # What would replace a running node if it changed is pinned in the plan after the first
    # up; ignore_changes keeps an explicit change (a new ami=) from replacing running nodes too.
    # User data too: EC2 changes it only on a stopped instance, so the provider would stop and
    # start a running node for it (or destroy and recreate it, with user_data_replace_on_change),
    # and a newer skyward renders other user data for the same node. A node keeps the user data
    # it was born with; new nodes get the current one.
    inst_opts = pulumi.ResourceOptions(provider=provider, ignore_changes=["ami", "subnetId", "userData"])
    # sky.Volume(storage=None): a role and instance profile granting exactly those buckets.
    access = buckets.declare_aws(aws, plan, res, tags)
    instances: dict[int, Any] = {}
    for node in plan.nodes:
        view = views[node.group]  # the plan itself in a pool of one kind of node
        user_data = cloud_config(view, node, [disk_candidates(j) for j in range(len(view.disks))], cloud="aws")
        inst = aws.ec2.Instance(
            node.name,
            ami=amis[node.group],
            instance_type=view.instance_type,
            subnet_id=subnet.id,
            vpc_security_group_ids=[group.id, *([serve_groups[node.index].id] if node.index in serve_groups
                                                else [])],
            key_name=key.key_name,
            associate_public_ip_address=True,
            instance_initiated_shutdown_behavior="terminate",
            iam_instance_profile=access.profile.name if access is not None else None,
            instance_market_options=_market(node),
            # IMDSv2 only: the user data (with the node's private host key) is served by IMDS.
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required", "http_put_response_hop_limit": 1},
            root_block_device={"volume_size": view.disk_gb, "volume_type": "gp3", "delete_on_termination": True},
            # Part of the instance, not volumes attached after launch: they are deleted when the
            # instance terminates, whoever terminates it, and nothing detaches a mounted disk.
            ebs_block_devices=[
                {"device_name": device_name(j), "volume_size": disk.size_gb, "volume_type": disk.type or "gp3",
                 "delete_on_termination": True, **({"iops": disk.iops} if disk.iops else {}),
                 "tags": {**tags, "Name": f"skyward-{plan.stack}-{node.name}-disk-{j}"}}
                for j, disk in enumerate(view.disks)
            ],
            user_data=pulumi.Output.secret(user_data),  # it carries the node's private host key
            tags={**tags, "Name": f"skyward-{plan.stack}-{node.name}", "skyward-node": str(node.index),
                  **({"skyward-group": label_value(node.group)} if node.group else {})},
            opts=inst_opts,
        )
        instances[node.index] = inst

    pulumi.export("nodes", [
        {"index": i, "id": inst.id, "public_ip": inst.public_ip, "private_ip": inst.private_ip,
         "hostname": inst.private_dns}
        for i, inst in instances.items()
    ])
    placement = {"ami": ami, "subnet": subnet.id, "zone": subnet.availability_zone}
    if plan.groups:  # each group's AMI, pinned per group (PoolPlan.of)
        placement["amis"] = amis
    pulumi.export("placement", placement)
    return Declared(provider, group, key, instances, subnet, ami, access, serve_groups, amis)


def _ami(pulumi: Any, aws: Any, plan: PoolPlan, invoke: Any) -> Any:
    """The AMI of the plan's nodes (one group's view of a pool of several): given, pinned by an
    earlier up, or the latest of the default family for its hardware."""
    pinned = plan.settings.get("pinned") or {}
    if plan.image or pinned.get("ami"):
        return pulumi.Output.from_input(plan.image or pinned["ami"])
    owner, pattern = ami_filter(plan)
    return aws.ec2.get_ami_output(
        most_recent=True, owners=[owner], opts=invoke,
        filters=[{"name": "name", "values": [pattern]}, {"name": "state", "values": ["available"]}],
    ).id


def _serve_groups(aws: Any, plan: PoolPlan, subnet: Any, tags: dict[str, str], res: Any) -> dict[int, Any]:
    """A security group per node that has ports in ``plan.serve_ports``: TCP on each port from its
    CIDRs only. Attached to that node's instance alone (a group is a property of the instance's
    interface, so a group of its own is how one node gets a rule the others do not)."""
    present = {n.index for n in plan.nodes}
    by_node: dict[int, list[Any]] = {}
    for p in plan.serve_ports:
        if p.node in present:
            by_node.setdefault(p.node, []).append(p)
    return {
        node: aws.ec2.SecurityGroup(
            f"serve-node-{node}",
            description=describable(f"skyward pool {plan.pool}: endpoint ports of node {node} from allow_from"),
            vpc_id=subnet.vpc_id,
            ingress=[
                {"description": describable(f"pool.serve on port {p.port} from allow_from"), "protocol": "tcp",
                 "from_port": p.port, "to_port": p.port, "cidr_blocks": [c for c in p.cidrs if ":" not in c],
                 "ipv6_cidr_blocks": [c for c in p.cidrs if ":" in c]}
                for p in sorted(ports, key=lambda p: p.port)
            ],
            egress=[],  # the pool's group lets everything out
            tags={**tags, "Name": f"skyward-{plan.stack}-serve-node-{node}"},
            opts=res,
        )
        for node, ports in sorted(by_node.items())
    }


def _subnet(aws: Any, plan: PoolPlan, invoke: Any) -> Any:
    """The pool's subnet: given, pinned by an earlier up, or a default subnet in a zone that
    offers the instance type (the ``zone_attempt``-th of them, sorted, or the given zone)."""
    s = plan.settings
    given = s.get("subnet") or (s.get("pinned") or {}).get("subnet")
    if given:
        return aws.ec2.get_subnet_output(id=given, opts=invoke)
    # A pool of several groups: a zone that offers every group's instance type.
    types = list(dict.fromkeys(g.instance_type for g in plan.groups)) or [plan.instance_type]
    offerings = [aws.ec2.get_instance_type_offerings_output(
        location_type="availability-zone", opts=invoke,
        filters=[{"name": "instance-type", "values": [t]}],
    ).locations for t in types]
    offered = offerings[0] if len(offerings) == 1 else pulumi_all(offerings).apply(
        lambda found: sorted(set.intersection(*(set(z or ()) for z in found))))
    what = " and ".join(types)  # the instance type(s) the zone must offer, in the messages
    attempt = int(s.get("zone_attempt") or 0)
    vpc = aws.ec2.get_vpc_output(default=True, opts=invoke)
    # The zones where the default VPC has a default subnet: one deleted, or an availability zone
    # newer than the account, has none, and the lookup below would fail there.
    default_ids = aws.ec2.get_subnets_output(filters=[
        {"name": "vpc-id", "values": [vpc.id]}, {"name": "default-for-az", "values": ["true"]},
    ], opts=invoke).ids
    with_subnet = default_ids.apply(lambda ids: pulumi_all(
        [aws.ec2.get_subnet_output(id=i, opts=invoke).availability_zone for i in ids or []]))

    def choose(args: list[Any]) -> str:
        zones, subnet_zones = args
        # Availability zones only: an account's opted-in Local Zones and Wavelength Zones are in
        # the offerings too (ZoneType local-zone / wavelength-zone), named <region>-<place>-..., and
        # sort first; their subnets, prices and services differ. A zone= given by name still goes.
        zones = sorted({z for z in zones or [] if not z.startswith(f"{plan.region}-") or z == plan.zone})
        if plan.zone:
            if zones and plan.zone not in zones:
                raise ValueError(
                    f"{what} is not offered in zone {plan.zone}; zones of {plan.region} "
                    f"that offer it: {', '.join(zones)}. Give one of them as AWS(zone=...), or none."
                )
            if plan.zone not in set(subnet_zones or ()):
                raise ValueError(no_default_subnet(plan, [plan.zone]))
            return plan.zone
        if not zones:
            raise ValueError(f"no zone of {plan.region} offers {what}; pick another region.")
        usable = [z for z in zones if z in set(subnet_zones or ())]
        if not usable:
            raise ValueError(no_default_subnet(plan, zones))
        if attempt >= len(usable):
            raise ValueError(
                f"every zone of {plan.region} that offers {what} and has a default subnet "
                f"({', '.join(usable)}) was tried and none could start it; try another region or instance type."
            )
        return usable[attempt]

    return aws.ec2.get_subnet_output(
        vpc_id=vpc.id, default_for_az=True, availability_zone=pulumi_all([offered, with_subnet]).apply(choose),
        opts=invoke,
    )


def no_default_subnet(plan: PoolPlan, zones: list[str]) -> str:
    """Why no zone can take the pool, and the two ways out."""
    return (
        f"the default VPC of {plan.region} has no default subnet in {', '.join(zones)} "
        f"(where {plan.instance_type} is offered): it was deleted, or the zone is newer than the account. "
        f"Create one with `aws ec2 create-default-subnet --availability-zone {zones[0]}`, or give the pool "
        f"a subnet of yours: sky.AWS(subnet='subnet-...')."
    )


def pulumi_all(outputs: list[Any]) -> Any:
    pulumi: Any = importlib.import_module("pulumi")
    return pulumi.Output.all(*outputs)


def _market(node: NodePlan) -> dict[str, Any] | None:
    if not node.spot:
        return None
    return {"market_type": "spot", "spot_options": {
        "spot_instance_type": "one-time", "instance_interruption_behavior": "terminate",
    }}
