"""The audit trail: an append-only JSONL file per pool name, ``SKYWARD_HOME/audit/NAME.jsonl``.

One line per lifecycle event (provisioned, attached, detached, resized, node lost, exec,
destroyed) saying who (user@host), when, what, and the pool's offer, cost estimate and the
skyward version. Lines are appended with one ``write`` on an O_APPEND descriptor, so
concurrent writers never interleave; nothing ever rewrites the file. It outlives the pool:
``skyward history NAME`` shows every pool that ever had that name.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from .paths import skyward_home

EVENTS = ("provisioned", "attached", "detached", "resized", "node lost", "exec", "destroyed")


def who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _path(name: str) -> Path:
    folder = skyward_home() / "audit"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / f"{name}.jsonl"


def append(name: str, event: str, pool: str, **details: Any) -> dict[str, Any]:
    """Record one event of pool ``name`` (``pool``: the id of that incarnation of it)."""
    from skyward import __version__

    entry = {
        "time": time.time(),
        "who": who(),
        "pid": os.getpid(),
        "name": name,
        "pool": pool,
        "event": event,
        "skyward": __version__,
        **{k: v for k, v in details.items() if v is not None},
    }
    line = (json.dumps(entry, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(_path(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return entry


def read(name: str) -> list[dict[str, Any]]:
    """Every event recorded for ``name``, oldest first (a torn last line is skipped)."""
    try:
        text = _path(name).read_text()
    except FileNotFoundError:
        return []
    entries = []
    for line in text.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries
