"""``skyward ssh NAME [--node N] [-- CMD ARGS]``: a shell, or one command, on a node of a running
named pool, in the node's working directory with the environment its tasks see.

Without a command: an interactive bash (your ``~/.bashrc`` first, then the pool's environment;
the prompt starts with ``(NAME:N)``), or, when stdin is not a terminal, bash reading the
commands from it (``skyward ssh NAME < script.sh``). With one: ``CMD ARGS`` run by bash there, on a terminal
when this command runs on one, and its exit status is this command's. Local nodes are this
machine, so the shell is a local one; SSH and cloud nodes are reached through the pool's own
SSH connection (see nodeaccess.py).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable

from ..errors import ConfigError
from .cliout import err
from .nodeaccess import Node, open_nodes
from .wake import awake

q = shlex.quote


def add_ssh(command: Callable[[str], argparse.ArgumentParser]) -> None:
    p = command("ssh")  # its help: _MODULE_COMMANDS of named/cli.py
    p.add_argument("name", help="the pool's name")
    p.add_argument("--node", type=int, default=0, help="the node's rank, 0 to nodes-1 (default 0; with "
                   "--group: its rank within the group)")
    p.add_argument("--group", help="a node of this group (a pool of several groups)")
    p.add_argument("--no-wake", action="store_true", help="refuse with an error when the pool is asleep, instead of waking it for this command")
    p.add_argument("cmd", nargs="*", metavar="-- CMD", help="a command to run instead of a shell, after --")
    p.set_defaults(handler=cmd_ssh)


def shell_script(node: Node, command: str | None, *, interactive: bool = True) -> str:
    """What bash runs on the node: the pool's environment, then ``command``, an interactive
    shell, or (not ``interactive``: stdin is a pipe or a file) the commands read from stdin."""
    setup = node.activate()
    if command is not None:
        return f"{setup}exec bash -c {q(command)}"
    if not interactive:
        return f"{setup}exec bash -s"
    # --rcfile replaces ~/.bashrc: read it first, then the pool's environment wins.
    prompt = f"({node.pool}:{node.rank}) "
    rc = f'if [ -f ~/.bashrc ]; then . ~/.bashrc; fi\n{setup}PS1={q(prompt)}"${{PS1-\\$ }}"\n'
    return f"exec bash --rcfile <(cat <<'SKYWARD_RC'\n{rc}SKYWARD_RC\n) -i"


def cmd_ssh(args: argparse.Namespace) -> int:
    from ..records import audit

    if args.json:
        raise ConfigError(f"ssh has no --json output; `skyward exec {args.name} --json -- CMD` runs a "
                          f"command on every node and reports each result as JSON.")
    words = list(args.cmd)
    command = None if not words else words[0] if len(words) == 1 else shlex.join(words)
    with awake(args.name, wake=not args.no_wake, command="skyward ssh", node=args.node), \
            open_nodes(args.name, args.node, args.group) as (record, nodes):
        node = nodes[0]
        if command is None and sys.stderr.isatty():
            err(f"{node.label} of pool {args.name!r}, in {node.cwd}; `exit` or Ctrl-D leaves")
        started = time.time()
        code = node.attach(shell_script(node, command, interactive=sys.stdin.isatty()))
    audit.append(args.name, "ssh", record.get("id", ""), node=node.rank, hostname=node.hostname,
                 command=command if command is not None else "(interactive shell)", exit_code=code,
                 seconds=round(time.time() - started, 1))
    return code
