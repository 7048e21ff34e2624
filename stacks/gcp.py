"""The GCP stack program: what one pool is on Compute Engine.

* firewall rules on the pool's network tag: TCP 22 from the client's address (/32) and any
  CIDRs the user added (one rule per address family: a rule cannot mix them); all traffic
  between instances carrying the tag; and nothing else in: a deny-all on the tag (IPv4 and
  IPv6) at priority 65000, above the default network's own allow rules at 65534
  (gcp_common.declare_firewalls); per port an ``on="head"`` endpoint opened (``plan.serve_ports``),
  TCP from its ``allow_from=`` CIDRs to that node alone, by its service account
  (gcp_common.declare_serve_firewalls);
* per node, a service account that may do one thing: delete that node's own instance and
  disks (a custom role with those permissions only, granted on that instance and those disks,
  nowhere else). The TTL watchdog uses it: a guest power-off would only *stop* the VM, and a
  stopped VM's disks keep billing;
* one instance per node: SPOT or STANDARD provisioning as the plan says per node; Compute
  Engine deletes it at spot preemption and at the pool's absolute deadline
  (``termination_time``, the same instant for nodes added later); guest accelerators for
  machine types that take them; boot disk of disk_gb; ``ssh-keys`` metadata with the pool's
  client key, OS Login off for the instance (a project enforcing it would ignore ssh-keys),
  ``user-data`` with its host key, disk mounts and the TTL watchdog; labels with the pool
  name, expiry and skyward version;
* one persistent disk per node and Disk, attached to that node.

The zone is the one given, else the ``zone_attempt``-th of ``settings["zones"]`` (zones of the
region that have the accelerator, from the catalogue: the pool tries the next one when a zone
has no capacity). The boot image family is resolved once to a concrete image: the first
``up`` exports it and the zone (``placement``), the pool pins them in its plan, and later
``up``s never replace a running node for a newer image in the family.

A pool of several groups (``plan.groups``) is one such stack: the firewalls, network tag and
custom role are the pool's; each node's instance is made from its group's view of the plan
(``PoolPlan.of``: machine type, accelerators, disks, image, ttl), labelled ``skyward-group``;
each group's image is pinned (``placement["images"]``).

Outputs: ``nodes``, one entry per node (index, id, public and private IP, hostname), and
``placement`` (image, zone).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from . import buckets
from . import disks as disk_rules
from .gcp_common import (
    account_id,
    choose_zone,
    declare_firewalls,
    declare_serve_firewalls,
    instance_name,
    network_tag,
    resource_name,
    short_id,
)
from .plan import NodePlan, PoolPlan, label_value
from .userdata import NVIDIA_BRANCH, cloud_config

# Canonical's Ubuntu 24.04 images; for GPUs the accelerator images with the current NVIDIA
# production driver branch preinstalled.
_IMAGES = {
    ("cpu", "x86_64"): ("ubuntu-os-cloud", "ubuntu-2404-lts-amd64"),
    ("cpu", "arm64"): ("ubuntu-os-cloud", "ubuntu-2404-lts-arm64"),
    ("gpu", "x86_64"): ("ubuntu-os-accelerator-images", "ubuntu-accelerator-2404-amd64-with-nvidia-580"),
    ("gpu", "arm64"): ("ubuntu-os-accelerator-images", "ubuntu-accelerator-2404-arm64-with-nvidia-580"),
}
# NVIDIA's open kernel modules drive Turing and newer GPUs only (NVIDIA's R560 announcement:
# "for older GPUs from the Maxwell, Pascal, or Volta architectures, the open-source GPU kernel
# modules are not compatible"), and nothing promises the accelerator image's 580 driver is the
# proprietary flavour. Nodes with these GPUs boot plain Ubuntu and install the proprietary
# flavour of the 580 server driver at boot, built by Canonical for the running GCP kernel
# (userdata.nvidia_proprietary_script); R580 is the last branch that supports Pascal and Volta.
PROPRIETARY_DRIVER_GPUS = ("nvidia-tesla-p100", "nvidia-tesla-p4", "nvidia-tesla-v100")  # and their -vws
# What the node's service account may do: delete its own instance, with its disks.
SELF_DELETE_PERMISSIONS = ("compute.instances.delete", "compute.instances.setDiskAutoDelete", "compute.disks.delete")

# GCP's naming rules, checked by the tests against every name the program declares.
NAME_RULE = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"  # instances, disks, firewalls, tags (gcp_common.resource_name)
ACCOUNT_ID_RULE = r"^[a-z]([-a-z0-9]{4,28}[a-z0-9])$"  # service accounts: 6-30 characters
ROLE_ID_RULE = r"^[a-zA-Z0-9_.]{3,64}$"
LABEL_RULE = r"^[a-z0-9_-]{0,63}$"  # label values (keys also start with a letter)


def needs_proprietary_driver(plan: PoolPlan) -> bool:
    """Whether the plan's GPU is older than Turing (P100, P4, V100): the open kernel modules do
    not drive it."""
    accel = str(plan.settings.get("accelerator_type") or "")
    return bool(plan.settings.get("attach")) and accel.removesuffix("-vws") in PROPRIETARY_DRIVER_GPUS


def default_image(plan: PoolPlan) -> tuple[str, str]:
    """(project, family) of the default boot image for the plan's hardware."""
    if needs_proprietary_driver(plan):  # plain Ubuntu; the node installs the proprietary driver
        return _IMAGES[("cpu", plan.architecture)]
    return _IMAGES[("gpu" if plan.gpu else "cpu", plan.architecture)]


def role_id(plan: PoolPlan) -> str:
    return f"skyward_{short_id(plan)}_self_delete"


@dataclass
class Declared:
    """What the program declared (the tests look at these)."""

    provider: Any
    firewalls: dict[str, Any]
    instances: dict[int, Any]
    disks: dict[int, list[Any]]
    accounts: dict[int, Any]
    role: Any
    grants: dict[int, list[Any]]
    image: Any
    zone: str
    images: dict[str, Any] | None = None  # group -> its boot image ("" in a pool of one kind of node)


def program(plan: PoolPlan) -> Declared:
    """Declare the pool's resources; call inside a Pulumi program (or under mocks)."""
    # Typed as Any: the SDKs' overloads reject plain dict inputs that they accept at run time.
    pulumi: Any = importlib.import_module("pulumi")
    gcp: Any = importlib.import_module("pulumi_gcp")
    from . import gcp_tpu

    if gcp_tpu.is_tpu(plan):  # a TPU VM per node instead of an instance (stacks/gcp_tpu.py)
        return gcp_tpu.program(plan)  # type: ignore[return-value]

    s = plan.settings
    # Each group's machine: its view of the plan (the plan itself in a pool of one kind of node).
    machines = {g: _Machine.of(plan.of(g)) for g in plan.group_names()}
    labels = plan.labels()
    zone = choose_zone(plan)
    project = s.get("project")
    provider = gcp.Provider(
        "gcp", project=project, region=plan.region, zone=zone, default_labels=labels,
    )
    res = pulumi.ResourceOptions(provider=provider)
    network = s.get("network") or "default"
    tag = network_tag(plan)

    firewalls = declare_firewalls(gcp, plan, network, tag, res)

    images = {g: _image(pulumi, gcp, m.plan, provider) for g, m in machines.items()}
    image = images[plan.group_names()[0]]

    role = gcp.projects.IAMCustomRole(
        "self-delete", role_id=role_id(plan), project=project,
        title=f"skyward {plan.stack}: a node deletes itself",
        description="Lets a skyward node delete its own instance and disks when its pool's TTL ran out.",
        permissions=list(SELF_DELETE_PERMISSIONS), opts=res,
    )

    # Pinned after the first up; ignore_changes keeps a new image= from replacing running nodes.
    inst_opts = pulumi.ResourceOptions(provider=provider, ignore_changes=["bootDisk.initializeParams.image"])
    instances: dict[int, Any] = {}
    disks: dict[int, list[Any]] = {}
    accounts: dict[int, Any] = {}
    grants: dict[int, list[Any]] = {}
    checked_buckets: dict[str, Any] = {}  # sky.Volume buckets looked up (buckets.declare_gcp)
    for node in plan.nodes:
        name = instance_name(plan, node)
        m = machines[node.group]
        node_labels = {**labels, **({"skyward-group": label_value(node.group)} if node.group else {})}
        node_disks = [
            gcp.compute.Disk(
                f"{node.name}-disk-{j}", name=resource_name(f"sky-{plan.stack}", suffix=f"-{node.index}-disk-{j}"), zone=zone, size=disk.size_gb,
                type=disk.type or m.disk_type, labels=node_labels, opts=res,
                **({"provisioned_iops": disk.iops} if disk.iops else {}),
            )
            for j, disk in enumerate(m.plan.disks)
        ]
        account = gcp.serviceaccount.Account(
            f"{node.name}-account", account_id=account_id(plan, node), project=project,
            # A create retried after its answer was lost adopts the account instead of failing
            # on "already exists" (terraform-provider-google #18087).
            create_ignore_already_exists=True,
            display_name=f"skyward {plan.stack} node {node.index}", opts=res,
        )
        user_data = cloud_config(m.plan, node, [[f"/dev/disk/by-id/google-disk-{j}"] for j in range(len(m.plan.disks))],
                                 cloud="gcp", proprietary_driver=m.proprietary_at_boot)
        inst = gcp.compute.Instance(
            node.name,
            name=name,
            machine_type=m.machine_type,
            zone=zone,
            boot_disk={"auto_delete": True, "initialize_params": {
                "image": images[node.group], "size": m.plan.disk_gb, "type": m.disk_type,
            }},
            network_interfaces=[{
                "network": network, "subnetwork": s.get("subnetwork"), "access_configs": [{}],
                **({"nic_type": "GVNIC"} if needs_gvnic(m.machine_type) else {}),
            }],
            attached_disks=[{"source": d.self_link, "device_name": f"disk-{j}"} for j, d in enumerate(node_disks)],
            guest_accelerators=[{"type": m.accel, "count": m.accel_count}] if m.attach else [],
            scheduling=_scheduling(node, plan),
            service_account={"email": account.email, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]},
            metadata={
                # The guest agent installs ssh-keys at once; a node installing its GPU driver at
                # boot admits the client only once a GPU answers (userdata._NVIDIA), so it gets none.
                **({"skyward-gpu-driver": f"nvidia-{NVIDIA_BRANCH} (proprietary), installed at boot"}
                   if m.proprietary_at_boot else {"ssh-keys": f"{plan.ssh_user}:{plan.ssh_public_key}"}),
                "block-project-ssh-keys": "true",
                # A project (or organization) enforcing OS Login ignores ssh-keys metadata.
                "enable-oslogin": "FALSE",
                "user-data": pulumi.Output.secret(user_data),  # it carries the node's private host key
            },
            labels={**node_labels, "skyward-node": str(node.index)},
            tags=[tag],
            allow_stopping_for_update=True,
            opts=inst_opts,
        )
        member = account.email.apply(lambda email: f"serviceAccount:{email}")
        grants[node.index] = [
            gcp.compute.InstanceIAMMember(
                f"{node.name}-self-delete", project=project, zone=zone, instance_name=inst.name,
                role=role.name, member=member, opts=res,
            ),
            # The boot disk (named after the instance) and the extra disks: deleted with it.
            *[
                gcp.compute.DiskIamMember(
                    f"{node.name}-disk-{j}-self-delete", project=project, zone=zone, name=disk_name,
                    role=role.name, member=member, opts=pulumi.ResourceOptions(provider=provider, depends_on=[inst]),
                )
                for j, disk_name in [("boot", inst.name), *[(str(k), d.name) for k, d in enumerate(node_disks)]]
            ],
        ]
        # sky.Volume(storage=None): this node's account may use exactly those buckets (buckets.py).
        grants[node.index] += buckets.declare_gcp(gcp, plan, node.name, member, res, checked_buckets)
        instances[node.index] = inst
        disks[node.index] = node_disks
        accounts[node.index] = account
    firewalls.update(declare_serve_firewalls(gcp, plan, network, accounts, res))

    pulumi.export("nodes", [
        {"index": i, "id": inst.id,
         "public_ip": inst.network_interfaces[0].access_configs[0].nat_ip,
         "private_ip": inst.network_interfaces[0].network_ip, "hostname": inst.name}
        for i, inst in instances.items()
    ])
    placement = {"image": image, "zone": zone}
    if plan.groups:  # each group's image, pinned per group (PoolPlan.of)
        placement["images"] = images
    pulumi.export("placement", placement)
    return Declared(provider, firewalls, instances, disks, accounts, role, grants, image, zone, images)


@dataclass(frozen=True)
class _Machine:
    """What one group's instances are made of (the whole pool's, in a pool of one kind of node)."""

    plan: PoolPlan  # the group's view of the pool's plan (PoolPlan.of)
    machine_type: str
    disk_type: str
    accel: Any
    accel_count: int
    attach: bool
    proprietary_at_boot: bool

    @classmethod
    def of(cls, plan: PoolPlan) -> _Machine:
        s = plan.settings
        machine_type = s.get("machine_type") or plan.instance_type
        disk_rules.gcp_check(plan.disks, machine_type)  # a plan reopened from a record, too
        accel = s.get("accelerator_type")
        return cls(
            plan, machine_type,
            disk_rules.gcp_default_type(machine_type),  # Hyperdisk on the series that take only it
            accel, int(s.get("accelerator_count", 1)), bool(s.get("attach")) and bool(accel),
            needs_proprietary_driver(plan) and not plan.image,  # an image= brings its own driver
        )


def _image(pulumi: Any, gcp: Any, plan: PoolPlan, provider: Any) -> Any:
    """The boot image of the plan's nodes: given, pinned by an earlier up, or the family's latest."""
    pinned = plan.settings.get("pinned") or {}
    if plan.image or pinned.get("image"):
        return pulumi.Output.from_input(plan.image or pinned["image"])
    image_project, family = default_image(plan)
    return gcp.compute.get_image_output(family=family, project=image_project,
                                        opts=pulumi.InvokeOptions(provider=provider)).self_link


# Machine series whose network interface must be gVNIC (Compute Engine's GPU machine types page:
# A3 and A4 support gVNIC only; a VirtIO-Net interface is refused or gets no network).
GVNIC_SERIES = ("a3-", "a4-")


def needs_gvnic(machine_type: str) -> bool:
    return machine_type.startswith(GVNIC_SERIES)


def _scheduling(node: NodePlan, plan: PoolPlan) -> dict[str, Any]:
    scheduling: dict[str, Any] = {
        "provisioning_model": "SPOT" if node.spot else "STANDARD",
        "preemptible": node.spot,
        "automatic_restart": False,
        # GPUs cannot live-migrate; every node is disposable anyway.
        "on_host_maintenance": "TERMINATE",
    }
    if node.spot or plan.expires is not None:
        scheduling["instance_termination_action"] = "DELETE"
    if plan.expires is not None:
        # An absolute instant: a node added an hour later stops at the same time as the others.
        scheduling["termination_time"] = rfc3339(plan.expires)
    return scheduling


def rfc3339(epoch: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(int(epoch), tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
