"""``ssh NAME-0``, ``scp``, ``rsync`` and VS Code Remote-SSH on a named pool's nodes.

``skyward up`` (and ``skyward ssh-config NAME`` for a pool that is up already) writes an OpenSSH
client config with a ``Host`` entry per node, ``NAME-<rank>``, in ``SKYWARD_HOME/ssh/pools/NAME.conf``,
and one file that includes them all, ``SKYWARD_HOME/ssh/config``: the one line ``Include
SKYWARD_HOME/ssh/config`` in ``~/.ssh/config`` (which skyward never edits) makes every pool's nodes
reachable by name, and ``ssh -F SKYWARD_HOME/ssh/config NAME-0`` works without it. ``skyward down``
removes the pool's entries.

Each entry reaches the node as the pool does. Its ``ProxyCommand`` is ``skyward proxy NAME RANK``
(proxy.py): the bytes go the pool's way to the node's sshd (directly, or through the pool's jump
host, whose key is checked against the pool's pins); the user and key are the pool's; and ssh
checks the node's key against a known_hosts file holding only the key the pool pinned for that
node (``HostKeyAlias NAME-RANK``, ``StrictHostKeyChecking yes``), so a node showing another key is
refused, never learned. Local nodes run no sshd: their pools get no entries, and ``skyward
ssh-config`` says so (``skyward ssh`` is the shell there).

A pool of several groups numbers its nodes across the whole pool, group after group (as
``instance_info().node`` and ``--node`` without ``--group`` do, in the pool's group order), and
each entry says its group and its rank there. A group of Local nodes has none.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ProviderError


def folder() -> Path:
    from ..paths import skyward_home

    return skyward_home() / "ssh"


def main_file() -> Path:
    return folder() / "config"


def pool_file(name: str) -> Path:
    return folder() / "pools" / f"{name}.conf"


def known_hosts_file(name: str) -> Path:
    return folder() / "pools" / f"{name}.known_hosts"


def include_line() -> str:
    return f"Include {_word(str(main_file()))}"


def alias(name: str, rank: int) -> str:
    return f"{name}-{rank}"


@dataclass(frozen=True)
class Entry:
    """One node's ``Host`` entry."""

    alias: str
    rank: int
    hostname: str
    port: int
    user: str
    keys: tuple[str, ...]  # IdentityFile: the pool's key (none: ssh's own defaults and agent)
    host_keys: tuple[str, ...]  # "type base64": what the pool pinned for the node
    via: str | None  # the jump host, said in a comment (the proxy goes through it)
    group: str = ""  # the node's group, in a pool of several (rank is then pool-wide)
    group_rank: int = 0  # its rank within that group


def how_to_use(name: str | None = None) -> str:
    hosts = f"the nodes of pool {name!r} as {name}-0, {name}-1, ..." if name else "the pools' nodes by name"
    example = f"{name}-0" if name else "NAME-0"
    return (f"ssh, scp, rsync and VS Code Remote-SSH reach {hosts}: add this line to ~/.ssh/config once "
            f"(skyward never edits it): {include_line()}\n(or, without it: ssh -F {main_file()} {example})")


# -- writing and removing --------------------------------------------------------------------------
def entries(record: dict[str, Any]) -> list[Entry]:
    """The entries of a running pool's nodes (ConfigError for pools whose nodes have no sshd to
    reach, saying what to use instead)."""
    from .groupviews import group_views, node_count

    views = group_views(record)
    if len(views) == 1:
        return _group_entries(record, 0, "")
    out: list[Entry] = []
    refusals: list[str] = []
    offset = 0
    for group, view in views.items():
        try:
            out += _group_entries(view, offset, group)
        except ConfigError as exc:  # a group of Local (or otherwise unreachable) nodes: the others' still
            refusals.append(f"group {group!r}: {exc}")
        offset += node_count(view)
    if not out and refusals:
        raise ConfigError("; ".join(refusals))
    return out


def _group_entries(record: dict[str, Any], offset: int, group: str) -> list[Entry]:
    """The entries of one group's nodes (``record``: the group's view), ranked from ``offset``."""
    from ..bootstrap.remote import Remote, Target

    name = record["name"]
    cluster = record.get("cluster") or {}
    provider = record.get("provider") or cluster.get("provider")
    if provider == "local":
        raise ConfigError(
            f"pool {name!r} is a Local pool: its nodes are processes on this machine, with no sshd of "
            f"their own, so there are no SSH entries for them. `skyward ssh {name}` opens a shell in a "
            f"node's folder with its environment, `skyward cp` copies files, and `skyward notebook "
            f"{name}` serves a notebook there.")
    nodes = cluster.get("nodes") or []
    if any("host" not in n for n in nodes):
        raise ConfigError(
            f"pool {name!r} ({provider}): its nodes are not SSH hosts skyward logs in to in this version, "
            f"so there are no SSH entries for them; `skyward exec {name} -- CMD` runs commands there.")
    known = cluster.get("known_hosts")
    out = []
    for rank, node in enumerate(nodes):
        h = node["host"]
        target = Target(h["address"], h.get("port"), h.get("user"), h.get("key"), h.get("host_key"),
                        jump=h.get("jump"), known_hosts=known)
        remote = Remote(target, label=f"node {rank} ({h['address']})")
        conn = remote.resolved()  # ~/.ssh/config applied, as the pool's connection sees the host
        files = [h["key"]] if h.get("key") else list(conn.ssh_config.get("identityfile") or [])
        out.append(Entry(
            alias(name, offset + rank), offset + rank, str(conn.host), int(conn.port), str(conn.user),
            tuple(str(Path(f).expanduser()) for f in files),
            tuple(f"{k.get_name()} {k.get_base64()}" for k in remote.pinned_keys()),
            h.get("jump") or (str(conn.ssh_config.get("proxyjump")) if conn.ssh_config.get("proxyjump") else None),
            group, rank))
    return out


def write(record: dict[str, Any]) -> list[Entry]:
    """Write (or write again) the entries of pool ``record``, and the file that includes them."""
    name = record["name"]
    made = entries(record)
    home = os.environ.get("SKYWARD_HOME")
    env = f"env SKYWARD_HOME={shlex.quote(str(Path(home).expanduser().resolve()))} " if home else ""
    proxy = f"{env}{shlex.quote(sys.executable)} -m skyward proxy"
    known = known_hosts_file(name)
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"# pool {name!r} ({record.get('provider')}, {record.get('id', '')}): its nodes, written by skyward "
             f"at {when}.", f"# `skyward ssh-config {name}` writes it again; `skyward down {name}` removes it.", ""]
    for e in made:
        lines += [f"Host {e.alias}",
                  *([f"    # group {e.group!r}, its node {e.group_rank}"] if e.group else []),
                  *([f"    # through the jump host {e.via} (the proxy goes through it)"] if e.via else []),
                  f"    HostName {e.hostname}", f"    Port {e.port}", f"    User {_word(e.user)}",
                  *(f"    IdentityFile {_word(k)}" for k in e.keys),
                  *(["    IdentitiesOnly yes"] if e.keys else []),
                  f"    ProxyCommand {proxy} {shlex.quote(name)} {e.rank}",
                  # The node's key is checked against the pool's pin, under the entry's name.
                  f"    HostKeyAlias {e.alias}", f"    UserKnownHostsFile {_word(str(known))}",
                  "    GlobalKnownHostsFile /dev/null", "    StrictHostKeyChecking yes", "    UpdateHostKeys no",
                  "    CheckHostIP no",
                  *([] if e.host_keys else ["    # no pinned host key is known for it yet: ssh will refuse it "
                                            "until `skyward ssh-config` finds one"]),
                  ""]
    _write(known, "".join(f"{e.alias} {k}\n" for e in made for k in e.host_keys))
    _write(pool_file(name), "\n".join(lines))
    _write_main()
    return made


def remove(name: str) -> None:
    """The pool is gone: its entries too."""
    for path in (pool_file(name), known_hosts_file(name)):
        path.unlink(missing_ok=True)


def after_up(record: dict[str, Any]) -> None:
    """``skyward up``'s hook: the entries of a pool that has them (never fails the pool)."""
    import logging

    try:
        write(record)
    except ConfigError:
        return  # Local nodes: nothing to reach over SSH
    except (ProviderError, OSError, ValueError, KeyError) as exc:
        logging.getLogger("skyward").warning(
            "pool %r is up, but its SSH config entries could not be written (%s); `skyward ssh-config %s` "
            "tries again.", record["name"], exc, record["name"])


def has_entries(name: str) -> bool:
    return pool_file(name).is_file()


def _write_main() -> None:
    pools = folder() / "pools"
    _write(main_file(), (
        "# skyward: SSH entries for the nodes of this machine's named pools (ssh NAME-0, scp, rsync,\n"
        "# VS Code Remote-SSH), one file per pool, written by `skyward up` and `skyward ssh-config`,\n"
        "# removed by `skyward down`. skyward never edits ~/.ssh/config; add this line to it once:\n"
        f"#   {include_line()}\n"
        f"Include {_word(str(pools))}/*.conf\n"))


def _write(path: Path, text: str) -> None:
    """0600 in a 0700 folder, replaced whole (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _word(value: str) -> str:
    """A value as ssh_config reads it: in double quotes when it has spaces."""
    if any(c.isspace() for c in value) or not value:
        if '"' in value:
            raise ConfigError(f"{value!r}: a path with both spaces and double quotes cannot be written to an SSH config.")
        return f'"{value}"'
    return value
