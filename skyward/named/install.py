"""``skyward install NAME PKG...``: add Python packages to a running named pool.

The same way a pool gets its packages when it starts (skyward.records.pkglock): the
requirements are resolved once, here, by uv, for the nodes' Python and platform, keeping every
version the pool already has (its lock, as constraints); then every node installs exactly those
pins, ``--no-deps``, hashes checked, through the pool's install mode -- from the package index
(Local nodes share this machine's; SSH ``install="index"`` nodes use their own), or from wheels
this machine builds and sends (``install="wheelhouse"``, the default for SSH and the clouds: the
nodes need no index). They land in each node's live folder (``SKYWARD_SITE``, on the workers'
path from the start; one folder for all Local nodes), so the next task imports them; a module a
worker imported already keeps its old version until that worker is replaced.

The install runs in each node's agent, beside its workers: a pool busy with long tasks takes
it at once. When every node has them, the packages go into the pool's lock and record (so
``skyward reproduce`` and ``skyward diff`` include them), into the registry's description of the
nodes (a node added later installs them too), and into the audit trail. When a node fails, it is
named with the end of uv's output, the nodes done are said, and nothing is recorded: running the
command again installs on the nodes that lack the packages (the others already have them).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, ProviderError
from ..records import pkglock, resolver
from ..records.pkglock import Package
from .cliout import EXIT_FAILED, EXIT_OK, err, print_json


def add_install(command: Callable[[str], argparse.ArgumentParser]) -> None:
    p = command("install")  # its help: _MODULE_COMMANDS of named/cli.py
    p.add_argument("name", help="the running pool")
    p.add_argument("packages", nargs="+", metavar="PKG",
                   help="requirements as pip takes them: tabulate, 'pandas>=2', 'torch==2.4.*'")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each node may take (default 600)")
    p.add_argument("--no-wake", action="store_true", help="refuse with an error when the pool is asleep, instead of waking it for this command")
    p.set_defaults(handler=cmd_install)


@dataclass(frozen=True)
class Plan:
    """What the nodes get: the pins resolved for the requirements, and those to install."""

    mode: str  # local | wheelhouse | index
    requirements: tuple[str, ...]
    resolved: tuple[Package, ...]  # the requirements and their dependencies, as the nodes will have them
    install: tuple[Package, ...]  # of those, the ones the nodes do not have yet from their start
    python: str
    indexes: tuple[str, ...]
    pool_id: str


def cmd_install(args: argparse.Namespace) -> int:
    from .wake import awake

    requirements = checked(args.packages)
    if not args.timeout > 0:
        raise ConfigError(f"--timeout {args.timeout:g}: give a positive number of seconds per node.")
    # An asleep pool wakes for the install (its nodes get the packages, and the lock keeps them
    # for the nodes of its next wakes), then sleeps again.
    with awake(args.name, wake=not args.no_wake, command="skyward install"):
        return install(args.name, requirements, args.timeout, as_json=args.json)


def install(name: str, requirements: tuple[str, ...], timeout: float, *, as_json: bool = False) -> int:
    """Install ``requirements`` on every node of running pool ``name`` and record them (what
    ``skyward install`` does; ``skyward notebook`` installs its server this way); the exit code."""
    from types import SimpleNamespace

    from .pools import get

    args = SimpleNamespace(name=name, timeout=timeout, json=as_json)
    registered = get(args.name)
    err(f"resolving {' '.join(requirements)} for pool {args.name!r}")
    plan = plan_for(registered, requirements)
    if not plan.install:
        say = ", ".join(f"{p.name}=={p.version}" for p in plan.resolved)
        err(f"the nodes of pool {args.name!r} have had these from their start ({say}); nothing to install")
    wheels = _wheels(plan)
    results = _install_everywhere(args.name, plan, wheels, args.timeout) if plan.install else []
    done = [r for r in results if r["ok"]]
    failed = [r for r in results if not r["ok"]]
    pins = [f"{p.name}=={p.version}" for p in plan.resolved]
    from ..records import audit

    if failed:
        audit.append(args.name, "install failed", plan.pool_id, requirements=list(requirements), packages=pins,
                     nodes_done=[r["node"] for r in done], nodes_failed=[r["node"] for r in failed])
    else:
        record_install(args.name, plan)
        audit.append(args.name, "installed", plan.pool_id, requirements=list(requirements), packages=pins,
                     nodes=len(done))
    if args.json:
        print_json({"name": args.name, "requirements": list(requirements), "packages": pins,
                    "installed": [f"{p.name}=={p.version}" for p in plan.install], "recorded": not failed,
                    "nodes": results})
    else:
        _report(args.name, plan, done, failed)
    return EXIT_FAILED if failed else EXIT_OK


def checked(requirements: Sequence[str]) -> tuple[str, ...]:
    """The requirements, each one valid pip syntax (ConfigError naming the one that is not)."""
    from packaging.requirements import InvalidRequirement, Requirement

    for text in requirements:
        try:
            Requirement(text)
        except InvalidRequirement as exc:
            raise ConfigError(
                f"{text!r} is not a requirement ({exc}); write them as pip does: tabulate, "
                f"'pandas>=2', 'torch==2.4.*'."
            ) from None
    return tuple(requirements)


# -- resolving, once, here ------------------------------------------------------------------------
def plan_for(registered: dict[str, Any], requirements: Sequence[str]) -> Plan:
    """Resolve ``requirements`` for the running pool of registry record ``registered``,
    keeping the versions it has (ProviderError naming what cannot be had)."""
    from ..records import record as records

    description = registered.get("cluster") or {}
    kind = description.get("provider") or registered.get("provider") or "local"
    mode = "local" if kind == "local" else str(description.get("install") or "wheelhouse")
    pool_id = str(registered.get("id") or "")
    kept = records.read(pool_id) if pool_id and records.exists(pool_id) else {}
    lock = kept.get("lock") or {}
    have = tuple(Package.from_json(p) for p in (lock.get("packages") or description.get("pin") or []))
    added = {(p["name"], p["version"]) for i in kept.get("installs") or [] for p in i.get("packages") or []}
    base = {(p.name, p.version) for p in have} - added  # what the nodes got when they started
    image = (registered.get("config") or {}).get("image") or {}
    indexes = tuple(str(ix["url"]) for ix in image.get("pip_indexes") or [])
    python = str(lock.get("python") or ".".join(map(str, sys.version_info[:3])))
    minor = ".".join(python.split(".")[:2])
    if mode == "local":
        resolved = _resolve_local(registered["name"], requirements, have, indexes)
        install = tuple(p for p in resolved
                        if (p.name, p.version) not in base and resolver.installed_version(p.name) != p.version)
        return Plan(mode, tuple(requirements), resolved, install, python, indexes, pool_id)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if mode == "wheelhouse" and minor != here:
        raise ProviderError(
            f"pool {registered['name']!r} runs Python {minor} and gets its wheels from this machine, which "
            f"builds them with Python {here}: run `skyward install` from a Python {minor} environment."
        )
    target = sys.executable if mode == "wheelhouse" else minor
    platform = None if mode == "wheelhouse" else (
        lock.get("platform") or resolver.node_platform(description.get("node_architecture")))
    resolved = _resolve(registered["name"], requirements, have, python=target, platform=platform, indexes=indexes)
    install = tuple(p for p in resolved if (p.name, p.version) not in base)
    return Plan(mode, tuple(requirements), resolved, install, python, indexes, pool_id)


def _resolve_local(name: str, requirements: Sequence[str], have: tuple[Package, ...],
                   indexes: tuple[str, ...]) -> tuple[Package, ...]:
    """Local nodes run this interpreter: what it meets already is what they use."""
    from ..providers.local_env import unsatisfied

    missing = unsatisfied(tuple(requirements))
    met = resolver.installed([r for r in requirements if r not in missing])
    resolved = _resolve(name, missing, have, python=sys.executable, platform=None, indexes=indexes)
    new = {p.name for p in resolved}
    return tuple(sorted([*(p for p in met if p.name not in new), *resolved], key=lambda p: p.name))


def _resolve(name: str, requirements: Sequence[str], have: tuple[Package, ...], *, python: str,
             platform: str | None, indexes: tuple[str, ...]) -> tuple[Package, ...]:
    def attempt(reqs: Sequence[str], keep: tuple[Package, ...]) -> tuple[tuple[Package, ...] | None, str]:
        return resolver.attempt(reqs, python=python, platform=platform, indexes=indexes, constraints=keep)

    found, said = attempt(requirements, have)
    if found is not None:
        return found
    # Say which requirement: one that resolves nowhere, or one the pool's versions rule out.
    why = []
    for r in requirements:
        alone, alone_said = attempt([r], have)
        if alone is not None:
            continue
        free, _ = attempt([r], ())
        last = alone_said.strip().splitlines()[-1].strip() if alone_said.strip() else ""
        why.append(f"{r}: does not resolve ({last})" if free is None else
                   f"{r}: conflicts with the versions pool {name!r} has ({last})")
    if not why:
        why.append(f"each resolves alone, but not together: {said.strip().splitlines()[-1].strip()}")
    raise ProviderError(
        f"cannot install on pool {name!r}; nothing was installed:\n" + "\n".join(f"  - {w}" for w in why)
        + "\nCheck the names and versions (the pool's indexes and the index settings of uv and pip on "
          "this machine are where they come from); `skyward history` shows the pool's record and its packages."
    )


def _wheels(plan: Plan) -> dict[str, bytes]:
    """Nodes with no index get the wheels from here (the bootstrap's wheelhouse, cached)."""
    if plan.mode != "wheelhouse" or not plan.install:
        return {}
    from ..bootstrap import wheelhouse

    err(f"getting the wheels of {len(plan.install)} package(s) for the nodes")
    paths = wheelhouse.wheels_for_lock(pkglock.text(plan.install), ".".join(plan.python.split(".")[:2]),
                                       plan.indexes)
    return {p.name: p.read_bytes() for p in paths}


# -- on every node --------------------------------------------------------------------------------
def _install_everywhere(name: str, plan: Plan, wheels: dict[str, bytes], timeout: float) -> list[dict[str, Any]]:
    import functools

    from . import nodeops
    from .agentcalls import attached, call

    lock = pkglock.text(plan.install)
    sources = _sources(plan)
    results: list[dict[str, Any]] = []
    lock_ = threading.Lock()
    with attached(name) as (_pool, nodes):
        err(f"installing {', '.join(f'{p.name}=={p.version}' for p in plan.install)} on {len(nodes)} node(s)")

        def one(node: Any) -> None:
            base = {"node": node.rank, "hostname": node.description.get("hostname"), "ok": False,
                    "exit_code": None, "output": "", "seconds": 0.0, "versions": {}}
            if node.channel is None:
                result = {**base, "output": f"not reached: {node.why}"}
            else:
                fn = functools.partial(nodeops.install_locked, lock, wheels, list(sources.args), timeout,
                                       env=dict(sources.env))
                try:
                    result = {**base, **call(node.channel, fn, timeout + 30), "node": node.rank}
                except Exception as exc:
                    result = {**base, "output": f"{type(exc).__name__}: {exc}"}
            err(f"{node.label}: " + (f"done in {result['seconds']:.1f} s" if result["ok"] else "failed"))
            with lock_:
                results.append(result)

        threads = [threading.Thread(target=one, args=(n,), name=f"skyward-install-{n.rank}") for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return sorted(results, key=lambda r: int(r["node"]))


def _sources(plan: Plan) -> resolver.Sources:
    """Where uv on the nodes finds the packages when no wheels are sent: its options, and the
    index URLs for its environment (never its argv: they may hold user:token@)."""
    if plan.mode == "local":  # this machine's pip settings and the pool's indexes, as its overlay
        return resolver.sources(plan.indexes)
    if plan.mode == "index" and plan.indexes:  # the node's own index (Image.env), plus the pool's
        # The node adds the UV_EXTRA_INDEX_URL its own environment has (nodeops.install_locked).
        return resolver.Sources(("--index-strategy", "unsafe-best-match"),
                               (("UV_EXTRA_INDEX_URL", " ".join(plan.indexes)),))
    return resolver.Sources()


# -- recording -----------------------------------------------------------------------------------
def record_install(name: str, plan: Plan) -> None:
    """The pool's lock and record, and the registry's description of its nodes, say the nodes
    have the packages now (one command at a time changes them: the pool's registry lock)."""
    from ..records import audit
    from ..records import record as records
    from . import registry

    entry = {"time": time.time(), "who": audit.who(), "requirements": list(plan.requirements),
             "packages": [p.to_json() for p in plan.install],
             "resolved": [f"{p.name}=={p.version}" for p in plan.resolved]}

    def merged(packages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        by_name = {Package.from_json(p).name: p for p in packages}
        by_name.update({p.name: p.to_json() for p in plan.resolved})
        return [by_name[n] for n in sorted(by_name)]

    def describe(r: dict[str, Any]) -> None:
        cluster = r.get("cluster") or {}
        if "pin" in cluster:  # SSH and the clouds bootstrap a new node from this list
            cluster["pin"] = merged(list(cluster.get("pin") or []))

    def amend(r: dict[str, Any]) -> None:
        lock = r.setdefault("lock", {})
        lock["packages"] = merged(list(lock.get("packages") or []))
        r["installs"] = [*(r.get("installs") or []), entry]

    with registry.lock(name):
        current = registry.read(name)
        if current is not None and current.get("id") == plan.pool_id:
            describe(current)
            registry.write(current)
        if plan.pool_id and records.exists(plan.pool_id):
            records.amend(plan.pool_id, amend, "packages installed", pool_name=name,
                          packages=entry["resolved"])


def _report(name: str, plan: Plan, done: list[dict[str, Any]], failed: list[dict[str, Any]]) -> None:
    pins = ", ".join(f"{p.name}=={p.version}" for p in plan.resolved)
    if not failed:
        print(f"pool {name!r}: {pins} on every node; in its lock and record (`skyward history {plan.pool_id}`).")
        return
    for r in failed:
        where = f"node {r['node']}" + (f" ({r['hostname']})" if r.get("hostname") else "")
        code = f" (exit code {r['exit_code']})" if r.get("exit_code") is not None else ""
        err(f"error: installing on {where} failed{code}:")
        for line in (r.get("output") or "no output").splitlines():
            print(f"    {line}", file=sys.stderr)
    ok = ", ".join(f"node {r['node']}" for r in done) or "none"
    bad = ", ".join(f"node {r['node']}" for r in failed)
    err(f"done on: {ok}; failed on: {bad}. Nothing was recorded: "
        f"fix what the output says and run `skyward install {name} {' '.join(plan.requirements)}` again "
        f"(nodes that have the packages already keep them).")
