"""The audit trail: append-only JSONL files under ``SKYWARD_HOME/audit/``, one per pool name
(``NAME.jsonl``) and one for every pool's record (``_pools.jsonl``; no pool name starts with _).

One line per lifecycle event (recorded, amended, provisioned, attached, detached, resized, node
lost, node replaced, exec, installed, install failed, served, serve updated, serve stopped,
destroyed, closed) saying who (user@host),
when, what, and the pool's offer, cost estimate and the skyward version; never a secret: every
detail goes through ``secrets.scrub`` on its way in (a command run on the nodes, an error). Lines
are appended with one ``write`` on an O_APPEND descriptor under an exclusive ``flock``, so
concurrent writers never interleave; nothing ever rewrites the file. It outlives the pool: ``skyward history NAME`` shows every pool that ever
had that name.

The trail is tamper-evident: each line carries its position (``n``) and the SHA-256 of the
line before it (``prev``), and ``.NAME.head`` holds the hash of the last line. ``verify``
names the first line that was changed, removed or reordered (``skyward history --verify``).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ..bootstrap.digest import sha256
from ..observe.secrets import scrub
from ..paths import skyward_home
from ..version import __version__

EVENTS = ("recorded", "amended", "provisioned", "attached", "detached", "resized", "node lost", "node replaced",
          "exec", "installed", "install failed", "served", "serve updated", "serve stopped", "destroyed", "closed")
POOLS = "_pools"  # the trail of every pool's record, named or not


def who() -> str:
    """user@host. The user as ``getpass.getuser`` finds it (LOGNAME, USER, LNAME, USERNAME,
    then the password database), without loading getpass and termios for it (5 ms of a pool's
    start)."""
    user = next((os.environ[n] for n in ("LOGNAME", "USER", "LNAME", "USERNAME") if os.environ.get(n)), None)
    if user is None:
        try:
            import pwd

            user = pwd.getpwuid(os.getuid()).pw_name
        except (KeyError, OSError, ImportError):
            user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _path(name: str) -> Path:
    folder = skyward_home() / "audit"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / f"{name}.jsonl"


def append(name: str, event: str, pool: str, **details: Any) -> dict[str, Any]:
    """Record one event of pool ``name`` (``pool``: the id of that incarnation of it)."""
    entry = {
        "time": time.time(),
        "who": who(),
        "pid": os.getpid(),
        "name": name,
        "pool": pool,
        "event": event,
        "skyward": __version__,
        **{k: scrub(v) for k, v in details.items() if v is not None},
    }
    path = _path(name)
    with _APPENDING:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # the chain needs the last line as it is when we append
            last = _last_line(fd)
            n, prev = (0, "") if not last else (_position(fd, last) + 1, _digest(last))
            entry = {**entry, "n": n, "prev": prev}
            body = json.dumps(entry, sort_keys=True, default=str).encode()
            os.write(fd, body + b"\n")
            _write_head(path, n, _digest(body))
        finally:
            os.close(fd)  # releases the lock
    return entry


# Held while a trail's flock is: a fork waits for the append another thread is making (the pool
# writes its record on a thread of its own), so that no child inherits a held flock, which would
# hold up every later append of its parent's (a pool's close) for as long as the child lives.
_APPENDING = threading.Lock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_APPENDING.acquire, after_in_parent=_APPENDING.release,
                        after_in_child=_APPENDING.release)


def _digest(line: bytes) -> str:
    return sha256(line).hexdigest()


def _last_line(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunk = 1 << 16
    while True:
        start = max(0, size - chunk)
        data = os.pread(fd, size - start, start).rstrip(b"\n")
        if b"\n" in data or start == 0:
            return data.rsplit(b"\n", 1)[-1]
        chunk *= 4


def _position(fd: int, last: bytes) -> int:
    """The position of the file's last line: its own ``n``, or a count for older trails."""
    try:
        return int(json.loads(last)["n"])
    except (ValueError, KeyError, TypeError):
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0).rstrip(b"\n").count(b"\n")


def _head_path(path: Path) -> Path:
    return path.with_name(f".{path.stem}.head")


def _write_head(path: Path, n: int, digest: str) -> None:
    head = _head_path(path)
    tmp = head.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{n} {digest}\n".encode())
    finally:
        os.close(fd)
    os.replace(tmp, head)


def verify(name: str | None = None) -> list[str]:
    """Check the hash chain of one trail (``name``) or of every trail: one message per trail
    that fails, naming the first line that was changed, removed or reordered ([] when intact)."""
    folder = skyward_home() / "audit"
    paths = [_path(name)] if name is not None else sorted(folder.glob("*.jsonl"))
    return [problem for path in paths if (problem := _verify_file(path)) is not None]


def exists(name: str) -> bool:
    """Whether anything was ever recorded under ``name`` (its trail, or the head a removed
    trail leaves behind)."""
    path = _path(name)
    return path.exists() or _head_path(path).exists()


def _verify_file(path: Path) -> str | None:
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        if _head_path(path).exists():
            return f"{path.name}: was removed (its head file .{path.stem}.head remains)"
        return None
    if lines and lines[-1] == b"":
        lines.pop()
    where = f"{path.name}"
    prev, chained, n = "", False, -1
    for i, raw in enumerate(lines, start=1):
        try:
            entry = json.loads(raw)
        except ValueError:
            return f"{where} line {i}: not a JSON object any more (it was changed)"
        if not isinstance(entry, dict) or "prev" not in entry or "n" not in entry:
            if chained:
                return f"{where} line {i}: carries no hash chain (it was added or changed by hand)"
            prev, n = _digest(raw), i - 1  # written by an older skyward, before the chain
            continue
        chained = True
        n = entry["n"]
        if n != i - 1:
            return (f"{where} line {i}: says it is line {n + 1 if isinstance(n, int) else n}; lines before "
                    f"it were removed or reordered")
        if entry["prev"] != prev:
            return (f"{where} line {i - 1}: was changed (line {i} holds the hash it had), or a line "
                    f"was inserted before line {i}")
        prev = _digest(raw)
    try:
        head_n, head_digest = _head_path(path).read_text().split()
    except (FileNotFoundError, ValueError):
        return None if not chained else f"{where}: its head file .{path.stem}.head is missing (it was removed)"
    if int(head_n) != n:
        return (f"{where}: ends at line {n + 1} and the last line written was line {int(head_n) + 1}; lines "
                f"at the end were removed")
    if head_digest != prev:
        return f"{where} line {n + 1}: was changed (the last line no longer has the hash it was written with)"
    return None


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
