"""A node's bootstrap, as the client reads it: the script's progress lines, one at a time.

The bootstrap script (``script.py``) marks each phase (``@@skyward phase NAME started|done|
skipped|failed [code]``) and says what apt installed (``@@skyward apt NAME VERSION``). Every
provider that runs it (SSH, Slurm, Container) reads its output through ``PhaseReader``: each
phase becomes a ``BootstrapPhase`` event with how long it took, and each apt version goes into
the pool's apt versions and its lock (the record's ``lock["apt"]``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .script import parse_marker

# (node, phase, status, seconds: None when it starts)
OnPhase = Callable[[int, str, Any, "float | None"], None]

APT_PREFIX = "@@skyward apt "


class PhaseReader:
    """One node's progress lines (``feed``), for a pool whose apt versions are ``apt`` and whose
    lock ``lock()`` returns (None while the pool has none yet: the versions wait in ``apt``).

    ``label`` goes before each phase's name in its event (``"login "``: the environment built
    on a Slurm login node). ``current``: the phase that started last (``""`` before any), the
    one a failure is reported in."""

    def __init__(self, node: int, on_phase: OnPhase, *, apt: dict[str, str] | None = None,
                 lock: Callable[[], dict[str, Any] | None] | None = None, label: str = "") -> None:
        self.node = node
        self.current = ""
        self._on_phase = on_phase
        self._apt = apt
        self._lock = lock
        self._label = label
        self._started: dict[str, float] = {}

    def feed(self, line: str) -> bool:
        """Take one line of the node's output: True when it was a progress line (and is done
        with), False for anything else (the caller's to read)."""
        if line.startswith(APT_PREFIX):
            if self._apt is not None:
                _, _, name, version = [*line.split(), "", ""][:4]
                self._apt.setdefault(name, version)  # the first node to report a package wins
                lock = self._lock() if self._lock is not None else None
                if lock is not None:
                    lock["apt"] = dict(sorted(self._apt.items()))
            return True
        parsed = parse_marker(line)
        if parsed is None:
            return False
        name, status, _ = parsed
        now = time.monotonic()
        if status == "started":
            self._started[name], self.current = now, name
            self._on_phase(self.node, self._label + name, "started", None)
        else:
            self._on_phase(self.node, self._label + name, status, now - self._started.get(name, now))
        return True
