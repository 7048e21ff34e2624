"""The pool registry: one record per named pool under ``SKYWARD_HOME/registry/``.

A record is a JSON file (0600: it holds the agents' token and how to reach the nodes) written
atomically (temp file + rename), so readers never need a lock. Writers take the pool's lock
file (``flock``): ``skyward up`` holds it for the whole provisioning, which is what makes a
second ``up`` of the same name fail at once with a clear error instead of racing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError, PoolBusyError
from ..paths import skyward_home

FORMAT = 1
# A pool's name: its record's file name, its [pools.NAME] table, its stack's prefix.
# Matched whole (fullmatch; "\Z" for callers that use match): "$" would also match before a
# trailing newline, and such a name breaks the ssh config it is written into.
NAME_RULE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}\Z")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RULE.fullmatch(name):
        raise ConfigError(
            f"pool name {name!r} is not valid: use 1-63 lowercase letters, digits, '-' or '_', "
            f"starting with a letter or digit (e.g. 'train-a100')."
        )
    return name


def pools_dir() -> Path:
    path = skyward_home() / "registry"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _path(name: str) -> Path:
    return pools_dir() / f"{name}.json"


def read(name: str) -> dict[str, Any] | None:
    try:  # reading creates nothing (`skyward preview` must leave no trace)
        record: dict[str, Any] = json.loads((skyward_home() / "registry" / f"{name}.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # a torn or foreign file: treated as no pool (writes are atomic)
    return record


def names() -> list[str]:
    return sorted(p.stem for p in pools_dir().glob("*.json"))


def write(record: dict[str, Any]) -> None:
    """Replace the pool's record atomically; the file is private to the user."""
    record = {**record, "format": FORMAT}
    folder = pools_dir()
    fd, tmp = tempfile.mkstemp(prefix=f".{record['name']}.", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp makes it 0600
            json.dump(record, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, _path(record["name"]))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _path(name).unlink()
    with contextlib.suppress(FileNotFoundError):
        _probe_path(name).unlink()


# -- the last probe of a pool's nodes (skyward/named/probe.py), beside its record ------------------
def _probe_path(name: str) -> Path:
    return pools_dir() / f"{name}.probe"  # not .json: names() lists records only


def write_probe(name: str, data: dict[str, Any]) -> None:
    """Replace the pool's last probe atomically (0600, like the record)."""
    folder = pools_dir()
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.probe.", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, _probe_path(name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_probe(name: str) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((skyward_home() / "registry" / f"{name}.probe").read_text())
    except (OSError, ValueError):
        return None
    return data


@contextlib.contextmanager
def lock(name: str, wait: float = 10.0) -> Iterator[None]:
    """Hold the pool's lock. ``wait=0``: fail at once if another command holds it."""
    path = pools_dir() / f"{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise PoolBusyError(_busy_message(name)) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def _busy_message(name: str) -> str:
    record = read(name) or {}
    owner = record.get("owner") or {}
    state = record.get("state", "changing")
    by = f" by {owner.get('who')} (pid {owner.get('pid')})" if owner else ""
    what = "being provisioned" if state == "provisioning" else "being changed"
    return (
        f"pool {name!r} is {what}{by}; another skyward command holds its lock. Wait for that "
        f"command to finish (then `skyward ls`), or stop it and retry."
    )


def update(name: str, change: Any, wait: float = 10.0) -> dict[str, Any] | None:
    """Read, ``change(record)`` in place, write; under the lock. None when there is no record."""
    with lock(name, wait):
        record = read(name)
        if record is None:
            return None
        change(record)
        write(record)
        return record
