"""`skyward ssh-config [NAME]`: the command that writes the SSH config entries of running pools
(sshconfig.py writes them; this module reads the registry, which imports sshconfig itself for
`up` and `down`, so the command sits above both)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..errors import ConfigError
from .cliout import EXIT_OK, err, print_json
from .sshconfig import how_to_use, include_line, main_file, pool_file, write


def add_ssh_config(command: Callable[[str], argparse.ArgumentParser]) -> None:
    p = command("ssh-config")  # its help: _MODULE_COMMANDS of named/cli.py
    p.add_argument("name", nargs="?", help="the pool (default: every running pool)")
    p.set_defaults(handler=cmd_ssh_config)


def cmd_ssh_config(args: argparse.Namespace) -> int:
    from . import registry
    from .pools import get, status_of

    if args.name is not None:
        records = [get(args.name)]
    else:
        records = [r for r in (registry.read(n) for n in registry.names()) if r and not status_of(r).gone]
    out = []
    for record in records:
        try:
            made = write(record)
        except ConfigError as exc:
            if args.name is not None:
                raise
            err(f"pool {record['name']!r}: {exc}")
            continue
        out.append({"name": record["name"], "file": str(pool_file(record["name"])),
                    "hosts": [e.alias for e in made]})
        if not args.json:
            hosts = ", ".join(e.alias for e in made) or "none (the pool has no node now)"
            print(f"pool {record['name']!r}: {hosts} in {pool_file(record['name'])}")
    if args.json:
        print_json({"config": str(main_file()), "include": include_line(), "pools": out})
    else:
        if not records:
            print("no running pools")
        print(how_to_use())
    return EXIT_OK
