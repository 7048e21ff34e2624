"""Named pools: start one that outlives its process, attach to it, find out its state, stop it.

The pieces: ``config`` (what a pool is made of, from skyward.toml), ``registry`` (one record
per running pool: its settings and ``Cluster.describe()``), ``audit`` (who did what), and the
provider's ``describe`` / ``attach`` / ``destroy`` / ``alive``. ``sky.Compute(name=...)`` and
the CLI both come through here.

Attaching reads the record only (no pydantic, no TOML): a program attached to a Local pool
has its first result in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigError,
    PoolAsleepError,
    PoolBusyError,
    PoolExistsError,
    PoolNotFoundError,
    ProviderError,
    SkywardError,
)
from ..observe import events as ev
from ..observe import journal
from ..providers import provider_class
from ..records import audit
from ..version import __version__
from . import registry, sleep
from .groupviews import DEFAULT_GROUP, group_views
from .registry import check_name

# skyward.spec (and uuid) are imported by the functions that use them: `skyward ls`, `status` and
# the other looks at records never build a spec.
if TYPE_CHECKING:
    from ..core.pool import Pool
    from ..providers.base import ProviderConfig
    from ..spec import Options, Spec, Worker
    from .config import PoolConfig

log = logging.getLogger("skyward")

# A pool the ttl says is over, for providers that cannot tell (alive() is None), gets this
# much slack before it counts as expired: the agents' own clocks decide, not ours.
_GRACE = 30.0


def provider_from(data: dict[str, Any]) -> ProviderConfig:
    kind = data.get("provider", "local")
    options = data.get(kind) or {}
    try:
        return provider_class(kind)(**options)
    except TypeError as exc:
        raise ConfigError(f"[{kind}] settings {options!r} are not valid for sky.{kind}: {exc}.") from None


def spec_from(data: dict[str, Any], nodes: int | None = None) -> tuple[Spec, Worker]:
    """The Spec and Worker of validated pool settings (``config.PoolTable`` data)."""
    from ..spec import Image, Nodes, PipIndex, Spec, Worker

    image = dict(data.get("image") or {})
    indexes = tuple(PipIndex(url=i["url"], packages=tuple(i.get("packages", ())))
                    for i in image.pop("pip_indexes", ()))
    if image.pop("metrics", True) is False:
        image["metrics"] = None
    raw_nodes = data.get("nodes", 1)
    node_spec: int | tuple[int, int] | Nodes
    if isinstance(raw_nodes, list):
        node_spec = (raw_nodes[0], raw_nodes[1])
    elif isinstance(raw_nodes, dict):
        node_spec = Nodes(**raw_nodes)
    else:
        node_spec = raw_nodes
    if nodes is not None:  # attaching: as many as run now, keeping the elastic ceiling
        ceiling = Nodes.of(node_spec).max
        if nodes == 0 and not ceiling:  # a group resized to 0: it wakes to the size it was given
            ceiling = max(1, Nodes.of(node_spec).desired)
        node_spec = Nodes(desired=nodes, max=ceiling if ceiling and ceiling >= nodes else None)
    keys = ("accelerator", "vcpus", "memory_gb", "disk_gb", "architecture", "allocation",
            "region", "max_hourly_cost", "ttl")
    spec = Spec(
        provider=provider_from(data),
        nodes=node_spec,
        image=Image(pip_indexes=indexes, **image),
        **{k: data[k] for k in keys if k in data},
    )
    return spec, Worker(**(data.get("worker") or {}))


# -- state ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoolStatus:
    name: str
    record: dict[str, Any]
    state: str  # provisioning | running | in use | asleep | expired | failed
    expires: float | None  # epoch seconds; None: not while clients are attached / ttl 0
    alive: bool | None  # what the provider could tell without connecting
    nodes_down: tuple[int, ...] = ()  # of a running pool, the nodes known to be down

    @property
    def gone(self) -> bool:
        return self.state in ("expired", "failed")

    @property
    def asleep(self) -> bool:
        """No node now, and the pool may be so (``nodes = [0, N]``): its next task wakes it."""
        return self.state == "asleep"


def _pid_running(pid: int) -> bool:
    from skyward.providers.local import process_running

    return process_running(pid, None)


def live_clients(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The programs attached to a pool (``skyward down`` warns about them)."""
    return _live_clients(record)


def _live_clients(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Clients still attached; a client on this host whose process died is not."""
    here = socket.gethostname()
    return [c for c in record.get("clients", [])
            if c.get("host") != here or _pid_running(int(c.get("pid", 0)))]


def status_of(record: dict[str, Any], now: float | None = None) -> PoolStatus:
    now = time.time() if now is None else now
    name = record["name"]
    owner = record.get("owner") or {}
    if record.get("state") == "provisioning":
        mine = owner.get("host") == socket.gethostname()
        if mine and not _pid_running(int(owner.get("pid", 0))):
            return PoolStatus(name, record, "failed", None, None)
        return PoolStatus(name, record, "provisioning", None, None)
    if sleep.is_asleep(record):
        return _asleep_status(record, now)
    alive, down = _alive(record)
    if alive is False:
        if sleep.may_sleep(record):  # its nodes are gone, and it may have none: asleep, until its ttl
            return _asleep_status(record, now)
        return PoolStatus(name, record, "expired", None, False)
    if _live_clients(record):
        return PoolStatus(name, record, "in use", None, alive, down)
    ttl = int(record.get("ttl", 0))
    if ttl == 0:
        return PoolStatus(name, record, "running", None, alive, down)
    expires = float(record.get("last_seen", record.get("created", now))) + ttl
    if alive is None and now > expires + _GRACE:
        return PoolStatus(name, record, "expired", expires, None)
    return PoolStatus(name, record, "running", expires, alive, down)


def _alive(record: dict[str, Any]) -> tuple[bool | None, tuple[int, ...]]:
    """Whether the pool's nodes run, as its providers can tell without connecting, and the
    ranks of those known to be down (pool-wide: group after group). A pool of several groups is
    alive while any group's nodes are (a group resized to 0 has none, and is not its end)."""
    answers: list[bool | None] = []
    down: list[int] = []
    offset = 0
    views = list(group_views(record).values())
    for view in views:
        cluster = view.get("cluster")
        nodes = (cluster or {}).get("nodes") or []
        if not cluster or (len(views) > 1 and not nodes):
            offset += len(nodes)
            continue
        try:
            provider = provider_from(view["config"])
            alive = provider.alive(cluster)
            if alive:  # each node on its own: one dead node is not the pool's end
                each = provider.nodes_alive(cluster)
                down += [offset + i if len(views) > 1 else int(n["index"])
                         for i, (n, a) in enumerate(zip(nodes, each, strict=False)) if a is False]
        except SkywardError:
            alive = None
        answers.append(alive)
        offset += len(nodes)
    if not answers:
        return None, ()
    if any(a is True for a in answers):
        return True, tuple(down)
    if all(a is False for a in answers):
        return False, ()
    return None, ()


def _asleep_status(record: dict[str, Any], now: float) -> PoolStatus:
    """A pool sleeping at zero nodes: no agent to ask, so its ttl counts on our clock alone,
    from the last program leaving (never while one is attached; never with ttl 0)."""
    name = record["name"]
    ttl = int(record.get("ttl", 0))
    if _live_clients(record) or ttl == 0:
        return PoolStatus(name, record, "asleep", None, None)
    expires = float(record.get("last_seen", record.get("created", now))) + ttl
    return PoolStatus(name, record, "expired" if now > expires else "asleep", expires, None)


def statuses() -> list[PoolStatus]:
    out = []
    for name in registry.names():
        record = registry.read(name)
        if record is not None:
            out.append(status_of(record))
    return out


def get(name: str) -> dict[str, Any]:
    record = registry.read(name)
    if record is None:
        raise PoolNotFoundError(
            f"no pool named {name!r} is registered; `skyward ls` lists the pools, "
            f"`skyward up {name}` starts one."
        )
    return record


def for_a_look(name: str) -> dict[str, Any]:
    """The record of pool ``name`` when it has nodes to look at (exec, logs, ssh, cp, install,
    the dashboard's looks); else an error that says why and what to do."""
    record = get(name)
    st = status_of(record)
    if st.asleep:
        raise PoolAsleepError(
            f"pool {name!r} is asleep (0 of {sleep.ceiling(record)} nodes): it has no node to look at. "
            f"`skyward ssh`, `cp`, `exec` and `install` wake it (unless given --no-wake), and so does a "
            f"program's first task (with sky.Compute(name={name!r}) as pool: ...); run this again while "
            f"it is awake (`skyward status {name}` says)."
        )
    if st.gone or st.state == "provisioning":
        raise ProviderError(
            f"pool {name!r} is {st.state}; `skyward ls` shows the pools that run, "
            f"`skyward up {name}` starts it again."
        )
    return record


# -- start -------------------------------------------------------------------------------------
def _record(cfg: PoolConfig, spec: Spec, pool_id: str, *, ephemeral: bool) -> dict[str, Any]:
    now = time.time()
    provider = spec.provider
    cost = provider.hourly_cost(spec)
    return {
        "name": cfg.name,
        "id": pool_id,
        "state": "provisioning",
        "provider": getattr(provider, "kind", "?"),
        "config": cfg.data,
        "sources": list(cfg.sources),
        "cluster": None,
        "owner": {"who": audit.who(), "pid": os.getpid(), "host": socket.gethostname()},
        "ephemeral": ephemeral,
        "created": now,
        "last_seen": now,
        "ttl": spec.ttl,
        "clients": [],
        "hourly_cost": cost,  # per node, USD
        "offer": _offer(spec),
        "skyward": __version__,
    }


def _offer(spec: Spec) -> str:
    acc = spec.accelerator
    kind = getattr(spec.provider, "kind", "?")
    return f"{kind}: {spec.node_spec.desired} node(s)" + (f" x {acc}" if acc is not None else "")


def _claim(name: str) -> None:
    """Make room for a new pool ``name`` (call with its lock held)."""
    existing = registry.read(name)
    if existing is None:
        return
    st = status_of(existing)
    if not st.gone:
        owner = existing.get("owner") or {}
        raise PoolExistsError(
            f"pool {name!r} is already {st.state} (started by {owner.get('who')}); attach to it "
            f"with sky.Compute(name={name!r}), or stop it first with `skyward down {name}`."
        )
    _destroy_record(existing, reason=f"{st.state}, replaced by a new pool")


def provision(cfg: PoolConfig, options: Options, *, keep: bool,
              built: tuple[Spec, Worker] | None = None) -> Pool:
    """Start pool ``cfg.name`` and register it. ``keep``: `skyward up` (the nodes stay after
    this process, until their ttl passes with no client); otherwise the pool is this
    program's and is destroyed when it closes. ``built``: the spec and worker already made
    (`skyward reproduce`), ``cfg.data`` then only describes them for later attaches."""
    from ..core.pool import Pool
    from ..spec import select_spec

    if cfg.groups and built is None:
        return _provision_groups(cfg, options, keep=keep)
    spec, worker = built if built is not None else spec_from(cfg.data)
    _check_attachable(cfg.name, spec)
    spec = select_spec((spec,), options)
    if spec.ttl == 0:
        warnings.warn(
            f"pool {cfg.name!r} has ttl = 0: its nodes never stop by themselves; stop them with "
            f"`skyward down {cfg.name}` (for a cloud pool, they cost money until you do).",
            stacklevel=3,
        )

    def described(record: dict[str, Any], pool: Pool) -> None:
        record["cluster"] = pool.cluster.describe()
        if sleep.is_asleep(record):  # nodes = [0, N]: started asleep, its first task wakes it
            record["asleep_since"] = record["last_seen"]

    return _register_and_start(
        cfg, keep, lambda: _record(cfg, spec, "", ephemeral=not keep),
        lambda: Pool(spec, options, worker, name=cfg.name), described,
        nodes=spec.node_spec.desired, ttl=spec.ttl)


def _register_and_start(cfg: PoolConfig, keep: bool, make_record: Callable[[], dict[str, Any]],
                        make_pool: Callable[[], Pool], described: Callable[[dict[str, Any], Pool], None],
                        **facts: Any) -> Pool:
    """``provision``'s steps for a pool of one spec or of several groups: claim the name, register
    the pool as provisioning, start it (its events kept for `skyward events`), register its nodes
    (``described``), write the trail's line (``facts``: nodes, ttl...), then either leave it to
    run (``keep``: SSH config entries for its nodes) or tie the registry entry to this program."""
    with registry.lock(cfg.name, wait=0):
        _claim(cfg.name)
        record = make_record()
        registry.write(record)
        try:
            with journal.capture(cfg.name, "provision") as events:  # kept for `skyward events`
                pool = make_pool()
        except BaseException:
            registry.remove(cfg.name)
            raise
        pool.on_close(events.bind(pool.id))
        try:
            record.update(id=pool.id, state="running", last_seen=time.time())
            described(record, pool)
            if not keep:
                record["clients"] = [_client(pool.id)]
            registry.write(record)
        except BaseException:
            pool.close()
            registry.remove(cfg.name)
            raise
    audit.append(cfg.name, "provisioned", pool.id, provider=record["provider"], offer=record["offer"],
                 hourly_cost=_total_cost(record), by="skyward up" if keep else "sky.Compute(name=...)",
                 stack=_stack_name(record), **facts)
    if keep:
        from .sshconfig import after_up

        after_up(record)  # `ssh NAME-0`, scp, rsync, VS Code: SSH config entries for its nodes
        return pool
    _Recorder(pool, cfg.name).start()
    pool.on_close(lambda: _destroyed_by_owner(cfg.name, pool.id))
    return pool


def _check_attachable(name: str, spec: Spec) -> None:
    from ..providers.base import ProviderConfig

    if type(spec.provider).attach is ProviderConfig.attach:
        raise ProviderError(
            f"pool {name!r}: provider {spec.provider.kind!r} cannot run named pools in this "
            f"version of skyward (its clusters cannot be described and attached to again); use "
            f"sky.Compute(provider=...) in your program instead, or provider = 'local'."
        )


def _group_specs(record_or_cfg: dict[str, dict[str, Any]], head: str | None,
                 nodes: dict[str, int] | None = None) -> tuple[dict[str, Spec], str, Worker]:
    """Each group's Spec from its settings (``nodes``: attaching, as many as each runs now), the
    head group's name and the pool's Worker (the head group's ``worker`` settings)."""
    from ..core.group import check_groups

    built = {g: spec_from(data, None if nodes is None else nodes[g]) for g, data in record_or_cfg.items()}
    specs = {g: spec for g, (spec, _) in built.items()}
    check_groups(specs, head)
    head = head or next(iter(specs))
    return specs, head, built[head][1]


def _provision_groups(cfg: PoolConfig, options: Options, *, keep: bool) -> Pool:
    """``provision`` of a pool of several groups (``[pools.NAME.groups.*]``): one Pool of
    groups, whose record keeps each group's settings and nodes under ``groups``; its
    ``config`` and ``cluster`` are the head group's, for the tools that look at one group."""
    from ..core.pool import Pool
    from ..spec import select_spec

    specs, head, worker = _group_specs(cfg.groups, cfg.head)
    for spec in specs.values():
        _check_attachable(cfg.name, spec)
    specs = {g: select_spec((spec,), options) for g, spec in specs.items()}
    ttl = max(spec.ttl for spec in specs.values())
    if any(spec.ttl == 0 for spec in specs.values()):
        warnings.warn(
            f"pool {cfg.name!r} has a group with ttl = 0: its nodes never stop by themselves; stop them "
            f"with `skyward down {cfg.name}` (for a cloud pool, they cost money until you do).",
            stacklevel=3,
        )
        ttl = 0

    def record() -> dict[str, Any]:
        made = _record(type(cfg)(cfg.name, cfg.groups[head], cfg.sources), specs[head], "", ephemeral=not keep)
        made.update(ttl=ttl, head=head, offer=", ".join(f"{g}: {_offer(s)}" for g, s in specs.items()),
                    groups={g: {"config": cfg.groups[g], "cluster": None, "provider": s.provider.kind,
                                "hourly_cost": s.provider.hourly_cost(s), "offer": _offer(s)}
                            for g, s in specs.items()})
        return made

    def described(made: dict[str, Any], pool: Pool) -> None:
        _describe_groups(made, pool)
        if sleep.is_asleep(made):  # every group [0, N]: started asleep, a task wakes its group
            made["asleep_since"] = made["last_seen"]

    return _register_and_start(
        cfg, keep, record, lambda: Pool(specs[head], options, worker, groups=specs, head=head, name=cfg.name),
        described, nodes=sum(s.node_spec.desired for s in specs.values()), ttl=ttl, groups=list(specs),
        head=head)


def _describe_groups(record: dict[str, Any], pool: Pool) -> None:
    """Put each group's nodes, as its cluster describes them now, in ``record`` (a pool of
    several groups; the head group's are also the record's ``cluster``)."""
    groups = record["groups"]
    for name, group in pool.groups.items():
        old = groups[name].get("cluster") or {}
        groups[name]["cluster"] = _keep_pins({"cluster": old}, group.cluster.describe())
    record["cluster"] = groups[pool.head_group.name]["cluster"]


def _destroyed_by_owner(name: str, pool_id: str) -> None:
    removed = False
    with contextlib.suppress(PoolBusyError), registry.lock(name):
        record = registry.read(name)
        if record is not None and record.get("id") == pool_id:
            registry.remove(name)
            removed = True
    if removed:  # else `skyward down` destroyed it first, and its entry says so
        audit.append(name, "destroyed", pool_id, reason="its program ended (sky.Compute)")


def _total_cost(record: dict[str, Any]) -> float | None:
    if record.get("groups"):  # each group at its own price per node
        costs = [_total_cost({**view, "groups": None}) for view in group_views(record).values()]
        return None if any(c is None for c in costs) else round(sum(c for c in costs if c is not None), 4)
    cost = record.get("hourly_cost")
    cluster = record.get("cluster") or {}
    nodes = len(cluster.get("nodes", [])) or _desired(record)
    return None if cost is None else round(float(cost) * nodes, 4)


def _desired(record: dict[str, Any]) -> int:
    raw = (record.get("config") or {}).get("nodes", 1)
    if isinstance(raw, list):
        return int(raw[0])
    if isinstance(raw, dict):
        return int(raw["desired"])
    return int(raw)


# -- attach ------------------------------------------------------------------------------------
def _client(pool_id: str) -> dict[str, Any]:
    return {"id": pool_id, "who": audit.who(), "pid": os.getpid(), "host": socket.gethostname(),
            "since": time.time()}


def attach(record: dict[str, Any], options: Options, *, why: str = "sky.Compute(name=...)",
           audited: bool = True, sleeps: bool | None = None) -> Pool:
    """Connect to the running pool of ``record``; closing the pool detaches and leaves it up.

    A pool of ``nodes = [0, N]`` may be asleep (no node): its first task wakes it. ``sleeps``
    (default: ``audited``, a program's attach): this program's autoscaler may put it back to
    sleep when idle, and puts it to sleep when this program is the last to leave."""
    import uuid

    from ..core.pool import Pool

    name = record["name"]
    grouped = bool(record.get("groups"))
    sleepy = sleep.may_sleep(record)  # (a pool of groups: each of them may sleep)
    # A pool that sleeps at zero starts the nodes its tasks need: a node found dead is dropped
    # from it, never replaced (a program's attach replaces dead nodes of other pools; `exec`
    # and the other looks replace nothing).
    views = group_views(record)
    kept = {g: _without_dead_nodes(v) if sleepy else (v["cluster"], []) for g, v in views.items()}
    cluster_desc = kept[next(iter(kept))][0] if not grouped else record["cluster"]
    dropped = [(g, index, why) for g, (_, gone) in kept.items() for index, why in gone]
    if grouped:  # each group's nodes, from its own provider; one Pool of the groups
        specs, head, worker = _group_specs({g: v["config"] for g, v in views.items()}, record.get("head"),
                                           nodes={g: len(kept[g][0]["nodes"]) for g in views})
        clusters = {g: specs[g].provider.attach(kept[g][0]) for g in views}
        for each in clusters.values():
            each.heal_at_attach = audited and not sleepy
        spec, cluster = specs[head], clusters[head]
    else:
        spec, worker = spec_from(record["config"], nodes=len(cluster_desc["nodes"]))
        cluster = spec.provider.attach(cluster_desc)
        cluster.heal_at_attach = audited and not sleepy
        clusters = {DEFAULT_GROUP: cluster}
    client_id = uuid.uuid4().hex[:8]

    def add(r: dict[str, Any]) -> None:
        r["clients"] = [*_live_clients(r), _client(client_id)]
        if dropped and r.get("id") == record.get("id"):
            if grouped:
                for g, (description, _) in kept.items():
                    r["groups"][g]["cluster"] = description
                r["cluster"] = r["groups"][head]["cluster"]
            else:
                r["cluster"] = cluster_desc

    registry.update(name, add)
    try:  # a program's attach is kept for `skyward events`; the CLI's own looks are not
        with journal.capture(name, "attach") if audited else contextlib.nullcontext() as events:
            if grouped:
                pool = Pool(spec, options, worker, groups=specs, head=head, clusters=clusters, name=name)
            else:
                pool = Pool(spec, options, worker, cluster=cluster, name=name)
    except BaseException:
        _detached(name, client_id)
        raise
    if events is not None:
        pool.on_close(events.bind(pool.id))
    missing = {(g, i): w for g, c in clusters.items() for i, w in c.unreachable().items()}
    if missing:  # attached to the nodes that answer; say which did not, and why
        log.warning(
            "pool %r: %s; attached to the %d other node(s). `skyward status %s` shows each node; "
            "`skyward down %s` then `skyward up %s` starts the pool afresh.",
            name, "; ".join(f"{f'group {g} ' if grouped else ''}node {i} cannot be reached ({w})"
                            for (g, i), w in sorted(missing.items())),
            pool.current_nodes(), name, name, name)
    if audited:
        audit.append(name, "attached", record["id"], client=pool.id, by=why,
                     nodes=pool.current_nodes())
        for (group, index), reason in sorted(missing.items()):
            audit.append(name, "node unreachable", record["id"], node=index, reason=reason, by=pool.id,
                         **({"group": group} if grouped else {}))
        for group, index, reason in dropped:
            audit.append(name, "node dropped", record["id"], node=index, reason=reason, by=pool.id,
                         **({"group": group} if grouped else {}))
        recorder = _Recorder(pool, name)
        for event in pool.attach_events:  # dead nodes replaced before the recorder listened
            recorder._on_event(event)
        recorder.start()

    def on_close() -> None:
        _detached(name, client_id)
        if audited:
            audit.append(name, "detached", record["id"], client=pool.id, by=why)

    pool.on_close(on_close)
    if sleepy and (audited if sleeps is None else sleeps):
        _sleep_when_idle(pool, record, client_id)
    return pool


def _without_dead_nodes(record: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[int, str]]]:
    """The record's cluster description without the nodes known to be gone (a Local agent that
    exited), and [(node, why)] of those dropped. Providers that cannot tell keep every node."""
    description = record["cluster"]
    nodes = description.get("nodes") or []
    if not nodes:
        return description, []
    try:
        each = provider_from(record["config"]).nodes_alive(description)
    except SkywardError:
        return description, []
    dead = {int(n["index"]) for n, alive in zip(nodes, each, strict=False) if alive is False}
    if not dead:
        return description, []
    why = "its agent no longer runs; a pool that sleeps at zero starts the nodes its tasks need instead"
    kept = [n for n in nodes if int(n["index"]) not in dead]
    return {**description, "nodes": kept}, [(index, why) for index in sorted(dead)]


def _sleep_when_idle(pool: Pool, record: dict[str, Any], client_id: str) -> None:
    """An attached pool of ``nodes = [0, N]``: its autoscaler may shrink it to zero when idle
    (unless another program is attached: it may be using the nodes this one sees idle), and
    when this program is the last to leave, the pool goes to sleep at once."""
    from ..spec import Nodes

    name = record["name"]
    # Each group's own ceiling: a pool of groups sleeps as a whole, each group to zero.
    tops = {g: sleep.node_range(view.get("config") or {})[1] for g, view in group_views(record).items()}

    def others() -> bool:
        current = registry.read(name)
        if current is None or current.get("id") != record.get("id"):
            return True  # not the pool this program attached to any more: leave it alone
        return any(c.get("id") != client_id for c in _live_clients(current))

    for g, group in pool.groups.items():
        group.autoscaler.may_shrink = lambda: not others()
        if group.members.nodes.desired > 0:
            group.dispatcher.check_open()
            group.members.nodes = Nodes(desired=0, max=tops[g])
            group.start_autoscaler()

    def last_one_out(p: Pool) -> None:
        awake = [(g, group) for g, group in p.groups.items() if group.members.size() > 0]
        if not awake or others():
            return
        log.info("pool %s: the last program attached leaves; putting it to sleep", name)
        for g, group in awake:
            group.resize(Nodes(desired=0, max=tops[g]))
        ev.bus.flush(10.0)  # the recorder writes the sleep before this program detaches

    pool.before_close(last_one_out)


def _detached(name: str, client_id: str) -> None:
    def drop(r: dict[str, Any]) -> None:
        r["clients"] = [c for c in _live_clients(r) if c.get("id") != client_id]
        r["last_seen"] = time.time()  # the ttl counts from the last client leaving

    with contextlib.suppress(PoolBusyError):
        registry.update(name, drop)


def open_named(name: str, options: Options) -> Pool:
    """``sky.Compute(name=...)``: attach to the running pool, or provision it from
    skyward.toml for this program (destroyed when it ends)."""
    check_name(name)
    record = registry.read(name)
    if record is not None:
        st = status_of(record)
        if st.state == "provisioning":
            raise PoolBusyError(
                f"pool {name!r} is being provisioned by {record['owner'].get('who')} (pid "
                f"{record['owner'].get('pid')}); wait for it to be ready, then run this again."
            )
        if not st.gone:
            try:
                return attach(record, options)
            except ProviderError as exc:
                raise ProviderError(
                    f"pool {name!r} is registered but its nodes cannot be reached: {exc} "
                    f"Run `skyward down {name}` to remove it, then try again."
                ) from exc
    from .config import load

    cfg = load(name)
    return provision(cfg, options, keep=False)


# -- resize and node loss, while a pool is open ---------------------------------------------------
class _Recorder:
    """Writes an attached or owned named pool's resizes and lost nodes to the trail, and keeps
    the registry's description of its nodes current."""

    def __init__(self, pool: Pool, name: str) -> None:
        self.pool, self.name = pool, name
        self._unsubscribe: Callable[[], None] | None = None
        nodes = {g: group.members.size() for g, group in pool.groups.items()}
        record = registry.read(name) or {}
        woke = record.get("woke")
        self.meter = sleep.Meter(nodes=nodes, at=time.time(), price=sleep.prices(record),
                                 woke_at=float(woke) if any(nodes.values()) and isinstance(woke, int | float) else None)

    def start(self) -> None:
        kinds = (ev.ClusterProvisioned, ev.InstanceDestroyed, ev.InstanceLost, ev.InstanceReplaced,
                 ev.ClusterWoke, ev.ClusterAsleep)
        self._unsubscribe = ev.bus.subscribe(self._on_event, self.pool.id, kinds)
        self.pool.before_close(self._settle)
        self.pool.on_close(self.stop, first=True)

    def _settle(self, pool: Pool) -> None:
        """As the pool starts closing, its nodes still held: write them to the registry as the
        clusters know them, whatever events the bus has not delivered yet. A program that leaves
        right after a node was replaced must not leave the new node out of the record (`skyward
        down` would not know it, and it would run on until its lease ran out). The events already
        emitted are delivered first, while the pool still counts as open, so that the trail keeps
        their lines ("node replaced"); a bus that takes longer than 2 s leaves them out, not the
        nodes."""
        ev.bus.flush(2.0)
        with contextlib.suppress(SkywardError):
            registry.update(self.name, self.nodes_into())

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()

    def _on_event(self, event: ev.Event) -> None:
        if not self.pool.is_active:
            return
        record = registry.read(self.name) or {}
        pool_id = record.get("id", self.pool.id)
        if isinstance(event, ev.ClusterProvisioned | ev.InstanceDestroyed):
            store = self.nodes_into()
            nodes = {g: len(group.cluster.describe()["nodes"]) for g, group in self.pool.groups.items()}
            self.meter.count(nodes, time.time())
            with contextlib.suppress(SkywardError):
                registry.update(self.name, store)
            audit.append(self.name, "resized", pool_id, nodes=sum(nodes.values()), by=self.pool.id)
        elif isinstance(event, ev.ClusterWoke | ev.ClusterAsleep):
            self._slept_or_woke(event, record, pool_id)
        elif isinstance(event, ev.InstanceLost):
            audit.append(self.name, "node lost", pool_id, node=event.node, reason=event.reason)
        elif isinstance(event, ev.InstanceReplaced):  # the registry describes the new node
            with contextlib.suppress(SkywardError):
                registry.update(self.name, self.nodes_into())
            audit.append(self.name, "node replaced", pool_id, node=event.node, new_node=event.new_node,
                         rank=event.rank, seconds=round(event.seconds, 3), reason=event.reason, by=self.pool.id)

    def nodes_into(self) -> Callable[[dict[str, Any]], None]:
        """What writes the pool's nodes, as its clusters describe them now, into a record."""
        pool = self.pool
        if len(pool.groups) > 1:
            return lambda r: _describe_groups(r, pool) if r.get("groups") else None
        description = pool.cluster.describe()

        def store(r: dict[str, Any]) -> None:
            r["cluster"] = _keep_pins(r, description)

        return store

    def _slept_or_woke(self, event: ev.ClusterWoke | ev.ClusterAsleep, record: dict[str, Any], pool_id: str) -> None:
        """A wake: how long it took and the price per hour of what woke. A sleep: how long the
        pool was awake and what that cost (node-seconds at the record's price per node-hour)."""
        now = time.time()
        store = self.nodes_into()
        if len(self.pool.groups) > 1:
            # A pool of groups sleeps as a whole: one group falling asleep while another still
            # runs, or waking while another runs, is a resize of an awake pool (its nodes stored);
            # the first group to wake wakes the pool, the last to sleep puts it to sleep.
            still = sum(g.members.size() for g in self.pool.groups.values())
            asleep = bool(record.get("asleep_since"))
            if (isinstance(event, ev.ClusterAsleep) and (still or asleep)) or (
                    isinstance(event, ev.ClusterWoke) and not asleep):
                with contextlib.suppress(SkywardError):
                    registry.update(self.name, store)
                return

        def mark(r: dict[str, Any]) -> None:
            store(r)
            if isinstance(event, ev.ClusterWoke):
                r.pop("asleep_since", None)
                r["woke"] = now
            else:
                r["asleep_since"] = now

        with contextlib.suppress(SkywardError):
            registry.update(self.name, mark)
        if isinstance(event, ev.ClusterWoke):  # (the group that woke, at its own price)
            rate = sleep.rate(sleep.prices(record), {event.group or DEFAULT_GROUP: event.nodes})
            audit.append(self.name, "woke", pool_id, nodes=event.nodes, seconds=round(event.seconds, 3),
                         hourly_cost=None if rate is None else round(rate, 4), by=self.pool.id)
            return
        awake, used, cost = self.meter.slept(now)
        audit.append(self.name, "asleep", pool_id, idle_seconds=round(event.idle_seconds, 1),
                     awake_seconds=round(awake, 3), node_seconds=round(used, 3), cost=cost, by=self.pool.id)


def _keep_pins(record: dict[str, Any], description: dict[str, Any]) -> dict[str, Any]:
    """``description`` of the pool's nodes as this client's cluster has it, with the packages
    the registry pins for new nodes: `skyward install` may have added some since this client
    attached (a terminal command that woke the pool installs while the waker is attached), and
    its cluster's copy would drop them at the next sleep or resize."""
    pins = (record.get("cluster") or {}).get("pin")
    return description if pins is None or "pin" not in description else {**description, "pin": pins}


# -- stop ----------------------------------------------------------------------------------------
def _destroy_record(record: dict[str, Any], reason: str) -> None:
    """Destroy what a record describes, then forget it (call with the pool's lock held)."""
    used: dict[str, Any] | None = None
    errors: list[SkywardError] = []
    for view in group_views(record).values():  # every group's nodes, even when one cannot be destroyed
        cluster = view.get("cluster")
        if not cluster:
            continue
        try:
            provider = provider_from(view["config"])
            provider.destroy(cluster)
        except SkywardError as exc:
            errors.append(exc)
            continue
        accounting = getattr(provider, "accounting", None)  # a scheduler's (Slurm): what the jobs used
        used = (accounting(cluster) if callable(accounting) else None) or used
    if errors:
        raise errors[0]
    registry.remove(record["name"])
    from .sshconfig import remove as remove_ssh_entries

    remove_ssh_entries(record["name"])  # its nodes' SSH config entries go with it
    audit.append(record["name"], "destroyed", record.get("id", ""), reason=reason,
                 provider=record.get("provider"), stack=_stack_name(record),
                 **({str(record.get("provider")): _trail_usage(used)} if used else {}))
    from ..records import record as records

    if record.get("id") and records.exists(record["id"]):
        if used:
            kind = str(record.get("provider"))
            records.amend(record["id"], lambda r: r.__setitem__(kind, {**(r.get(kind) or {}), **used}),
                          f"{kind} accounting")
        records.closed(record["id"])


def _trail_usage(used: dict[str, Any]) -> dict[str, Any]:
    """A scheduler's accounting as the trail keeps it: the totals and each job's figures (the
    batch scripts stay in the record)."""
    return {**{k: v for k, v in used.items() if k != "jobs"},
            "jobs": {j: info.get("usage") for j, info in (used.get("jobs") or {}).items()}}


def _stack_name(record: dict[str, Any]) -> str | None:
    """The Pulumi stack of a cloud pool's record (None for Local and SSH pools)."""
    stack = (record.get("cluster") or {}).get("stack")
    return str(stack["name"]) if isinstance(stack, dict) and stack.get("name") else None


def stack_history(name: str) -> dict[str, list[dict[str, Any]]]:
    """{stack: its Pulumi updates, newest first} for every stack pool ``name`` has had (cloud
    pools): read from the running stack, or from the copy saved when the stack was removed."""
    import json

    from skyward.stacks.engine import audit_file

    record = registry.read(name) or {}
    live = _stack_name(record)
    stacks = [e["stack"] for e in audit.read(name) if e.get("stack")] + ([live] if live else [])
    out: dict[str, list[dict[str, Any]]] = {}
    for stack in dict.fromkeys(stacks):
        saved = audit_file(stack)
        try:
            reader = getattr(provider_from(record["config"]), "stack_history", None) if stack == live else None
            if reader is not None:
                out[stack] = reader(record["cluster"])
            elif saved.exists():
                out[stack] = list(json.loads(saved.read_text()).get("history") or [])
            else:
                out[stack] = [{"kind": "history-unavailable",
                               "message": f"stack {stack} is gone and its history was not saved in {saved}"}]
        except (SkywardError, ValueError, OSError) as exc:
            out[stack] = [{"kind": "history-unavailable", "message": str(exc)}]
    return out


def down(name: str, reason: str = "skyward down") -> dict[str, Any]:
    get(name)
    with registry.lock(name):
        record = get(name)
        if record.get("state") == "provisioning" and not status_of(record).gone:
            raise PoolBusyError(registry._busy_message(name))
        if _live_clients(record):
            _announce_stop(record, stopped_message(name, reason))
        _destroy_record(record, reason)
    return record


def stopped_message(name: str, by: str) -> str:
    """What the programs using pool ``name`` are told when ``by`` stops it."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    return (f"pool {name!r} was stopped by `{by}` ({audit.who()}, at {when}); its nodes are gone, so "
            f"this program cannot use it any more. `skyward up {name}` starts it again.")


def _announce_stop(record: dict[str, Any], message: str, wait: float = 10.0) -> None:
    """Before a pool in use is destroyed, tell its agents why (SHUTDOWN with a reason): each
    tells its other clients, and their tasks end with PoolStoppedError carrying ``message``
    instead of looking like crashes. Best effort, at most ``wait`` seconds (a node that cannot
    be reached is destroyed all the same)."""
    import json
    import threading

    def tell() -> None:
        for view in group_views(record).values():
            if (view.get("cluster") or {}).get("nodes"):
                tell_group(view)

    def tell_group(view: dict[str, Any]) -> None:
        from skyward.bootstrap.channel import NodeChannel
        from skyward.bootstrap.frames import Kind

        description = view["cluster"]
        cluster = provider_from(view["config"]).attach(description)
        try:
            endpoints = cluster.start(len(description["nodes"]))
            body = json.dumps({"message": message}).encode()
            for e in endpoints:
                try:
                    ch = NodeChannel(e.connect, node=e.index, token=cluster.token,
                                     ttl=float(record.get("ttl", 600)), on_output=lambda *_: None,
                                     agent_id=e.agent_id)
                except (OSError, SkywardError):
                    continue
                ch.send(Kind.SHUTDOWN, body)
                deadline = time.monotonic() + 5
                while ch.lost is None and time.monotonic() < deadline:  # it hangs up once it told
                    time.sleep(0.02)
                ch.close()
        finally:
            cluster.detach()

    def safely() -> None:
        try:
            tell()
        except Exception as exc:  # the pool is destroyed anyway; its programs see it go
            log.info("could not tell the agents of pool %s why it stops: %s", record["name"], exc)

    teller = threading.Thread(target=safely, name="skyward-announce-stop", daemon=True)
    teller.start()
    teller.join(wait)


def cleanup_expired() -> list[PoolStatus]:
    """Destroy the pools whose ttl ran out (or whose nodes are gone); skip busy ones. An asleep
    pool (no node, ``nodes = [0, N]``) is kept until its ttl runs out."""
    removed = []
    for st in statuses():
        if not st.gone:
            continue
        try:
            with registry.lock(st.name, wait=0):
                record = registry.read(st.name)
                if record is None:
                    continue
                now = status_of(record)
                if not now.gone:
                    continue
                why = ("its provisioning was interrupted" if now.state == "failed"
                       else "expired: no client for its ttl, or its nodes are gone")
                _destroy_record(record, why)
                removed.append(now)
        except PoolBusyError:
            continue
        except SkywardError as exc:
            log.warning("could not clean up expired pool %s: %s", st.name, exc)
    return removed
