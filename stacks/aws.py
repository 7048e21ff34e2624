"""The AWS stack program: what one pool is on EC2.

* the pool's network: the given subnet (and its VPC), or the default VPC's default subnet
  (in the given zone, if any);
* a security group: TCP 22 from the client's address (/32) and any CIDRs the user added,
  all traffic between members of the group, nothing else in; everything out;
* a key pair from the pool's ed25519 client key;
* one instance per node: spot (one-time, terminated on interruption) or on-demand, as the
  plan says per node; shutting down from inside terminates it; root volume of disk_gb; the
  AMI given, or the latest Ubuntu (CPU) / Deep Learning base (GPU) image for the
  architecture; user data with its host key, disk mounts and the TTL watchdog; tags with
  the pool name, expiry and skyward version;
* one EBS volume per node and Disk, in the node's zone, attached to that node.

Outputs: ``nodes``, one entry per node (index, id, public and private IP, hostname).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from .plan import NodePlan, PoolPlan
from .userdata import cloud_config

UBUNTU_OWNER = "099720109477"  # Canonical
_AMIS = {
    ("cpu", "x86_64"): (UBUNTU_OWNER, "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"),
    ("cpu", "arm64"): (UBUNTU_OWNER, "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-arm64-server-*"),
    ("gpu", "x86_64"): ("amazon", "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"),
    ("gpu", "arm64"): ("amazon", "Deep Learning ARM64 Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"),
    ("neuron", "x86_64"): ("amazon", "Deep Learning AMI Neuron (Ubuntu 22.04) *"),
}
_DEVICE_LETTERS = "fghijklmnop"


def ami_filter(plan: PoolPlan) -> tuple[str, str]:
    """(owner, name pattern) of the default AMI for the plan's hardware."""
    family = plan.settings.get("family") or ("gpu" if plan.gpu else "cpu")
    return _AMIS.get((family, plan.architecture)) or _AMIS[("cpu", plan.architecture)]


def device_name(j: int) -> str:
    return f"/dev/sd{_DEVICE_LETTERS[j]}"


def disk_candidates(volume_id: str, j: int) -> list[str]:
    """Where EBS volume ``j`` shows up: by id on Nitro (NVMe), else by its attachment name."""
    return [
        f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{volume_id.replace('-', '')}",
        f"/dev/xvd{_DEVICE_LETTERS[j]}",
        device_name(j),
    ]


@dataclass
class Declared:
    """What the program declared (the tests look at these)."""

    provider: Any
    security_group: Any
    key_pair: Any
    instances: dict[int, Any]
    volumes: dict[int, list[Any]]
    attachments: dict[int, list[Any]]


def program(plan: PoolPlan) -> Declared:
    """Declare the pool's resources; call inside a Pulumi program (or under mocks)."""
    # Typed as Any: the SDKs' overloads reject plain dict inputs that they accept at run time.
    pulumi: Any = importlib.import_module("pulumi")
    aws: Any = importlib.import_module("pulumi_aws")

    tags = plan.labels()
    s = plan.settings
    provider = aws.Provider(
        "aws", region=plan.region, profile=s.get("profile"), default_tags={"tags": tags},
    )
    res = pulumi.ResourceOptions(provider=provider)
    invoke = pulumi.InvokeOptions(provider=provider)

    if s.get("subnet"):
        subnet = aws.ec2.get_subnet_output(id=s["subnet"], opts=invoke)
    else:
        vpc = aws.ec2.get_vpc_output(default=True, opts=invoke)
        subnet = aws.ec2.get_subnet_output(
            vpc_id=vpc.id, default_for_az=True, availability_zone=plan.zone, opts=invoke,
        ) if plan.zone else aws.ec2.get_subnet_output(id=aws.ec2.get_subnets_output(
            filters=[{"name": "vpc-id", "values": [vpc.id]}, {"name": "default-for-az", "values": ["true"]}],
            opts=invoke,
        ).ids[0], opts=invoke)

    group = aws.ec2.SecurityGroup(
        "nodes",
        description=f"skyward pool {plan.pool}: ssh from the client, all traffic between the nodes",
        vpc_id=subnet.vpc_id,
        ingress=[
            {"description": "ssh from the skyward client", "protocol": "tcp", "from_port": 22, "to_port": 22,
             "cidr_blocks": [c for c in plan.ssh_cidrs if ":" not in c],
             "ipv6_cidr_blocks": [c for c in plan.ssh_cidrs if ":" in c]},
            {"description": "the pool's own nodes", "protocol": "-1", "from_port": 0, "to_port": 0, "self": True},
        ],
        egress=[{"description": "everything out", "protocol": "-1", "from_port": 0, "to_port": 0,
                 "cidr_blocks": ["0.0.0.0/0"], "ipv6_cidr_blocks": ["::/0"]}],
        tags={**tags, "Name": f"skyward-{plan.stack}"},
        opts=res,
    )
    key = aws.ec2.KeyPair("client", key_name=f"skyward-{plan.stack}", public_key=plan.ssh_public_key, tags=tags, opts=res)

    if plan.image:
        ami: Any = plan.image
    else:
        owner, pattern = ami_filter(plan)
        ami = aws.ec2.get_ami_output(
            most_recent=True, owners=[owner], opts=invoke,
            filters=[{"name": "name", "values": [pattern]}, {"name": "state", "values": ["available"]}],
        ).id

    instances: dict[int, Any] = {}
    volumes: dict[int, list[Any]] = {}
    attachments: dict[int, list[Any]] = {}
    for node in plan.nodes:
        vols = [
            aws.ebs.Volume(
                f"{node.name}-disk-{j}", availability_zone=subnet.availability_zone, size=disk.size_gb,
                type=disk.type or "gp3", tags={**tags, "Name": f"skyward-{plan.stack}-{node.name}-disk-{j}"},
                opts=res,
            )
            for j, disk in enumerate(plan.disks)
        ]
        user_data = pulumi.Output.all(*[v.id for v in vols]).apply(
            lambda ids, node=node: cloud_config(plan, node, [disk_candidates(i, j) for j, i in enumerate(ids)])
        )
        inst = aws.ec2.Instance(
            node.name,
            ami=ami,
            instance_type=plan.instance_type,
            subnet_id=subnet.id,
            vpc_security_group_ids=[group.id],
            key_name=key.key_name,
            associate_public_ip_address=True,
            instance_initiated_shutdown_behavior="terminate",
            instance_market_options=_market(node),
            root_block_device={"volume_size": plan.disk_gb, "volume_type": "gp3", "delete_on_termination": True},
            user_data=pulumi.Output.secret(user_data),  # it carries the node's private host key
            user_data_replace_on_change=True,
            tags={**tags, "Name": f"skyward-{plan.stack}-{node.name}", "skyward-node": str(node.index)},
            opts=res,
        )
        instances[node.index] = inst
        volumes[node.index] = vols
        attachments[node.index] = [
            aws.ec2.VolumeAttachment(
                f"{node.name}-disk-{j}", device_name=device_name(j), volume_id=v.id, instance_id=inst.id,
                opts=res,
            )
            for j, v in enumerate(vols)
        ]

    pulumi.export("nodes", [
        {"index": i, "id": inst.id, "public_ip": inst.public_ip, "private_ip": inst.private_ip,
         "hostname": inst.private_dns}
        for i, inst in instances.items()
    ])
    return Declared(provider, group, key, instances, volumes, attachments)


def _market(node: NodePlan) -> dict[str, Any] | None:
    if not node.spot:
        return None
    return {"market_type": "spot", "spot_options": {
        "spot_instance_type": "one-time", "instance_interruption_behavior": "terminate",
    }}
