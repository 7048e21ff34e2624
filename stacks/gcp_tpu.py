"""The GCP stack program for a Cloud TPU pool: one TPU VM per node.

A TPU is not a card attached to a Compute Engine instance: a TPU VM is its own resource
(``gcp.tpu.V2Vm``), named by its *accelerator type* (``v5litepod-8``: the slice) and booted
from a TPU *runtime version* (``v2-alpha-tpuv5-lite``) instead of an image. Everything else is
as for instances (stacks/gcp.py): the pool's firewall rules on its network tag (and, for
more than one node, all traffic from the TPU VMs' private addresses too, since nothing says a
TPU VM counts as a tagged source under the deny-all), the ``ssh-keys`` metadata with the client key, ``user-data`` with the node's host key and the TTL
watchdog, labels with the pool name and expiry, spot (or preemptible, for the generations
that predate spot) where the plan says. The nodes are then bootstrapped over SSH like any
other, and the jax plugin's rendezvous works across them as across GPU nodes.

Scope: single-host slices (v2-8, v3-8, v4-8, v5litepod-1/4/8, v5p-8, v6e-1/4/8), one per
node. Multi-host slices (v4-64...) have several workers per resource and are refused by
selection (no catalogue offer). ``sky.Disk`` volumes and cloud-granted buckets are not
declared for TPU VMs yet: a plan with them is refused here, before anything is created.

TTL: the node's watchdog, delivered twice (cloud-init ``user-data``, and ``startup-script``,
which the guest agent runs on TPU runtime images), deletes the node's TPU node through the TPU
API (v2, ``DELETE projects/P/locations/Z/nodes/N``), which stops its billing, with the node's own
service account. A refused delete is retried with backoff **for ever**: the node never powers
off, because a powered-off TPU VM bills on and no process would be left to end it. The TPU API
has no ``termination_time``: this watchdog (and the pool's client, or ``skyward down``) is all
that bounds a TPU pool's cost; ``skyward preview`` says so for each TPU VM.
That account holds one permission, ``tpu.nodes.delete`` (a custom role of the pool), granted on
the project, **unconditionally**: a TPU node has no IAM policy of its own to grant it on, and an
IAM condition on ``resource.name`` cannot narrow it, because Cloud TPU is not among the services
whose requests carry resource attributes for IAM Conditions (IAM docs, *Resource attributes for IAM
Conditions*: "Other services and resource types do not recognize resource attributes"), so such
a condition either refuses the delete (the TPU bills until ``down``) or never narrows it. This is
an over-grant, said so in the preview and the clouds guide: any TPU VM of a pool may delete any TPU
node of the project; run TPU pools in a project of their own. (The way to a per-node grant is to
create the slices as Compute Engine instances -- Google's *Create a TPU VM instance* path, for
the generations sold as machine types -- which gives the instance-level grant and
``termination_time`` of stacks/gcp.py; not done yet.)

Outputs: ``nodes``, one entry per node (index, id, public and private IP, hostname), from
each VM's first network endpoint.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from .gcp_common import (
    ALLOW_PRIORITY,
    account_id,
    choose_zone,
    declare_firewalls,
    instance_name,
    network_tag,
    short_id,
)
from .plan import NodePlan, PoolPlan
from .userdata import cloud_config, startup_script

# Runtime versions by TPU generation (the prefix of the accelerator type), for rows that do
# not name one: the Ubuntu 22.04 base for v2-v4, the v2-alpha runtimes for v5e, v5p and v6e.
RUNTIMES = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}
# Generations that take spot VMs; the older ones are "preemptible".
SPOT_GENERATIONS = ("v5litepod", "v5p", "v6e")


# What a TPU VM's service account may do: delete its TPU node (the TTL watchdog); granted on the
# project, so every TPU node of the project (see the module's docstring).
TPU_SELF_DELETE_PERMISSIONS = ("tpu.nodes.delete",)


def is_tpu(plan: PoolPlan) -> bool:
    """Whether the plan's offer is a Cloud TPU (catalogue rows ``tpu-<type>`` with ``tpu`` settings)."""
    return bool(plan.settings.get("tpu")) or plan.instance_type.startswith("tpu-")


def accelerator_type(plan: PoolPlan) -> str:
    """``v5litepod-8``: the slice, as the TPU API names it."""
    return str(plan.settings.get("accelerator_type") or plan.instance_type.removeprefix("tpu-"))


def generation(plan: PoolPlan) -> str:
    return accelerator_type(plan).rsplit("-", 1)[0]


def runtime_version(plan: PoolPlan) -> str:
    tpu = plan.settings.get("tpu") or {}
    runtime = tpu.get("runtime_version") or RUNTIMES.get(generation(plan))
    if not runtime:
        raise ValueError(
            f"TPU type {accelerator_type(plan)!r} has no known runtime version; give one with the "
            f"catalogue row's tpu.runtime_version."
        )
    return str(runtime)


def scheduling(plan: PoolPlan, node: NodePlan) -> dict[str, bool]:
    if not node.spot:
        return {}
    return {"spot": True} if generation(plan) in SPOT_GENERATIONS else {"preemptible": True}


def _refuse_what_is_not_declared(plan: PoolPlan) -> None:
    if plan.disks:
        raise ValueError(
            f"pool {plan.pool}: sky.Disk volumes are not supported on TPU VMs yet; drop volumes= "
            f"or use a GPU/CPU machine type."
        )
    if getattr(plan, "buckets", ()):
        raise ValueError(
            f"pool {plan.pool}: buckets granted by the cloud (sky.Volume with storage=None) are not "
            f"supported on TPU VMs yet; give the Volume a sky.storage preset with keys instead."
        )
    if getattr(plan, "serve_ports", ()):
        raise ValueError(
            f"pool {plan.pool}: opening an endpoint's port to allow_from= is not supported on TPU VMs yet "
            f"(nothing says a firewall rule can target one TPU VM); serve with on='client', or on='head' "
            f"without allow_from= for clients among the pool's own nodes."
        )
    tpu = plan.settings.get("tpu") or {}
    if int(tpu.get("hosts", 1)) != 1:
        raise ValueError(
            f"TPU type {accelerator_type(plan)!r} spans {tpu['hosts']} hosts; only single-host slices "
            f"are supported (one TPU VM per node)."
        )


def endpoint(endpoints: Any, *, public: bool) -> str | None:
    """The first worker's private address, or its external one (None until the VM exists)."""
    if not endpoints:
        return None
    first = endpoints[0]
    if public:
        configs = _field(first, "access_configs", "accessConfigs") or []
        return _field(configs[0], "external_ip", "externalIp") if configs else None
    return _field(first, "ip_address", "ipAddress")


def _field(value: Any, name: str, camel: str) -> Any:
    # Output types when the engine resolves them, plain dicts under mocks.
    if isinstance(value, dict):
        return value.get(name, value.get(camel))
    return getattr(value, name, None)


def _allow_by_address(gcp: Any, pulumi: Any, plan: PoolPlan, network: str, tag: str, vms: list[Any],
                      res: Any) -> Any:
    """All traffic from the pool's TPU VMs by their private addresses, above the deny-all: nothing
    says a TPU VM counts as a source carrying the pool's tag, which the "internal" rule needs.
    The tag stays a source too, so the rule never matches everything before the addresses exist
    (a rule with no sources at all would allow 0.0.0.0/0)."""
    addresses = pulumi.Output.all(*[vm.network_endpoints.apply(lambda eps: endpoint(eps, public=False))
                                    for vm in vms]).apply(lambda ips: sorted(f"{ip}/32" for ip in ips if ip))
    return gcp.compute.Firewall(
        "internal-addresses", network=network, direction="INGRESS", priority=ALLOW_PRIORITY,
        description=f"skyward pool {plan.pool}: all traffic between its TPU VMs, by address",
        allows=[{"protocol": "all"}], source_ranges=addresses, source_tags=[tag], target_tags=[tag], opts=res,
    )


@dataclass
class Declared:
    """What the TPU program declared (the tests look at these)."""

    provider: Any
    firewalls: dict[str, Any]
    vms: dict[int, Any]
    zone: str
    accounts: dict[int, Any]
    role: Any
    grants: dict[int, Any]


def program(plan: PoolPlan) -> Declared:
    """Declare a TPU pool's resources; called by stacks.gcp.program for TPU offers."""
    pulumi: Any = importlib.import_module("pulumi")
    gcp: Any = importlib.import_module("pulumi_gcp")
    _refuse_what_is_not_declared(plan)
    s = plan.settings
    labels = plan.labels()
    zone = choose_zone(plan)
    provider = gcp.Provider("gcp", project=s.get("project"), region=plan.region, zone=zone, default_labels=labels)
    res = pulumi.ResourceOptions(provider=provider)
    network = s.get("network") or "default"
    tag = network_tag(plan)

    firewalls = declare_firewalls(gcp, plan, network, tag, res)

    kind, runtime = accelerator_type(plan), runtime_version(plan)
    project = s.get("project")
    role = gcp.projects.IAMCustomRole(
        "tpu-self-delete", role_id=f"skyward_{short_id(plan)}_tpu_delete", project=project,
        title=f"skyward {plan.stack}: a TPU VM deletes itself",
        description=("Lets a skyward TPU VM delete its TPU node when its pool's TTL ran out; granted on the "
                     "project, it may delete every TPU node of the project (Cloud TPU has no per-node grant)."),
        permissions=list(TPU_SELF_DELETE_PERMISSIONS), opts=res,
    )
    vms: dict[int, Any] = {}
    accounts: dict[int, Any] = {}
    grants: dict[int, Any] = {}
    for node in plan.nodes:
        name = instance_name(plan, node)
        account = gcp.serviceaccount.Account(
            f"{node.name}-account", account_id=account_id(plan, node), project=project,
            # A create retried after its answer was lost adopts the account instead of failing
            # on "already exists" (terraform-provider-google #18087).
            create_ignore_already_exists=True,
            display_name=f"skyward {plan.stack} TPU node {node.index}", opts=res,
        )
        user_data = cloud_config(plan, node, [], cloud="gcp", tpu_node=(zone, name))
        vms[node.index] = gcp.tpu.V2Vm(
            node.name,
            name=name,
            zone=zone,
            project=project,
            service_account={"email": account.email, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]},
            accelerator_type=kind,
            runtime_version=runtime,
            network_config={
                "network": network, "subnetwork": s.get("subnetwork"), "enable_external_ips": True,
            },
            scheduling_config=scheduling(plan, node),
            metadata={
                "ssh-keys": f"{plan.ssh_user}:{plan.ssh_public_key}",
                "block-project-ssh-keys": "true",
                "enable-oslogin": "FALSE",
                "user-data": pulumi.Output.secret(user_data),  # it carries the node's private host key
                # The watchdog again: the guest agent runs this on TPU runtime images, where
                # nothing promises that cloud-init runs the user data.
                "startup-script": startup_script(plan, (zone, name)),
            },
            labels={**labels, "skyward-node": str(node.index)},
            tags=[tag],
            description=f"skyward pool {plan.pool} node {node.index}",
            opts=res,
        )
        grants[node.index] = gcp.projects.IAMMember(
            f"{node.name}-self-delete", project=project or gcp.organizations.get_client_config_output(
                opts=pulumi.InvokeOptions(provider=provider)).project, role=role.name,
            member=account.email.apply(lambda email: f"serviceAccount:{email}"),
            opts=res,  # no condition: Cloud TPU requests carry no resource attributes to test
        )
        accounts[node.index] = account

    if len(vms) > 1:
        firewalls["internal-addresses"] = _allow_by_address(gcp, pulumi, plan, network, tag, list(vms.values()), res)

    pulumi.export("nodes", [
        {"index": i, "id": vm.id,
         "public_ip": vm.network_endpoints.apply(lambda eps: endpoint(eps, public=True)),
         "private_ip": vm.network_endpoints.apply(lambda eps: endpoint(eps, public=False)), "hostname": vm.name}
        for i, vm in vms.items()
    ])
    pulumi.export("placement", {"zone": zone})
    return Declared(provider, firewalls, vms, zone, accounts, role, grants)
