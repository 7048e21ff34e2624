"""Fakes for the stack tests: Pulumi mocks that record what a program declares, plans, and a fake
automation-API workspace."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pulumi

from skyward.stacks import keys
from skyward.stacks.plan import DiskPlan, NodePlan, PoolPlan

CLIENT = "198.51.100.7/32"


@dataclass
class Recorder(pulumi.runtime.Mocks):
    """Pulumi mocks: every resource and invoke is recorded; outputs look like a cloud's."""

    resources: list[Any] = field(default_factory=list)
    calls: list[Any] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def new_resource(self, args: Any) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        n = next(self._ids)
        out = dict(args.inputs)
        rid = f"{args.name}-id"
        if args.typ == "aws:ec2/instance:Instance":
            rid = f"i-{n:08x}"
            out.update(publicIp=f"203.0.113.{n}", privateIp=f"10.0.0.{n}", privateDns=f"ip-10-0-0-{n}.ec2.internal")
        elif args.typ == "aws:ebs/volume:Volume":
            rid = f"vol-{n:012x}"
        elif args.typ == "gcp:compute/instance:Instance":
            interfaces = out.get("networkInterfaces") or [{}]
            interfaces[0] = {**interfaces[0], "networkIp": f"10.128.0.{n}", "accessConfigs": [{"natIp": f"203.0.113.{n}"}]}
            out["networkInterfaces"] = interfaces
        elif args.typ == "gcp:compute/disk:Disk":
            out["selfLink"] = f"https://compute.googleapis.com/disks/{args.name}-{n}"
        return rid, out

    def call(self, args: Any) -> dict[str, Any]:
        self.calls.append(args)
        token = args.token
        if token == "aws:ec2/getVpc:getVpc":
            return {"id": "vpc-default", "cidrBlock": "172.31.0.0/16"}
        if token == "aws:ec2/getSubnets:getSubnets":
            return {"ids": ["subnet-a", "subnet-b"]}
        if token == "aws:ec2/getSubnet:getSubnet":
            return {"id": args.args.get("id", "subnet-z"), "vpcId": "vpc-given" if args.args.get("id") else "vpc-default",
                    "availabilityZone": args.args.get("availabilityZone", "us-east-1a")}
        if token == "aws:ec2/getAmi:getAmi":
            name = args.args["filters"][0]["values"][0]
            return {"id": "ami-deeplearning" if "Deep Learning" in name else "ami-ubuntu"}
        return {}

    def of_type(self, typ: str) -> list[Any]:
        return [r for r in self.resources if r.typ == typ]


def make_plan(
    *, nodes: int = 1, spot: bool = False, gpu: bool = False, disks: tuple[DiskPlan, ...] = (),
    expires_in: int | None = None, ttl: int = 600, settings: dict[str, Any] | None = None,
    instance_type: str = "m7i.large", zone: str | None = None, region: str = "us-east-1",
) -> PoolPlan:
    now = int(time.time())
    client = keys.ed25519("client")
    node_plans = []
    for i in range(nodes):
        host = keys.ed25519(f"node-{i}")
        node_plans.append(NodePlan(index=i, spot=spot, host_key=host.public, host_key_private=host.private))
    return PoolPlan(
        pool="train", stack="train-ab12cd34", region=region, zone=zone, instance_type=instance_type,
        nodes=tuple(node_plans), ssh_user="ubuntu", ssh_public_key=client.public, ssh_cidrs=(CLIENT,),
        disk_gb=120 if gpu else 30, disks=disks, gpu=gpu, ttl=ttl, created=now,
        expires=now + expires_in if expires_in else None, version="0.1.0", settings=settings or {},
    )


def cloud_config(user_data: str) -> dict[str, Any]:
    """The cloud-config document of a node's user data."""
    head, body = user_data.split("\n", 1)
    assert head == "#cloud-config"
    return dict(json.loads(body))
