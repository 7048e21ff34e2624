"""Unnamed cloud pools whose client is gone: found, shown and destroyed.

A named pool lives in the registry and outlives its programs by design. An unnamed cloud pool
(``with sky.Compute(provider=sky.AWS())``) is destroyed by the program that made it; when that
program dies without running its teardown (kill -9, a laptop that never wakes), its stack and
whatever of it still exists would be forgotten. So each one leaves a note while it exists
(notes.py): ``$SKYWARD_HOME/clouds/<stack>.json`` (0600), with the client's pid and host and
what reopens the stack. The note is written before the first ``up`` and removed after
``destroy``.

``skyward ls`` lists the notes whose client process is no longer running (on this machine)
with the resources their stack still holds after a refresh; ``skyward down --expired``
destroys those stacks.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyward.bootstrap.procs import alive as _running

from .notes import folder, forget

if TYPE_CHECKING:
    from .cloudpool import CloudPool

log = logging.getLogger("skyward.stacks")


@dataclass(frozen=True, slots=True)
class Orphan:
    """An unnamed cloud pool whose client is gone."""

    stack: str
    kind: str  # "aws" | "gcp"
    pool_id: str
    pid: int
    host: str
    created: float
    description: dict[str, Any]

    @property
    def path(self) -> Path:
        return folder() / f"{self.stack}.json"


def orphans() -> list[Orphan]:
    """The notes of this machine whose client process no longer runs (oldest first)."""
    found = []
    for path in sorted(folder().glob("*.json")):
        try:
            body = json.loads(path.read_text())
            orphan = Orphan(str(body["stack"]), str(body["kind"]), str(body["pool_id"]), int(body["pid"]),
                            str(body["host"]), float(body["created"]), dict(body["description"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        # A note from another machine (a shared home) cannot be judged from here: its client may
        # well be running there.
        if orphan.host != socket.gethostname() or _running(orphan.pid):
            continue
        found.append(orphan)
    return sorted(found, key=lambda o: o.created)


def default_connect(orphan: Orphan) -> Any:
    """How an orphan's stack is reopened: None is the Pulumi CLI on the backend the stack was
    made on (tests put a fake workspace here)."""
    return None


def _reopen(orphan: Orphan, connect: Any = None) -> CloudPool:
    import importlib

    from .cloudpool import CloudPool

    program: Callable[[Any], Any] = importlib.import_module(f"skyward.stacks.{orphan.kind}").program
    return CloudPool.from_description(orphan.description, program, connect=connect or default_connect(orphan))


def remaining(orphan: Orphan, connect: Any = None) -> list[dict[str, str]]:
    """What of the pool still exists: the stack refreshed against the cloud, then its resources
    (type and name; providers and the stack itself left out)."""
    cloud = _reopen(orphan, connect)
    cloud.stack.refresh()
    resources = (cloud.stack.export().get("deployment") or {}).get("resources") or []
    out = []
    for r in resources:
        typ = str(r.get("type") or "")
        if not typ or typ.startswith("pulumi:"):
            continue
        out.append({"type": typ, "name": str(r.get("urn", "")).rsplit("::", 1)[-1], "id": str(r.get("id") or "")})
    return out


def destroy(orphan: Orphan, connect: Any = None) -> None:
    """Refresh, destroy and remove the orphan's stack, then its note."""
    _reopen(orphan, connect).close()
    forget(orphan.stack)
