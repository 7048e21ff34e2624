"""What the dashboard shows of named pools and skyward.toml, and the actions it can take.

Blocking functions over what already exists (registry, audit trail, config, providers); the
server runs them in worker threads. Everything returned is JSON-able and safe to show: the
agents' token, keys and cluster internals are never copied out, environment values of images
are masked, and everything goes through :func:`clean` (secrets masked, ``secrets.scrub``).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyward.errors import ConfigError, ProviderError, SkywardError
from skyward.named import pools as named
from skyward.named import registry, sleep
from skyward.observe import events as ev
from skyward.observe import secrets
from skyward.records import audit

if TYPE_CHECKING:
    from skyward.core.pool import Pool

# Pulumi inline programs share process-global state (two `up`s cannot run at once in one
# process): the dashboard starts, resizes and stops one pool at a time.
_provisioning = threading.Lock()
_NODE_KEYS = ("index", "hostname", "private_ip", "public_ip")


def clean(value: Any) -> Any:
    """``value`` with every secret masked (``secrets.scrub``): registered ones and URL
    credentials in every string, JSON text inside strings included (a stack's config holds the
    pool's description as one), and the keys of a sky.Storage description."""
    return secrets.scrub(value)


def learn_secrets(config: dict[str, Any]) -> None:
    """Register a pool's secret environment values here, so that they are redacted from
    everything this process serves (logs, exec output, errors)."""
    image = config.get("image") or {}
    env = image.get("env") or {}
    if isinstance(env, dict):
        secrets.register_env({k: v for k, v in env.items() if isinstance(v, str)})


def masked_config(config: dict[str, Any]) -> dict[str, Any]:
    """A pool's settings as a page may show them: the image's env and shell_vars keep their
    names, never their values."""
    out = copy.deepcopy(config)
    image = out.get("image")
    if isinstance(image, dict):
        for key in ("env", "shell_vars"):
            if isinstance(image.get(key), dict):
                image[key] = dict.fromkeys(image[key], secrets.MASK)
    return out


# -- named pools ---------------------------------------------------------------------------------
def named_summary(record: dict[str, Any], st: named.PoolStatus | None = None) -> dict[str, Any]:
    learn_secrets(record.get("config") or {})
    st = st or named.status_of(record)
    now = time.time()
    views = named.group_views(record)  # a pool of several groups: every group's nodes, each saying its group
    hosts = [{**{k: n.get(k) for k in _NODE_KEYS}, **({"group": g} if len(views) > 1 else {})}
             for g, view in views.items() for n in (view.get("cluster") or {}).get("nodes", [])]
    total = named._total_cost(record)
    created = float(record.get("created", now))
    so_far = None if total is None else round(total * (now - created) / 3600, 6)
    if sleep.may_sleep(record) and total is not None:  # what its wakes cost, not its age at today's size
        so_far = sleep.spent(record, now)
    return {
        "ref": record["name"],
        "id": record.get("id"),
        "name": record["name"],
        "kind": "named",
        "provider": record.get("provider"),
        "state": st.state,
        "nodes": len(hosts),
        "nodes_label": nodes_label(record, len(hosts)),
        "max_nodes": sleep.ceiling(record),
        "may_sleep": sleep.may_sleep(record),
        "hosts": hosts,
        "ttl": record.get("ttl"),
        "created": created,
        "age_seconds": round(now - created, 1),
        "expires": st.expires,
        "expires_in_seconds": None if st.expires is None else round(st.expires - now, 1),
        "hourly_cost": total,
        "cost_so_far": so_far,
        "offer": record.get("offer"),
        "owner": (record.get("owner") or {}).get("who"),
        "clients": [{k: c.get(k) for k in ("who", "pid", "since")} for c in record.get("clients", [])],
        "ephemeral": record.get("ephemeral", False),
        "stack": named._stack_name(record),
    }


def nodes_label(record: dict[str, Any], nodes: int) -> str:
    """``2``, or ``0/4`` for a pool that sleeps at zero (nodes now / the most it grows to)."""
    return f"{nodes}/{sleep.ceiling(record)}" if sleep.may_sleep(record) else str(nodes)


def named_pools() -> list[dict[str, Any]]:
    return [named_summary(st.record, st) for st in named.statuses()]


def named_pool(name: str) -> dict[str, Any]:
    named.check_name(name)
    record = named.get(name)
    return {**named_summary(record), "config": masked_config(record.get("config") or {}),
            "sources": list(record.get("sources") or []),
            "wakes": sleep.wakes(name) if sleep.may_sleep(record) else []}


def history(name: str) -> list[dict[str, Any]]:
    """The audit trail of ``name``, oldest first."""
    named.check_name(name)
    return [{k: v for k, v in e.items() if k != "pid"} for e in audit.read(name)]


def stack(name: str) -> dict[str, Any]:
    """A cloud pool's stack: its resources (as its program declares them for the running plan)
    and its Pulumi update history. Local and SSH pools have none."""
    named.check_name(name)
    record = registry.read(name) or {}
    stack_name = named._stack_name(record)
    out: dict[str, Any] = {"stack": stack_name, "resources": [], "updates": {}}
    if stack_name is not None:
        try:
            out["resources"] = _resources(record)
        except Exception as exc:  # pulumi SDK missing, an old record: say so, show the rest
            out["resources_error"] = str(exc)
    if audit.read(name) or stack_name:
        try:
            out["updates"] = named.stack_history(name)
        except (SkywardError, OSError, ImportError) as exc:
            out["updates_error"] = str(exc)
    return out


def _resources(record: dict[str, Any]) -> list[dict[str, str]]:
    from skyward.stacks.plan import PoolPlan
    from skyward.stacks.preview import resources

    provider = named.provider_from(record["config"])
    program = provider._program()  # type: ignore[attr-defined]
    plan = PoolPlan.from_dict(record["cluster"]["stack"]["plan"])
    return resources(program, plan)


@contextlib.contextmanager
def attached(name: str) -> Iterator[Pool]:
    """A short connection to a running named pool (not counted as a client in the trail)."""
    from skyward.spec import Options

    record = named.for_a_look(name)
    pool = named.attach(record, Options(console="silent", logging=False), audited=False)
    try:
        yield pool
    finally:
        pool.close()


def log_tail(name: str, node: int | None, lines: int) -> list[dict[str, Any]]:
    """The last ``lines`` lines of each node's agent log (what `skyward logs` shows)."""
    from skyward.core.function import function
    from skyward.named.nodeops import tail

    nodes = (named.get(name).get("cluster") or {}).get("nodes", [])
    out: list[dict[str, Any]] = []
    with attached(name) as pool:
        for rank, n in enumerate(nodes):
            if node is not None and rank != node:
                continue
            path = n.get("log")
            if not path:
                out.append({"node": rank, "hostname": n.get("hostname"), "text": "",
                            "error": "this provider does not say where its agent log is"})
                continue
            found: dict[str, Any] = pool.run(function(tail)(path, lines), target=rank)
            out.append({"node": rank, **{k: v for k, v in found.items() if k != "path"}})
    return out


# -- actions -----------------------------------------------------------------------------------
def up(name: str, project: Path | None) -> dict[str, Any]:
    """Start pool ``name`` from skyward.toml and leave it running (`skyward up NAME`)."""
    from skyward.named.config import load
    from skyward.spec import Options

    cfg = load(name, project=project)
    learn_secrets(cfg.data)
    with _provisioning:
        pool = named.provision(cfg, Options(console="silent", logging=False), keep=True)
        pool.detach()
    return named_summary(named.get(name))


def down(name: str) -> dict[str, Any]:
    named.check_name(name)
    with _provisioning:
        record = named.down(name, reason="skyward dashboard")
    return {"name": name, "id": record.get("id"), "state": "destroyed"}


def resize(name: str, nodes: Any) -> dict[str, Any]:
    """Grow or shrink a running named pool to ``nodes`` nodes (0: put a pool of ``nodes = [0, N]``
    to sleep now; an asleep one wakes with the nodes asked for)."""
    from skyward.named.sleep import may_sleep
    from skyward.spec import Nodes, Options

    record = named.get(name)
    least = 0 if may_sleep(record) else 1
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < least:
        rule = ("an int >= 0 (0 puts it to sleep)" if least == 0
                else "an int >= 1 (only a pool of nodes = [0, N] may have none)")
        raise ConfigError(f"nodes={nodes!r} is not valid for pool {name!r}: give {rule}.")
    st = named.status_of(record)
    if st.gone or st.state == "provisioning":
        raise ProviderError(f"pool {name!r} is {st.state}; only a running pool can be resized.")
    with _provisioning:
        pool = named.attach(record, Options(console="silent", logging=False), why="skyward dashboard",
                            sleeps=False)
        try:
            pool.resize(nodes or Nodes(desired=0, max=pool.members.nodes.max))
            # The pool's recorder writes the new size to the registry and the trail from the
            # event thread, and ignores events once the pool is closed: let it catch up first.
            ev.bus.flush(10.0)
        finally:
            pool.close()
    return named_summary(named.get(name))


def run_command(name: str, command: Any, timeout: float) -> list[dict[str, Any]]:
    """``command`` in a shell on every node (`skyward exec NAME -- CMD`): one result per node."""
    from skyward.core.function import function
    from skyward.named.nodeops import run_shell

    if not isinstance(command, str) or not command.strip():
        raise ConfigError("exec needs a command: give {\"command\": \"hostname\"}.")
    from skyward.named.wake import awake

    # An asleep pool wakes for it, as for `skyward exec` (the dashboard's stderr says so; the
    # trail records the wake), and sleeps again after.
    with awake(name, wake=True, command="skyward dashboard exec"), attached(name) as pool:
        results = function(run_shell, timeout=timeout + 10)(command, timeout) @ pool
    record = registry.read(name) or {}
    audit.append(name, "exec", record.get("id", ""), command=command, by="skyward dashboard",
                 exit_codes=[r["exit_code"] for r in results])
    return [{"node": i, **r} for i, r in enumerate(results)]


# -- skyward.toml ------------------------------------------------------------------------------
def config_pools(project: Path | None) -> dict[str, Any]:
    """The pools skyward.toml defines, each validated on its own (one bad table does not hide
    the others), with whether it runs now."""
    from skyward.named.config import defined_pools, describe_source, load

    out = []
    for name in sorted(defined_pools(project)):
        row: dict[str, Any] = {"name": name, "running": registry.read(name) is not None}
        try:
            cfg = load(name, project=project)
            learn_secrets(cfg.data)
            data = cfg.data
            row.update(provider=data.get("provider", "local"), nodes=data.get("nodes", 1),
                       accelerator=data.get("accelerator"), ttl=data.get("ttl", 600),
                       config=masked_config(data))
        except SkywardError as exc:
            row["error"] = str(exc)
        out.append(row)
    return {"source": describe_source(project), "pools": out}


def preview(name: str, project: Path | None) -> dict[str, Any]:
    """What `up NAME` would create and what it costs per hour; creates nothing."""
    from skyward.named.config import load

    cfg = load(name, project=project)
    learn_secrets(cfg.data)
    spec, _ = named.spec_from(cfg.data)
    provider = spec.provider
    why = provider.check(spec)
    if why is not None:
        raise ProviderError(f"pool {name!r} cannot be provisioned: {why}.")
    nodes = spec.node_spec.desired
    per_node = provider.hourly_cost(spec)
    planner = getattr(provider, "preview", None)
    if planner is not None:
        takes_name = "name" in inspect.signature(planner).parameters
        plan: dict[str, Any] = planner(spec, name=name) if takes_name else planner(spec)
    elif provider.kind == "local":
        plan = {"resources": [{"type": "process", "name": f"agent node-{i}",
                               "detail": "agent process on this machine, own working directory"}
                              for i in range(nodes)]}
    elif provider.kind == "ssh":
        hosts = list(getattr(provider, "hosts", ()) or ())
        plan = {"resources": [{"type": "host", "name": str(h), "detail": "existing machine, reached over SSH"}
                              for h in hosts[:nodes]]}
    else:
        plan = {"resources": []}
    return {"name": name, "provider": provider.kind, "nodes": nodes, "ttl": spec.ttl,
            "accelerator": None if spec.accelerator is None else str(spec.accelerator),
            "hourly_cost_per_node": per_node,
            "hourly_cost": None if per_node is None else round(per_node * nodes, 4),
            "sources": list(cfg.sources), **{k: v for k, v in plan.items() if k != "sources"}}
