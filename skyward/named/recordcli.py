"""The record commands of the ``skyward`` CLI: ``history`` (recent pools, one record, --verify),
``reproduce`` and ``diff``. Kept apart from cli.py, which holds the named-pool commands."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..errors import RecordError
from ..paths import skyward_home
from ..records import audit, record
from .cliout import EXIT_FAILED, EXIT_OK, err, format_table, money, print_json, say


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def history(args: argparse.Namespace) -> int:
    """No POOL_ID: the recent pools. POOL_ID: its record. --verify: the trails' hash chains."""
    if args.verify:
        return verify(args)
    if args.name is not None:
        found = record.shown(record.read(args.name))
        if args.json:
            print_json(found)
            return EXIT_OK
        _show(found)
        return EXIT_OK
    trail = record.trail()
    rows = [record.summary(record.shown(r), trail.get(r.get("id", ""), {}).get("closed"))
            for r in record.recent(args.limit)]
    if args.json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        print("no pools recorded yet")
        return EXIT_OK
    print(format_table(
        ["ID", "NAME", "PROVIDER", "NODES", "STARTED", "WHO", "SCRIPT", "COMMIT", "PKGS", "STATE"],
        [[str(r["id"]), r["name"] or "-", str(r["provider"]), str(r["nodes"]), _when(r["created"]),
          str(r["who"]), _short(r["script"]), _commit(r), str(r["packages"]),
          "closed" if r["closed"] else "open or unknown"] for r in rows]))
    print("\n`skyward history POOL_ID` shows one; `skyward reproduce POOL_ID` starts it again.")
    return EXIT_OK


def verify(args: argparse.Namespace, name: str | None = None) -> int:
    """--verify: the hash chain of one name's trail, or of every trail."""
    problems = audit.verify(name)
    if args.json:
        print_json({"ok": not problems, "problems": problems})
    elif problems:
        for p in problems:
            print(f"TAMPERED: {p}")
    elif name is not None:
        print(f"the audit trail of {name!r} is intact ({len(audit.read(name))} line(s) checked)")
    else:
        trails = len(list((skyward_home() / "audit").glob("*.jsonl")))
        print(f"the audit trail is intact ({trails} file(s) checked)")
    return EXIT_FAILED if problems else EXIT_OK


def _short(path: str | None, width: int = 32) -> str:
    if not path:
        return "-"
    return path if len(path) <= width else "..." + path[-(width - 3):]


def _commit(r: dict[str, Any]) -> str:
    if not r.get("commit"):
        return "-"
    return str(r["commit"])[:10] + ("+dirty" if r.get("dirty") else "")


def _show(r: dict[str, Any]) -> None:
    origin = r.get("origin") or {}
    git = origin.get("git") or {}
    lock = r.get("lock") or {}
    print(f"pool {r['id']}" + (f" ({r['name']})" if r.get("name") else "")
          + f": {r.get('provider')}, {r.get('nodes')} node(s), started {_when(r.get('created'))} by {r.get('who')}")
    print(f"  from     {origin.get('script') or '-'} {' '.join(origin.get('argv') or [])}".rstrip())
    print(f"  in       {origin.get('cwd')}")
    if git:
        print(f"  git      {git.get('commit')} ({git.get('branch')}){' with uncommitted changes' if git.get('dirty') else ''}")
    print(f"  offer    {r.get('offer')}, {money(r.get('total_hourly_cost'))}/h")
    print(f"  python   {lock.get('python')} ({lock.get('platform')}), skyward {lock.get('skyward')}")
    cloud = lock.get("cloud") or {}
    if cloud:
        print("  cloud    " + ", ".join(f"{k} {v}" for k, v in sorted(cloud.items())))
    if r.get("reproduces"):
        print(f"  reproduces pool {r['reproduces']}")
    packages = lock.get("packages") or []
    print(f"  packages {len(packages)}" + (":" if packages else ""))
    for p in packages:
        print(f"    {p['name']}=={p['version']}" + (f"  ({len(p['hashes'])} hash(es))" if p.get("hashes") else ""))
    for name, version in (lock.get("apt") or {}).items():
        print(f"    apt {name}={version}")
    for added in r.get("installs") or []:  # `skyward install`, while the pool ran
        print(f"  installed {_when(added.get('time'))} by {added.get('who')}: {' '.join(added.get('requirements') or [])}"
              f" ({', '.join(added.get('resolved') or []) or 'nothing new'})")


def reproduce(args: argparse.Namespace) -> int:
    from ..spec import Options
    from .config import PoolConfig
    from .pools import check_name, provision

    rep = record.reproduction(args.pool_id)
    record.say(rep, args.strict)  # warnings (shown on stderr), or the refusal
    name = check_name(args.name or rep.record.get("name") or f"repro-{args.pool_id}")
    source = (f"the record of pool {args.pool_id}",)
    console: Any = args.console or ("silent" if args.json else True)
    if rep.groups is not None:  # a pool of several groups: each group's table, from its pinned spec
        data = {"groups": {g: record.config_data(s, rep.worker) for g, s in rep.groups.items()}, "head": rep.head}
        with rep.pinned():
            pool = provision(PoolConfig(name, data, source), Options(console=console), keep=True)
    else:
        cfg = PoolConfig(name, record.config_data(rep.spec, rep.worker), source)
        with rep.pinned():
            pool = provision(cfg, Options(console=console), keep=True, built=(rep.spec, rep.worker))
    new_id = pool.id
    pool.detach()
    if args.json:
        print_json({"name": name, "id": new_id, "reproduces": args.pool_id, "differences": list(rep.differences)})
        return EXIT_OK
    print(f"pool {name!r} is up, reproducing pool {args.pool_id} (new pool id {new_id}); attach with "
          f"sky.Compute(name={name!r}), stop with `skyward down {name}`, compare with "
          f"`skyward diff {args.pool_id} {new_id}`.")
    return EXIT_OK


def diff(args: argparse.Namespace) -> int:
    a, b = _read_checked(args.a), _read_checked(args.b)
    found = record.diff(a, b)
    if args.json:
        print_json(found)
    elif not found:
        print(f"pools {args.a} and {args.b} are the same (packages, image, machines, spec)")
    else:
        say(format_table(["WHAT", "KEY", args.a, args.b],
                         [[d["what"], d["key"], _cell(d["a"]), _cell(d["b"])] for d in found]))
    if found:
        err(f"{len(found)} difference(s)")
    return EXIT_FAILED if found else EXIT_OK


def _read_checked(pool_id: str) -> dict[str, Any]:
    """A record to compare; one whose hash the trail does not vouch for is still compared (a diff
    changes nothing), but said on stderr, so an edited record is not taken for what ran. As
    shown: an older record's secrets are masked before they are compared."""
    found = record.read(pool_id)
    try:
        record.verified(pool_id)
    except RecordError as exc:
        err(f"warning: {str(exc).split(';')[0]}; it is compared as it is now.")
    return record.shown(found)


def _cell(value: Any, width: int = 60) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."
