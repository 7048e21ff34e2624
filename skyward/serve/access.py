"""An endpoint's access log: one line per request, in a file beside the pool's log file.

    2026-12-02T04:50:01.123Z 127.0.0.1 POST /predict 200 12.3ms 1.0

(time in UTC, the client's address, method, path with its query, status, milliseconds from the
request's arrival to its last byte, the replica that answered or ``-``). The file is
``access-POOL-PORT.log`` in the folder of the pool's log file (``SKYWARD_HOME/logs`` unless
``Options(logging=LogConfig(file=...))`` moves it), created 0600; a pool opened with
``logging=False`` writes none.

Nothing secret reaches it: a query parameter whose name says it is a secret (``token``,
``api_key``, ``password``, ...: :func:`skyward.observe.secrets.is_secret_name`) has its value
replaced by ``***``, and the line then goes through :func:`skyward.observe.secrets.redact`, so
every registered secret (the endpoint's own token among them), raw or URL-encoded, is masked
wherever it appears.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from ..observe.secrets import MASK, is_secret_name, redact
from .router import AccessRecord

log = logging.getLogger("skyward.serve")


def mask_path(path: str) -> str:
    """``path`` with the value of every secret-named query parameter replaced by ``***``."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    parts = []
    for pair in query.split("&"):
        name, eq, _value = pair.partition("=")
        parts.append(f"{name}={MASK}" if eq and is_secret_name(name.replace("-", "_").replace(".", "_")) else pair)
    return f"{base}?{'&'.join(parts)}"


def line(record: AccessRecord, when: float | None = None) -> str:
    now = time.time() if when is None else when
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    return redact(f"{stamp} {record.client} {record.method} {mask_path(record.path)} {record.status} "
                  f"{record.seconds * 1000:.1f}ms {record.replica or '-'}")


class AccessLog:
    """Appends :func:`line` of each record to ``path`` (opened once, 0600, line-buffered)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file = os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="replace")

    def write(self, record: AccessRecord) -> None:
        text = line(record)
        with self._lock:
            if not self._file.closed:
                self._file.write(text + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def open_for(folder: Path | None, pool: str, port: int) -> AccessLog | None:
    """The access log of an endpoint on ``port`` of ``pool`` in ``folder``; None when the pool
    writes no log file, or the file cannot be opened (said once, the endpoint serves anyway)."""
    if folder is None:
        return None
    try:
        return AccessLog(folder / f"access-{pool}-{port}.log")
    except OSError as exc:
        log.warning("not writing the access log of port %d in %s: %s", port, folder, exc)
        return None
