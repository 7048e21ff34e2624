"""The note an unnamed cloud pool leaves while it exists (orphans.py finds the ones whose
program is gone).

``$SKYWARD_HOME/clouds/<stack>.json`` (0600): the client's pid and host, and what reopens the
stack. CloudPool writes it before the first ``up`` and removes it after ``destroy``; this
module is below both, so the pool does not import the module that reopens pools.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from skyward.paths import skyward_home

if TYPE_CHECKING:
    from .cloudpool import CloudPool


def folder() -> Path:
    return skyward_home() / "clouds"


def note(cloud: CloudPool, kind: str) -> None:
    """Leave (or refresh) the note of a live unnamed cloud pool."""
    path = folder() / f"{cloud.plan.stack}.json"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    body = {"stack": cloud.plan.stack, "kind": kind, "pool_id": cloud.pool_id, "pid": os.getpid(),
            "host": socket.gethostname(), "created": time.time(), "description": cloud.describe()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(body, f, default=str)
    os.replace(tmp, path)


def forget(stack: str) -> None:
    (folder() / f"{stack}.json").unlink(missing_ok=True)
