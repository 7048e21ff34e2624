"""``skyward logs NAME -f``: follow the agent logs of a pool's nodes, like ``tail -f``, each
line prefixed by its node, until Ctrl-C (exit 0).

Each node's agent is asked for the lines after the last offset it returned
(nodeops.log_since), beside its workers (agentcalls), a few times a second while it has
nothing new and again at once while it has: following takes no task slot, and works the same
for every provider (the agent reads its own log). A node that is lost is said on stderr and
the others are followed on; when none is left, the command ends (exit 1).
"""

from __future__ import annotations

import argparse
import functools
import json
import queue
import sys
import time
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from . import nodeops
from .agentcalls import Node, attached, send
from .cliout import EXIT_FAILED, EXIT_OK, err

POLL = 0.3  # seconds between asks while a node has nothing new


@dataclass
class _Tail:
    node: Node
    path: str
    offset: int | None = None
    due: float = 0.0
    asking: bool = False


def follow(args: argparse.Namespace) -> int:
    try:
        return _follow(args.name, args.node, args.lines, args.json, getattr(args, "group", None))
    except KeyboardInterrupt:  # Ctrl-C is how a follow ends
        return EXIT_OK


def _follow(name: str, only: int | None, lines: int, as_json: bool, group: str | None = None) -> int:
    if lines < 0:
        raise ConfigError(f"--lines {lines}: give a number of lines, 0 or more.")
    with attached(name, group) as (_pool, nodes):
        if only is not None and len({n.group for n in nodes}) > 1:
            raise ConfigError(f"--node {only}: pool {name!r} has several groups; give --group GROUP with "
                              f"it (--node is then the rank within that group).")
        if only is not None and not 0 <= only < len(nodes):
            raise ConfigError(f"--node {only}: pool {name!r} has nodes 0 to {len(nodes) - 1}.")
        tails = []
        for node in nodes:
            if only is not None and node.rank != only:
                continue
            path = node.description.get("log")
            if node.channel is None or not path:
                err(f"{node.label}: not followed: "
                    f"{node.why or 'this provider does not say where its agent log is'}")
                continue
            tails.append(_Tail(node, path))
        if not tails:
            return EXIT_FAILED
        answers: queue.SimpleQueue[tuple[_Tail, Any]] = queue.SimpleQueue()
        while tails:
            now = time.monotonic()
            for t in tails:
                if not t.asking and now >= t.due:
                    t.asking = True
                    assert t.node.channel is not None
                    fn = functools.partial(nodeops.log_since, t.path, t.offset, lines)
                    send(t.node.channel, fn, functools.partial(_answer, answers, t))
            try:
                t, value = answers.get(timeout=POLL)
            except queue.Empty:
                continue
            t.asking = False
            if isinstance(value, BaseException) or value.get("error"):
                why = value if isinstance(value, BaseException) else f"cannot read {t.path}: {value['error']}"
                err(f"{t.node.label}: stopped following: {why}")
                tails.remove(t)
                continue
            if value["restarted"]:
                err(f"{t.node.label}: {t.path} was rotated or truncated; reading it from its start")
            more = value["offset"] != t.offset and t.offset is not None
            t.offset = value["offset"]
            t.due = time.monotonic() + (0 if more else POLL)
            _print(t.node, value["text"], as_json)
        return EXIT_FAILED


def _answer(answers: queue.SimpleQueue[tuple[_Tail, Any]], tail: _Tail, value: Any) -> None:
    answers.put((tail, value))


def _print(node: Node, text: str, as_json: bool) -> None:
    host = node.description.get("hostname") or ""
    for line in text.splitlines():
        if as_json:
            print(json.dumps({"node": node.rank, "hostname": host, "line": line}))
        else:
            print(f"[node {node.rank}{' ' + host if host else ''}] {line}")
    sys.stdout.flush()
