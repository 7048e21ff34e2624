"""``skyward events NAME``: a named pool's history for a post-mortem, from its event journal
(skyward.observe.journal: what the pool did, from requesting nodes to the error that stopped
it) and its audit trail (who provisioned, attached, ran, installed and destroyed it), in time
order. ``--json`` prints one JSON object per line (``source``: ``event`` or ``audit``)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, PoolNotFoundError
from .cliout import EXIT_OK

# Trail entries the journal tells better (the events they were written from are in it).
_MIRRORED = {"resized", "node lost", "node replaced"}
_AUDIT_SKIP = {"time", "who", "event", "name", "pid", "skyward", "n", "prev", "pool", "stack_updates"}


def add_events(command: Callable[[str], argparse.ArgumentParser]) -> None:
    p = command("events")  # its help: _MODULE_COMMANDS of named/cli.py
    p.add_argument("name", help="the pool's name")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N entries")
    p.set_defaults(handler=cmd_events)


def history(name: str) -> list[dict[str, Any]]:
    """The journal's events and the trail's entries of ``name``, oldest first, each with its
    ``source``; PoolNotFoundError when nothing was ever recorded under that name."""
    from ..observe import journal
    from ..records import audit
    from .registry import check_name

    check_name(name)
    if not journal.exists(name) and not audit.exists(name):
        raise PoolNotFoundError(
            f"no events for a pool named {name!r}: nothing was ever recorded under that name here "
            f"(`skyward ls` lists running pools, `skyward history` the recent ones)."
        )
    events = [{**e, "source": "event"} for e in journal.read(name)]
    trail = [{**e, "source": "audit"} for e in audit.read(name) if e.get("event") not in _MIRRORED]
    return sorted(events + trail, key=lambda e: float(e.get("time") or 0))


def line(item: dict[str, Any]) -> str:
    """One entry as a line of text: when, where it was seen, what happened."""
    t = float(item.get("time") or 0)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"
    if item.get("source") == "audit":
        details = ", ".join(f"{k}={item[k]}" for k in sorted(item) if k not in _AUDIT_SKIP | {"source"})
        return f"{when}  audit      {item.get('event')} by {item.get('who')}" + (f" ({details})" if details else "")
    return f"{when}  {item.get('role', '?')!s:<9}  {describe(item)}"


def describe(item: dict[str, Any]) -> str:
    """An event of the journal as the console says it, or its kind and fields."""
    from ..observe import console, journal

    event = journal.rebuilt(item)
    text = None
    if event is not None:
        text = console.describe(event, f"pool {item.get('name')}", attached=item.get("role") == "attach")
    if text is None:
        skip = {"time", "event", "name", "role", "pid", "source", "pool"}
        text = f"{item.get('event')}: " + ", ".join(f"{k}={item[k]}" for k in sorted(item) if k not in skip)
    return f"{text}  [pool {item.get('pool')}, pid {item.get('pid')}]"


def cmd_events(args: argparse.Namespace) -> int:
    if args.tail is not None and args.tail < 0:
        raise ConfigError(f"--tail {args.tail}: give a number of entries, 0 or more (e.g. --tail 50).")
    items = history(args.name)
    if args.tail is not None:
        items = items[-args.tail:] if args.tail > 0 else []
    for item in items:
        print(json.dumps(item, sort_keys=True, default=str) if args.json else line(item))
    return EXIT_OK
