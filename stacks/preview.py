"""What a cloud pool's stack would create, without the Pulumi engine, the CLI or credentials.

The real stack program (``aws.program`` / ``gcp.program``) runs against Pulumi's own mocks
(``pulumi.runtime.set_mocks``): every resource it declares reaches ``new_resource`` with its
type token, name and inputs, and each becomes one line of the preview, with a short detail
(instance type and market, ports and CIDRs of each ingress rule, disk sizes...). Lookups
the program makes (default VPC, subnet, newest AMI) are answered with placeholders that say
what ``up`` would look up. Nothing is created and nothing is written.

The pulumi SDK keeps its runtime settings in context variables, with one leak: setting a
value where none was set also becomes the default every *other* thread sees (pulumi's
``ContextProperty.fset``). So the program runs in a thread of its own, in an empty context,
with its own event loop, under the engine's lock (``engine._ENGINE``: one Pulumi program at a
time per process), and the settings' defaults are put back afterwards: a later real ``up`` in
the same process, or a test's own mocks, see what they saw before.

Pools of thousands: Pulumi's SDK costs a few milliseconds per resource it registers, mocks or
not, so a large pool's program is not run on every node. It runs on the nodes numbered 0-9
and, for each other kind of node (same plan but for index and host key) and number of digits
in its index, on two stand-ins numbered 99..9 and 88..8 (77..7 and 66..6 for a second kind...).
The stand-ins' resources are those named after them (``node-<index>...``); every node of the
kind gets the first stand-in's lines with its own index written in, once replacing the first
stand-in's index by the second's gave exactly the second stand-in's lines. A kind that fails
that check because a stand-in's digits also occur in other text (Canonical's AWS account
099720109477 holds 99) is tried again with stand-ins whose digits occur in no line seen so
far; one that still fails (its lines follow the index some other way) is run on all of its
real nodes. The tests compare both ways on mixed plans.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skyward.errors import ConfigError, ProviderError

from . import engine

if TYPE_CHECKING:
    from skyward.catalogue import Offer
    from skyward.spec import Spec

    from .plan import NodePlan, PoolPlan

# Shown in place of this machine's public address: preview does not ask the internet for it.
THIS_MACHINE = "<this machine's public address>/32"


@dataclass(frozen=True, slots=True)
class Declared:
    """One resource the program declared: Pulumi type token, logical name, inputs as sent."""

    type: str
    name: str
    inputs: dict[str, Any]


def declared(program: Callable[[PoolPlan], Any], plan: PoolPlan) -> list[Declared]:
    """Run ``program(plan)`` under recording mocks, isolated from the rest of the process."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = contextvars.Context().run(_run, program, plan)
        except BaseException as exc:
            outcome["error"] = exc

    with engine._ENGINE, _settings_defaults_kept():
        worker = threading.Thread(target=target, name="skyward-stack-preview", daemon=True)
        worker.start()
        worker.join()
    if "error" in outcome:
        exc = outcome["error"]
        if isinstance(exc, ConfigError):  # the program refused the plan (stacks/disks.py): say why
            raise exc
        raise ProviderError(
            f"stack {plan.stack}: its program failed under preview ({type(exc).__name__}: {exc}); "
            f"this is a bug in skyward's stack program, please report it with this message."
        ) from exc
    found: list[Declared] = outcome["value"]
    return found


# A pool of up to this many nodes is previewed by running its program on every node.
FULL_RUN_NODES = 16


def resources(program: Callable[[PoolPlan], Any], plan: PoolPlan, *,
              full_run_nodes: int = FULL_RUN_NODES) -> list[dict[str, str]]:
    """``[{"type", "name", "detail"}]``, one per resource ``up`` would create, in declaration order.
    A plan of more than ``full_run_nodes`` nodes runs the program on a sample (module docstring)."""
    rows = _sampled(program, plan) if len(plan.nodes) > full_run_nodes else None
    if rows is None:
        rows = _rows(declared(program, plan))
    return _ordered(rows)


def _rows(found: Sequence[Declared]) -> list[dict[str, str]]:
    return [{"type": r.type, "name": r.name, "detail": detail(r)} for r in found]


def _ordered(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    order = {t: i for i, t in enumerate(_DETAILS)}
    return sorted(rows, key=lambda r: (order.get(r["type"], len(order)), _natural(r["name"])))


# -- large pools: the program run on a sample of nodes ---------------------------------------------
_OWNER = re.compile(r"^node-(\d+)(?:-|$)")  # node.name, and what the programs name after it
_ATTEMPTS = 3  # sample runs with new stand-ins for the kinds whose check failed, before their real nodes


def _sampled(program: Callable[[PoolPlan], Any], plan: PoolPlan) -> list[dict[str, str]] | None:
    """The rows of every node from a run on nodes 0-9 and two stand-ins per kind of node; None
    when the plan does not lend itself to that (then the program runs on every node)."""
    from dataclasses import replace

    groups: dict[tuple[Any, int], list[NodePlan]] = {}
    for node in plan.nodes:
        if node.index >= 10:
            groups.setdefault((_kind(node), len(str(node.index))), []).append(node)
    small = [n for n in plan.nodes if n.index < 10]
    rows: list[dict[str, str]] = []
    pending = list(groups)
    seen = ""  # the text of the lines so far: a stand-in's index must not occur in it
    for attempt in range(_ATTEMPTS):
        if not pending:
            break
        stand_ins = _stand_ins(pending, seen)
        sample = small if attempt == 0 else []
        for key, (a, b) in stand_ins.items():
            first = groups[key][0]
            sample = [*sample, replace(first, index=a), replace(first, index=b)]
        found = _rows(declared(program, plan.with_nodes(tuple(sample))))
        shared, by_node = _by_node(found)
        if attempt == 0:
            marks = [str(i) for pair in stand_ins.values() for i in pair]
            if any(m in r["name"] for r in shared for m in marks):
                return None  # a per-node resource not named after its node: no way to tell whose it is
            rows += shared + [r for n in small for r in by_node.get(n.index, [])]
        seen += "\n".join(f"{r['name']} {r['detail']}" for r in found)
        for key, (a, b) in stand_ins.items():
            template = _ordered(by_node.get(a, []))
            if template and _with_index(template, str(a), str(b)) == _ordered(by_node.get(b, [])):
                pending.remove(key)
                for node in groups[key]:
                    rows += _with_index(template, str(a), str(node.index))
            # else: its index also occurs in other text, or the lines follow it another way
    unsure = [n for key in pending for n in groups[key]]
    if unsure:
        _, theirs = _by_node(_rows(declared(program, plan.with_nodes(tuple(unsure)))))
        rows += [r for n in unsure for r in theirs.get(n.index, [])]
    return rows


def _stand_ins(keys: list[tuple[Any, int]], seen: str) -> dict[tuple[Any, int], tuple[int, int]]:
    """Two indices per kind of node, of its index's width, occurring nowhere in ``seen`` and
    distinct from each other: 99/88, 77/66... first, then counting down from the largest."""
    used: set[int] = set()
    out = {}
    for key in keys:
        width = key[1]
        preferred = [int(d * width) for d in "98765432"]
        pair: list[int] = []
        for i in [*preferred, *range(10 ** width - 1, 10 ** (width - 1) - 1, -1)]:
            if i not in used and str(i) not in seen and not any(str(i) in str(j) or str(j) in str(i) for j in used):
                pair.append(i)
                used.add(i)
                if len(pair) == 2:
                    break
        if len(pair) == 2:
            out[key] = (pair[0], pair[1])
    return out


def _kind(node: NodePlan) -> tuple[Any, ...]:
    """What a node's resources follow from besides its index (the host keys show in no line)."""
    from dataclasses import fields

    return tuple(getattr(node, f.name) for f in fields(node) if f.name not in ("index", "host_key", "host_key_private"))


def _by_node(rows: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[int, list[dict[str, str]]]]:
    """(the rows named after no node, the rows of each node by index)."""
    shared: list[dict[str, str]] = []
    by_node: dict[int, list[dict[str, str]]] = {}
    for r in rows:
        owner = _OWNER.match(r["name"])
        if owner is None:
            shared.append(r)
        else:
            by_node.setdefault(int(owner.group(1)), []).append(r)
    return shared, by_node


def _with_index(rows: list[dict[str, str]], old: str, new: str) -> list[dict[str, str]]:
    return [{"type": r["type"], "name": r["name"].replace(old, new), "detail": r["detail"].replace(old, new)}
            for r in rows]


def _natural(name: str) -> list[Any]:
    """node-2 before node-10 (registration order depends on when outputs resolve)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def preview_pool(
    kind: str,
    spec: Spec,
    offer: Offer,
    program: Callable[[PoolPlan], Any],
    *,
    zone: str | None,
    image: str | None,
    user: str,
    settings: dict[str, Any],
    allow_ssh_from: Sequence[str],
    detect_address: bool,
    max_duration: float | None,
    pool_name: str | None = None,
) -> dict[str, Any]:
    """A provider's ``preview(spec)``: the plan ``up`` would make (with throwaway keys and the
    client address left as a placeholder), its resources, the offer and its price."""
    from .backend import stack_name
    from .cli import find, install_instructions
    from .cloudpool import new_plan, placeholder_nodes
    from .keys import ed25519
    from .network import check_cidrs

    where = f"sky.{kind.upper()}(allow_ssh_from=...)"
    cidrs = ([THIS_MACHINE] if detect_address else []) + list(check_cidrs(allow_ssh_from, where))
    if not cidrs:
        raise ProviderError(
            f"{where}: detect_address=False and allow_ssh_from is empty, so nothing could reach the "
            f"nodes; list the client's address in allow_ssh_from."
        )
    stack = stack_name(pool_name, "<id>")
    plan = new_plan(
        spec, offer, stack=stack, pool=pool_name or "pool", zone=zone, image=image, user=user,
        settings=settings, cidrs=tuple(cidrs), public_key=ed25519("preview").public, max_duration=max_duration,
    )
    market = offer.market(spec.allocation)
    plan = plan.with_nodes(placeholder_nodes(spec.node_spec.desired, spot=market == "spot"))
    notes = []
    if find() is None:
        notes.append(f"`up` needs the Pulumi CLI, which is not installed here. {install_instructions()}")
    if detect_address:
        notes.append("port 22 opens to this machine's public address, looked up when the pool starts")
    price = offer.price(spec.allocation)
    return {
        "stack": plan.stack,
        "offer": {"provider": kind, "instance_type": offer.instance_type, "region": offer.region,
                  "zone": plan.zone, "market": market, "hourly_cost_per_node": price},
        "hourly_cost_per_node": price,
        "hourly_cost": None if price is None else round(price * spec.node_spec.desired, 4),
        "resources": resources(program, plan),
        "notes": notes,
    }


# -- running the program ---------------------------------------------------------------------------
def _run(program: Callable[[PoolPlan], Any], plan: PoolPlan) -> list[Declared]:
    import pulumi
    from pulumi.runtime import settings
    from pulumi.runtime.rpc_manager import RPCManager
    from pulumi.runtime.stack import run_pulumi_func

    from .backend import PROJECT

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    recorder = _recorder(plan)
    # Work of its own: pulumi keeps unfinished outputs and RPCs in process-wide defaults, and a
    # program that failed inside an apply (here or under pulumi.runtime.test) leaves its tasks
    # there, bound to a loop that is gone; this run would wait for them forever.
    settings.SETTINGS.outputs = set()
    settings.SETTINGS.rpc_manager = RPCManager()
    try:
        pulumi.runtime.set_mocks(recorder, project=PROJECT, stack=plan.stack, preview=True)
        loop.run_until_complete(run_pulumi_func(lambda: program(plan)))
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
        loop.close()
        asyncio.set_event_loop(None)
    found: list[Declared] = recorder.found
    return found


def _recorder(plan: PoolPlan) -> Any:
    from pulumi.runtime import Mocks

    class Recorder(Mocks):
        def __init__(self) -> None:
            self.found: list[Declared] = []

        def new_resource(self, args: Any) -> tuple[str, dict[str, Any]]:
            self.found.append(Declared(str(args.typ), str(args.name), dict(args.inputs)))
            return str(args.name), dict(args.inputs)

        def call(self, args: Any) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
            return _lookup(str(args.token), dict(args.args or {}), plan), []

    return Recorder()


def _lookup(token: str, args: dict[str, Any], plan: PoolPlan) -> dict[str, Any]:
    """What ``up`` would look up in the cloud, as placeholders that say so."""
    first = plan.zone or f"the first zone of {plan.region} that offers {plan.instance_type}"
    zone = args.get("availabilityZone") or plan.zone
    if args.get("id") == "the default subnet":  # stacks/aws.py: the zones that have one
        zone = first
    if token == "aws:ec2/getVpc:getVpc":
        return {"id": "the default VPC"}
    if token == "aws:ec2/getSubnets:getSubnets":
        return {"ids": ["the default subnet"]}
    if token == "aws:ec2/getSubnet:getSubnet":
        return {"id": args.get("id") or "the default subnet", "vpcId": "its VPC",
                "availabilityZone": zone or f"a zone of {plan.region}"}
    if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
        return {"locations": [first]}
    if token == "gcp:storage/getBucket:getBucket":  # looked at by `up` (buckets.declare_gcp)
        return {"name": args.get("name"), "uniformBucketLevelAccess": True}
    if token == "gcp:compute/getImage:getImage":
        return {"selfLink": f"newest image of family {args.get('family')} ({args.get('project')})"}
    if token == "aws:ec2/getAmi:getAmi":
        owners = ",".join(args.get("owners") or [])
        names = [f["values"][0] for f in args.get("filters") or [] if f.get("name") == "name" and f.get("values")]
        return {"id": f"newest {names[0] if names else 'AMI'!r} of {owners}"}
    return {}


@contextlib.contextmanager
def _settings_defaults_kept() -> Any:
    """Put back the defaults of pulumi's settings properties (see the module docstring)."""
    from pulumi.runtime import settings

    props = [v for cls in type(settings.SETTINGS).__mro__ for v in vars(cls).values()
             if type(v).__name__ == "ContextProperty"]
    saved = [(p, getattr(p, _DEFAULT)) for p in props if hasattr(p, _DEFAULT)]
    try:
        yield
    finally:
        for prop, default in saved:
            setattr(prop, _DEFAULT, default)


_DEFAULT = "_ContextProperty__default"  # ContextProperty.__default, name-mangled


# -- one line per resource -------------------------------------------------------------------------
# What a line shows for an input that is another resource's output, unknown until `up`.
UNKNOWN = "(known after up)"


def detail(r: Declared) -> str:
    describe = _DETAILS.get(r.type)
    if describe is None:
        return ""
    try:
        return describe(_known(r.inputs))
    except (KeyError, TypeError, ValueError, IndexError):  # a shape we did not expect: no detail
        return ""


def _known(value: Any) -> Any:
    """``value`` with pulumi's unknowns (outputs of resources not created yet) as ``UNKNOWN``."""
    from pulumi.output import Unknown

    if isinstance(value, Unknown):
        return UNKNOWN
    if isinstance(value, dict):
        return {k: _known(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_known(v) for v in value]
    return value


def _n(value: Any) -> str:
    return f"{float(value):g}" if isinstance(value, int | float) else str(value)


def _aws_rule(rule: dict[str, Any], direction: str) -> str:
    proto = rule.get("protocol")
    lo, hi = rule.get("fromPort"), rule.get("toPort")
    what = "all traffic" if proto in ("-1", "all") else (
        f"{proto} {_n(lo)}" if lo == hi else f"{proto} {_n(lo)}-{_n(hi)}")
    peers = [*(rule.get("cidrBlocks") or []), *(rule.get("ipv6CidrBlocks") or [])]
    if rule.get("self"):
        peers.append("the group's own members")
    return f"{what} {direction} {', '.join(peers) or 'nowhere'}"


def _aws_group(i: dict[str, Any]) -> str:
    ins = "; ".join(_aws_rule(r, "from") for r in i.get("ingress") or [])
    outs = "; ".join(_aws_rule(r, "to") for r in i.get("egress") or [])
    return f"in: {ins or 'nothing'}. out: {outs or 'nothing'}"


def _aws_instance(i: dict[str, Any]) -> str:
    market = i.get("instanceMarketOptions") or {}
    if market.get("marketType") == "spot":
        spot = market.get("spotOptions") or {}
        how = f"spot ({spot.get('spotInstanceType')}, {spot.get('instanceInterruptionBehavior')} on interruption)"
    else:
        how = "on-demand"
    root = i.get("rootBlockDevice") or {}
    parts = [str(i["instanceType"]), how, f"root {_n(root.get('volumeSize'))} GB {root.get('volumeType', '')}".rstrip()]
    parts += [f"disk {d.get('deviceName')} {_n(d.get('volumeSize'))} GB {d.get('volumeType')}"
              for d in i.get("ebsBlockDevices") or []]
    parts.append(f"image: {i.get('ami')}")
    if (i.get("metadataOptions") or {}).get("httpTokens") == "required":
        parts.append("IMDSv2 only")
    if i.get("instanceInitiatedShutdownBehavior") == "terminate":
        deleted = all(d.get("deleteOnTermination") for d in [root, *(i.get("ebsBlockDevices") or [])])
        parts.append("terminated when it shuts down" + (" (its disks deleted with it)" if deleted else ""))
    return ", ".join(parts)


def _aws_provider(i: dict[str, Any]) -> str:
    return f"region {i.get('region')}" + (f", profile {i['profile']}" if i.get("profile") else "")


def _gcp_firewall(i: dict[str, Any]) -> str:
    allows = ", ".join(
        a["protocol"] if a.get("protocol") == "all" or not a.get("ports") else f"{a['protocol']} {','.join(a['ports'])}"
        for a in i.get("allows") or [])
    sources = [*(i.get("sourceRanges") or []), *(f"tag {t}" for t in i.get("sourceTags") or [])]
    if i.get("denies"):
        allows = "deny " + ", ".join(
            d["protocol"] if d.get("protocol") == "all" or not d.get("ports") else f"{d['protocol']} {','.join(d['ports'])}"
            for d in i["denies"])
    targets = ", ".join(f"tag {t}" for t in i.get("targetTags") or []) or "every instance"
    priority = f" (priority {_n(i['priority'])})" if i.get("priority") is not None else ""
    return (f"{str(i.get('direction', 'INGRESS')).lower()}: {allows} from {', '.join(sources) or 'nowhere'} "
            f"to {targets}{priority}")


def _gcp_instance(i: dict[str, Any]) -> str:
    sched = i.get("scheduling") or {}
    model = sched.get("provisioningModel", "STANDARD")
    parts = [str(i["machineType"]), "spot" if model == "SPOT" else "on-demand"]
    parts += [f"{_n(a.get('count', 1))}x {a.get('type')}" for a in i.get("guestAccelerators") or []]
    boot = (i.get("bootDisk") or {}).get("initializeParams") or {}
    parts.append(f"boot {_n(boot.get('size'))} GB {boot.get('type', '')} from {boot.get('image')}".replace("  ", " "))
    if sched.get("instanceTerminationAction") == "DELETE":
        when = [w for w, on in (("when preempted", model == "SPOT"),
                                (f"at {sched.get('terminationTime')}", sched.get("terminationTime"))) if on]
        parts.append("deleted " + " and ".join(when))
    extra = len(i.get("attachedDisks") or [])
    if extra:  # stacks/userdata.py: the node marks them auto-delete (the provider cannot)
        parts.append(f"its {extra} disk{'s' if extra > 1 else ''} marked auto-delete at boot: deleted with it")
    metadata = i.get("metadata") or {}
    if metadata.get(_SIG_KEY) == _SECRET_SIG:  # a map holding a secret (the user data) is one secret
        metadata = metadata.get("value") or {}
    driver = metadata.get("skyward-gpu-driver")
    if driver:  # a GPU older than Turing (stacks/gcp.py: the open kernel modules do not drive it)
        parts.append(f"NVIDIA driver {driver}: the client is let in once its GPU answers")
    if i.get("serviceAccount"):
        parts.append("deletes itself when its TTL runs out (its own service account)")
    return ", ".join(parts)


# How Pulumi marks a secret value in resource inputs (pulumi.runtime.rpc's special signatures).
_SIG_KEY, _SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"


def _gcp_tpu(i: dict[str, Any]) -> str:
    sched = i.get("schedulingConfig") or {}
    market = "spot" if sched.get("spot") else "preemptible" if sched.get("preemptible") else "on-demand"
    text = f"TPU VM {i.get('acceleratorType')}, {market}, runtime {i.get('runtimeVersion')}, in {i.get('zone')}"
    if i.get("serviceAccount"):
        text += ", deletes its TPU node when its TTL runs out (its own service account)"
    # stacks/gcp_tpu.py: the Cloud TPU API path, which has no Google-side deadline.
    return (text + "; TPU API path (not a Compute Engine instance, no termination_time): its cost is bounded "
            "by its own watchdog, which retries the delete until accepted and never powers off, and by "
            "`skyward down`")


def _gcp_provider(i: dict[str, Any]) -> str:
    return ", ".join(f"{k} {i[k]}" for k in ("project", "region", "zone") if i.get(k))


_DETAILS: dict[str, Callable[[dict[str, Any]], str]] = {  # also the order resources are listed in
    "pulumi:providers:aws": _aws_provider,
    "pulumi:providers:gcp": _gcp_provider,
    "aws:ec2/securityGroup:SecurityGroup": _aws_group,
    "gcp:compute/firewall:Firewall": _gcp_firewall,
    "aws:ec2/keyPair:KeyPair": lambda i: f"{i.get('keyName')}: the pool's ed25519 client key (public half)",
    "aws:ebs/volume:Volume": lambda i: f"{_n(i.get('size'))} GB {i.get('type')} in {i.get('availabilityZone')}",
    "gcp:compute/disk:Disk": lambda i: f"{_n(i.get('size'))} GB {i.get('type')} in {i.get('zone')}",
    "aws:ec2/instance:Instance": _aws_instance,
    "gcp:compute/instance:Instance": _gcp_instance,
    "gcp:tpu/v2Vm:V2Vm": lambda i: _gcp_tpu(i),
    "gcp:serviceaccount/account:Account": lambda i: f"{i.get('accountId')}: the node's identity, no project role",
    "gcp:projects/iAMCustomRole:IAMCustomRole": lambda i: f"{i.get('roleId')}: {', '.join(i.get('permissions') or [])}",
    "gcp:compute/instanceIAMMember:InstanceIAMMember":
        lambda i: f"{i.get('role')} on instance {i.get('instanceName')} only",
    "gcp:compute/diskIamMember:DiskIamMember": lambda i: f"{i.get('role')} on disk {i.get('name')} only",
    "gcp:projects/iAMMember:IAMMember": lambda i: _gcp_project_member(i),
    "aws:iam/role:Role": lambda i: f"{i.get('name')}: assumed by the pool's EC2 instances only",
    "aws:iam/rolePolicy:RolePolicy": lambda i: _aws_policy(i.get("policy")),
    "aws:iam/instanceProfile:InstanceProfile": lambda i: f"{i.get('name')}: carries the role to the nodes",
    "gcp:storage/bucketIAMMember:BucketIAMMember": lambda i: _gcp_bucket_member(i),
}


def _aws_policy(policy: Any) -> str:
    """The sky.Volume policy, one clause per statement: actions on resources (and prefixes)."""
    import json

    try:
        doc = json.loads(policy) if isinstance(policy, str) else dict(policy or {})
    except (TypeError, ValueError):
        return "a policy (unknown until up)"
    clauses = []
    for st in doc.get("Statement", []):
        where = ", ".join(st.get("Resource") or [])
        prefixes = ((st.get("Condition") or {}).get("StringLike") or {}).get("s3:prefix")
        clauses.append(f"{', '.join(st.get('Action') or [])} on {where}"
                       + (f" (prefixes {', '.join(prefixes)})" if prefixes else ""))
    return "; ".join(clauses) or "no permissions"


def _gcp_project_member(i: dict[str, Any]) -> str:
    title = (i.get("condition") or {}).get("title")
    if title:
        return f"{i.get('role')} on the project, {title}"
    # The TPU self-delete (stacks/gcp_tpu.py): Cloud TPU has no per-node grant.
    return (f"{i.get('role')} on the project, unconditional: this node may delete every TPU node of the "
            f"project (use a project of its own for TPU pools)")


def _gcp_bucket_member(i: dict[str, Any]) -> str:
    cond = i.get("condition") or {}
    return f"{i.get('role')} on bucket {i.get('bucket')} only" + (f", {cond.get('description')}" if cond else "")
