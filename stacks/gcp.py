"""The GCP stack program: what one pool is on Compute Engine.

* two firewall rules on the pool's network tag: TCP 22 from the client's address (/32) and
  any CIDRs the user added; all traffic between instances carrying the tag. Nothing else in;
* one instance per node: SPOT or STANDARD provisioning as the plan says per node; Compute
  Engine deletes it when it stops it (``instance_termination_action="DELETE"``, on spot
  preemption and at the optional ``max_run_duration`` cap); guest accelerators for machine
  types that take them; boot disk of disk_gb; the ``ssh-keys`` metadata with the pool's
  client key and ``user-data`` with its host key, disk mounts and the TTL watchdog; labels
  with the pool name, expiry and skyward version;
* one persistent disk per node and Disk, attached to that node.

Outputs: ``nodes``, one entry per node (index, id, public and private IP, hostname).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from .plan import NodePlan, PoolPlan
from .userdata import cloud_config

_IMAGES = {
    ("cpu", "x86_64"): "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64",
    ("cpu", "arm64"): "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-arm64",
    ("gpu", "x86_64"): "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2404-amd64-with-nvidia-570",
    ("gpu", "arm64"): "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2404-arm64-with-nvidia-570",
}


def default_image(plan: PoolPlan) -> str:
    return _IMAGES[("gpu" if plan.gpu else "cpu", plan.architecture)]


def network_tag(plan: PoolPlan) -> str:
    return f"sky-{plan.stack}"[:63]


def instance_name(plan: PoolPlan, node: NodePlan) -> str:
    return f"sky-{plan.stack}-{node.index}"


@dataclass
class Declared:
    """What the program declared (the tests look at these)."""

    provider: Any
    firewalls: dict[str, Any]
    instances: dict[int, Any]
    disks: dict[int, list[Any]]


def program(plan: PoolPlan) -> Declared:
    """Declare the pool's resources; call inside a Pulumi program (or under mocks)."""
    # Typed as Any: the SDKs' overloads reject plain dict inputs that they accept at run time.
    pulumi: Any = importlib.import_module("pulumi")
    gcp: Any = importlib.import_module("pulumi_gcp")

    s = plan.settings
    labels = plan.labels()
    zone = plan.zone or f"{plan.region}-a"
    provider = gcp.Provider(
        "gcp", project=s.get("project"), region=plan.region, zone=zone, default_labels=labels,
    )
    res = pulumi.ResourceOptions(provider=provider)
    network = s.get("network") or "default"
    tag = network_tag(plan)

    firewalls = {
        "ssh": gcp.compute.Firewall(
            "ssh", network=network, direction="INGRESS", description=f"skyward pool {plan.pool}: ssh from the client",
            allows=[{"protocol": "tcp", "ports": ["22"]}], source_ranges=list(plan.ssh_cidrs), target_tags=[tag],
            opts=res,
        ),
        "internal": gcp.compute.Firewall(
            "internal", network=network, direction="INGRESS",
            description=f"skyward pool {plan.pool}: all traffic between its nodes",
            allows=[{"protocol": "all"}], source_tags=[tag], target_tags=[tag], opts=res,
        ),
    }

    accel = s.get("accelerator_type")
    attach = bool(s.get("attach")) and accel
    instances: dict[int, Any] = {}
    disks: dict[int, list[Any]] = {}
    for node in plan.nodes:
        node_disks = [
            gcp.compute.Disk(
                f"{node.name}-disk-{j}", zone=zone, size=disk.size_gb, type=disk.type or "pd-balanced",
                labels=labels, opts=res,
            )
            for j, disk in enumerate(plan.disks)
        ]
        user_data = cloud_config(plan, node, [[f"/dev/disk/by-id/google-disk-{j}"] for j in range(len(plan.disks))])
        instances[node.index] = gcp.compute.Instance(
            node.name,
            name=instance_name(plan, node),
            machine_type=s.get("machine_type") or plan.instance_type,
            zone=zone,
            boot_disk={"auto_delete": True, "initialize_params": {
                "image": plan.image or default_image(plan), "size": plan.disk_gb, "type": "pd-balanced",
            }},
            network_interfaces=[{
                "network": network, "subnetwork": s.get("subnetwork"), "access_configs": [{}],
            }],
            attached_disks=[{"source": d.self_link, "device_name": f"disk-{j}"} for j, d in enumerate(node_disks)],
            guest_accelerators=[{"type": accel, "count": int(s.get("accelerator_count", 1))}] if attach else [],
            scheduling=_scheduling(node, plan),
            metadata={
                "ssh-keys": f"{plan.ssh_user}:{plan.ssh_public_key}",
                "block-project-ssh-keys": "true",
                "user-data": pulumi.Output.secret(user_data),  # it carries the node's private host key
            },
            labels={**labels, "skyward-node": str(node.index)},
            tags=[tag],
            allow_stopping_for_update=True,
            opts=res,
        )
        disks[node.index] = node_disks

    pulumi.export("nodes", [
        {"index": i, "id": inst.id,
         "public_ip": inst.network_interfaces[0].access_configs[0].nat_ip,
         "private_ip": inst.network_interfaces[0].network_ip, "hostname": inst.name}
        for i, inst in instances.items()
    ])
    return Declared(provider, firewalls, instances, disks)


def _scheduling(node: NodePlan, plan: PoolPlan) -> dict[str, Any]:
    cap = plan.expires - plan.created if plan.expires is not None else None
    scheduling: dict[str, Any] = {
        "provisioning_model": "SPOT" if node.spot else "STANDARD",
        "preemptible": node.spot,
        "automatic_restart": False,
        # GPUs cannot live-migrate; every node is disposable anyway.
        "on_host_maintenance": "TERMINATE",
    }
    if node.spot or cap is not None:
        scheduling["instance_termination_action"] = "DELETE"
    if cap is not None:
        scheduling["max_run_duration"] = {"seconds": int(cap)}
    return scheduling
