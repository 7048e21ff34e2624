"""``skyward proxy NAME RANK``: the ProxyCommand of the SSH config entries (sshconfig.py).

ssh runs it and speaks SSH on its stdin and stdout; this carries the bytes to node RANK's sshd
the way the pool reaches it (Remote.route: directly, or through the pool's jump host, whose key
is checked against the pool's pins, refused when it changed). It does not log in to the node:
ssh does, and checks the node's key itself against the pool's pin (the entry's known_hosts).

An asleep pool is woken for the session (node 0, as ``skyward ssh`` does) and sleeps again when
ssh ends; its entries are written again first, since a woken node may be a new machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, ProviderError

_CHUNK = 1 << 16


def add_proxy(command: Callable[[str], argparse.ArgumentParser]) -> None:
    p = command("proxy")  # its help: _MODULE_COMMANDS of named/cli.py
    p.add_argument("name", help="the pool's name")
    p.add_argument("rank", type=int, help="the node's rank")
    p.set_defaults(handler=cmd_proxy)


def cmd_proxy(args: argparse.Namespace) -> int:
    from .pools import get, status_of
    from .wake import awake

    if args.json:
        raise ConfigError("proxy has no --json output: it carries an SSH connection on stdin and stdout.")
    record = get(args.name)
    if status_of(record).gone:
        raise ProviderError(f"pool {args.name!r} is {status_of(record).state}: its nodes are gone; `skyward up "
                            f"{args.name}` starts it again.")
    with awake(args.name, wake=True, command=f"ssh {args.name}-{args.rank}", node=args.rank) as woke:
        if woke is not None:
            from . import sshconfig

            record = get(args.name)
            sshconfig.write(record)  # the woken node's key, before ssh checks it
        remote = _remote(record, args.rank)
        stream = remote.route()
        try:
            _carry(stream)
        finally:
            with contextlib.suppress(OSError, EOFError):
                stream.close()
            remote.close()
    return 0


def _remote(record: dict[str, Any], rank: int) -> Any:
    from ..bootstrap.remote import Remote, Target
    from .groupviews import group_views, pool_rank

    name = record["name"]
    views = group_views(record)
    if len(views) > 1:  # NAME-N of a pool of several groups: numbered across the pool (sshconfig.py)
        try:
            group, rank = pool_rank(record, views, rank)
        except ConfigError as exc:
            raise ConfigError(f"{exc} `skyward ssh-config {name}` writes its entries again.") from None
        record = views[group]
    cluster = record.get("cluster") or {}
    nodes = cluster.get("nodes") or []
    if not 0 <= rank < len(nodes):
        has = "no node" if not nodes else "node 0 only" if len(nodes) == 1 else f"nodes 0 to {len(nodes) - 1}"
        raise ConfigError(f"pool {name!r} has {has} now, not node {rank}; `skyward ssh-config {name}` writes "
                          f"its entries again.")
    h = nodes[rank].get("host")
    if not isinstance(h, dict):
        raise ConfigError(f"pool {name!r} ({record.get('provider')}): its nodes are not SSH hosts skyward "
                          f"reaches; there is nothing to proxy to.")
    target = Target(h["address"], h.get("port"), h.get("user"), h.get("key"), h.get("host_key"),
                    jump=h.get("jump"), known_hosts=cluster.get("known_hosts"))
    return Remote(target, label=f"node {rank} ({h['address']}) of pool {name!r}")


def _carry(stream: Any) -> None:
    """stdin -> stream, stream -> stdout, until the node's side ends."""
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()

    def up() -> None:
        try:
            while data := os.read(stdin, _CHUNK):
                stream.sendall(data)
        except (OSError, EOFError):
            pass
        finally:
            with contextlib.suppress(OSError, EOFError):
                stream.shutdown(socket.SHUT_WR)

    threading.Thread(target=up, name="skyward-proxy-stdin", daemon=True).start()
    try:
        while data := stream.recv(_CHUNK):
            view = memoryview(data)
            while view:
                view = view[os.write(stdout, view):]
    except (OSError, EOFError):
        pass
