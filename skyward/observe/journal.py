"""The event journal of named pools: what happened to a pool, kept for a post-mortem.

The event stream itself lives in memory; the log file keeps it as text, for every pool of the
machine together, and the audit trail keeps who did what. The journal keeps the events of one
named pool, as data, for as long as its bound allows: ``SKYWARD_HOME/events/NAME.jsonl``, one
JSON object per event, written by every process that provisions the pool (``skyward up``,
``sky.Compute(name=...)``) or attaches a program to it, from the pool's first event (requesting
nodes, every bootstrap phase, the error that stopped it) to its last (detached, destroyed).
``skyward events NAME`` reads it, with the audit trail.

What it keeps: the cluster's and the nodes' lifecycle, bootstrap phases, stack resource
operations, batches, losses, replacements and errors (``KINDS``); not single tasks, metrics
or task output (``skyward logs`` shows those), so keeping it costs nothing per task. Values
registered as secrets are masked, as in the log file.

Bounded: past ``MAX_BYTES`` the file becomes ``NAME.1.jsonl`` (the previous one is dropped)
and a new one starts, so a name never holds more than about twice that. Lines are appended
under an exclusive ``flock``, one ``write`` each: several processes may write one name's
journal at once. It outlives the pool, like the audit trail.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..paths import skyward_home
from . import events as ev
from .secrets import redact

MAX_BYTES = 1 << 20  # per generation; two generations are kept
_BUFFERED = 2000  # events of a pool not yet known to be ours, held while it opens

KINDS: tuple[type[ev.Event], ...] = (
    ev.ClusterRequested, ev.ClusterProvisioned, ev.ClusterReady, ev.ClusterDestroyed, ev.ClusterDetached,
    ev.InstanceRequested, ev.InstanceProvisioned, ev.BootstrapPhase, ev.InstanceBootstrapped, ev.InstancePreempted,
    ev.InstanceLost, ev.InstanceReplaced, ev.InstanceDestroyed, ev.ResourceChanged, ev.BatchStarted,
    ev.BatchFinished, ev.ShutdownRequested, ev.ShutdownCompleted, ev.Error,
)


def folder() -> Path:
    path = skyward_home() / "events"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def path_of(name: str) -> Path:
    """Where the journal of pool ``name`` is (its previous generation: ``NAME.1.jsonl``)."""
    return skyward_home() / "events" / f"{name}.jsonl"


def entry(event: ev.Event, name: str, role: str) -> dict[str, Any]:
    """One event as a journal line: its kind, its fields (strings with secrets masked), the
    pool's name and the role of the process that saw it (``provision`` or ``attach``)."""
    fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    out: dict[str, Any] = {"time": fields.pop("time"), "event": type(event).__name__, "name": name,
                           "role": role, "pid": os.getpid()}
    for key, value in fields.items():
        out[key] = redact(value) if isinstance(value, str) else value
    return out


def append(name: str, entries: list[dict[str, Any]]) -> None:
    """Append lines to ``name``'s journal, starting a new generation when it is full."""
    if not entries:
        return
    path = folder() / f"{name}.jsonl"
    body = b"".join(json.dumps(e, sort_keys=True, default=str).encode() + b"\n" for e in entries)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size and os.fstat(fd).st_size + len(body) > MAX_BYTES:
            # Another writer may hold this inode open: it appends to the old generation once
            # more at most, since every append reopens the path.
            os.replace(path, path.with_name(f"{name}.1.jsonl"))
            os.close(fd)
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, body)
    finally:
        os.close(fd)


def read(name: str) -> list[dict[str, Any]]:
    """Every event kept for ``name``, oldest first (a torn line is skipped)."""
    out: list[dict[str, Any]] = []
    for path in (path_of(name).with_name(f"{name}.1.jsonl"), path_of(name)):
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict):
                    out.append(item)
    return sorted(out, key=lambda e: float(e.get("time") or 0))


def exists(name: str) -> bool:
    return path_of(name).exists() or path_of(name).with_name(f"{name}.1.jsonl").exists()


def rebuilt(item: dict[str, Any]) -> ev.Event | None:
    """The event a journal line was written from (None: a kind this version does not know)."""
    kind = getattr(ev, str(item.get("event")), None)
    if not (isinstance(kind, type) and issubclass(kind, ev.Event)):
        return None
    names = {f.name for f in dataclasses.fields(kind)}
    try:
        return kind(**{k: v for k, v in item.items() if k in names})
    except TypeError:
        return None


class Journal:
    """Writes the events of one opening of pool ``name`` (``role``: provision or attach).

    It listens before the pool exists, since the pool's id is only known once it is made:
    events of pools not yet claimed are held (bounded) until ``bind(pool_id)`` says which one is
    this pool, or ``failed(exc)`` finds the attempt that raised ``exc``."""

    def __init__(self, name: str, role: str) -> None:
        self.name, self.role = name, role
        self._pool: str | None = None
        self._held: dict[str, collections.deque[ev.Event]] = {}
        self._lock = threading.Lock()
        self._unsubscribe: Callable[[], None] | None = ev.bus.subscribe(self._on_event, None, KINDS)

    def _on_event(self, event: ev.Event) -> None:
        with self._lock:
            if self._pool is None:
                if event.pool in self._held or len(self._held) < 64:
                    self._held.setdefault(event.pool, collections.deque(maxlen=_BUFFERED)).append(event)
                return
            if event.pool != self._pool:
                return
        self._write([event])

    def bind(self, pool_id: str) -> Callable[[], None]:
        """These are the events of pool ``pool_id``: write what was held, then each as it comes.
        Returns ``close``, for the pool's close hooks."""
        with self._lock:
            self._pool = pool_id
            held = list(self._held.pop(pool_id, ()))
            self._held.clear()
            self._write(held)  # under the lock: nothing of this pool can be written before these
        return self.close

    def failed(self, exc: BaseException) -> None:
        """The pool never opened: keep the events of the attempt that raised ``exc`` (the pool
        emitted an Error carrying its message before raising it), then stop."""
        ev.bus.flush(2.0)
        with self._lock:
            message = str(exc)
            ids = [pid for pid, held in self._held.items()
                   if any(isinstance(e, ev.Error) and e.message == message for e in held)]
            if not ids and len(self._held) == 1:
                ids = list(self._held)
            held = sorted((e for pid in ids[:1] for e in self._held[pid]), key=lambda e: e.time)
            self._held.clear()
            self._pool = ids[0] if ids else ""
        self._write(held)
        self.close()

    def close(self) -> None:
        """Stop writing, once what the pool emitted so far is written."""
        if self._unsubscribe is None:
            return
        ev.bus.flush(2.0)
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        unsubscribe()

    def _write(self, events: list[ev.Event]) -> None:
        try:
            append(self.name, [entry(e, self.name, self.role) for e in events])
        except OSError as exc:  # the journal must never break a pool
            import logging

            logging.getLogger("skyward").warning("could not write the event journal of pool %s: %s",
                                                 self.name, exc)


@contextlib.contextmanager
def capture(name: str, role: str) -> Iterator[Journal]:
    """Journal the pool opened inside the block (``journal.bind(pool.id)`` once it is made); if
    opening it raises, keep the events of the attempt."""
    journal = Journal(name, role)
    try:
        yield journal
    except BaseException as exc:
        journal.failed(exc)
        raise
