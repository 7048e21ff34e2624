"""What both GCP stack programs use: the names of a pool's resources and the zone it goes to.

gcp.py (Compute Engine instances) hands TPU pools to gcp_tpu.py (TPU VMs); the two name their
nodes and network tag alike and choose the zone alike, from these functions, so that neither
program imports the other for them.
"""

from __future__ import annotations

import hashlib
import re

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


def short_id(plan: PoolPlan) -> str:
    """Ten hex digits of the stack name: service account and role ids are short."""
    return hashlib.sha256(plan.stack.encode()).hexdigest()[:10]


def account_id(plan: PoolPlan, node: NodePlan) -> str:
    """The node's service account id (6-30 characters)."""
    return f"sky-{short_id(plan)}-{node.index}"
