"""What both GCP stack programs use: the names of a pool's resources and the zone it goes to.

gcp.py (Compute Engine instances) hands TPU pools to gcp_tpu.py (TPU VMs); the two name their
nodes and network tag alike and choose the zone alike, from these functions, so that neither
program imports the other for them.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from .plan import NodePlan, PoolPlan


def resource_name(base: str, suffix: str = "") -> str:
    """A valid GCP resource name: lower case, at most 63 characters, no trailing dash."""
    base = re.sub(r"[^a-z0-9-]+", "-", base.lower())
    return (base[: 63 - len(suffix)].rstrip("-") + suffix).strip("-")


def network_tag(plan: PoolPlan) -> str:
    return resource_name(f"sky-{plan.stack}")


def instance_name(plan: PoolPlan, node: NodePlan) -> str:
    return resource_name(f"sky-{plan.stack}", suffix=f"-{node.index}")


def choose_zone(plan: PoolPlan) -> str:
    """The pinned zone, the given one, or the ``zone_attempt``-th candidate."""
    s = plan.settings
    pinned = (s.get("pinned") or {}).get("zone")
    if pinned or plan.zone:
        return str(pinned or plan.zone)
    zones = list(s.get("zones") or []) or [f"{plan.region}-b"]
    attempt = int(s.get("zone_attempt") or 0)
    if attempt >= len(zones):
        raise ValueError(
            f"every zone of {plan.region} that has {plan.instance_type} ({', '.join(zones)}) was tried "
            f"and none could start it; try another region or machine type."
        )
    return str(zones[attempt])


# Firewall priorities (lower wins). The pool's allows; then, above the default network's own rules
# (default-allow-ssh: tcp:22 from 0.0.0.0/0, default-allow-internal: everything from 10.128.0.0/9,
# both at 65534; a project may add its own), a deny-all on the pool's tag, so that only what the
# pool allows reaches its nodes. Rules of the project at a priority below 65000 still apply.
ALLOW_PRIORITY = 1000
DENY_PRIORITY = 65000


def declare_firewalls(gcp: Any, plan: PoolPlan, network: str, tag: str, res: Any) -> dict[str, Any]:
    """The pool's firewall rules on its network tag: TCP 22 from the client's sources (a rule per
    address family: a rule cannot mix them), all traffic between tagged nodes, and a deny of
    everything else in (IPv4 and IPv6)."""
    firewalls: dict[str, Any] = {}
    v4 = [c for c in plan.ssh_cidrs if ":" not in c]
    v6 = [c for c in plan.ssh_cidrs if ":" in c]
    for key, ranges in (("ssh", v4), ("ssh-v6", v6)):
        if ranges:
            firewalls[key] = gcp.compute.Firewall(
                key, network=network, direction="INGRESS", priority=ALLOW_PRIORITY,
                description=f"skyward pool {plan.pool}: ssh from the client",
                allows=[{"protocol": "tcp", "ports": ["22"]}], source_ranges=ranges, target_tags=[tag], opts=res,
            )
    firewalls["internal"] = gcp.compute.Firewall(
        "internal", network=network, direction="INGRESS", priority=ALLOW_PRIORITY,
        description=f"skyward pool {plan.pool}: all traffic between its nodes",
        allows=[{"protocol": "all"}], source_tags=[tag], target_tags=[tag], opts=res,
    )
    for key, everywhere in (("deny-all", "0.0.0.0/0"), ("deny-all-v6", "::/0")):
        firewalls[key] = gcp.compute.Firewall(
            key, network=network, direction="INGRESS", priority=DENY_PRIORITY,
            description=f"skyward pool {plan.pool}: nothing else in (the default network allows ssh from "
                        f"anywhere and all traffic from its other VMs at 65534)",
            denies=[{"protocol": "all"}], source_ranges=[everywhere], target_tags=[tag], opts=res,
        )
    return firewalls


def declare_serve_firewalls(gcp: Any, plan: PoolPlan, network: str, accounts: dict[int, Any],
                            res: Any) -> dict[str, Any]:
    """The rules of ``plan.serve_ports`` (``pool.serve(on="head", allow_from=...)``): TCP on the
    port from its CIDRs (a rule per address family), targeting that node alone by its own service
    account (every node has one: the pool's tag is on all of them, and the instance itself stays
    as it is). Above the deny-all, like the pool's other allows. A node no longer in the plan
    gets none."""
    firewalls: dict[str, Any] = {}
    for p in plan.serve_ports:
        account = accounts.get(p.node)
        if account is None:
            continue
        v4 = [c for c in p.cidrs if ":" not in c]
        v6 = [c for c in p.cidrs if ":" in c]
        for key, ranges in ((f"serve-{p.node}-{p.port}", v4), (f"serve-{p.node}-{p.port}-v6", v6)):
            if ranges:
                firewalls[key] = gcp.compute.Firewall(
                    key, network=network, direction="INGRESS", priority=ALLOW_PRIORITY,
                    description=f"skyward pool {plan.pool}: pool.serve on port {p.port} of node {p.node} "
                                f"from allow_from",
                    allows=[{"protocol": "tcp", "ports": [str(p.port)]}], source_ranges=ranges,
                    target_service_accounts=[account.email], opts=res,
                )
    return firewalls


def short_id(plan: PoolPlan) -> str:
    """Ten hex digits of the stack name: service account and role ids are short."""
    return hashlib.sha256(plan.stack.encode()).hexdigest()[:10]


def account_id(plan: PoolPlan, node: NodePlan) -> str:
    """The node's service account id (6-30 characters)."""
    return f"sky-{short_id(plan)}-{node.index}"
