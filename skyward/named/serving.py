"""What ``skyward serve NAME`` leaves beside the pool's record, for the other commands to read.

Three kinds of file in the registry folder (0700), each 0600 and written atomically (temp file +
rename), none ending in ``.json`` (that suffix is a pool's record):

* ``NAME.serve``: the serving process's status, rewritten every second: its pid (and the
  process's start time, so a reused pid is not taken for it), the URL, the app, the replicas
  ready and the requests per second. ``skyward ls`` shows it; a file whose process is gone is
  stale and ignored. Never the token: whoever can read the registry must not get the endpoint's
  key from it (the serving process prints it, once, to whoever started it).
* ``NAME.serve-update.ID``: a request to roll to another app (``skyward serve NAME APP
  --update``), which the serving process takes (removes) when it next looks, once a second;
* ``NAME.serve-result.ID``: its answer, which the requesting command reads and removes.

Files, not a socket: the status file has to exist anyway (for ``ls``, with no process to ask),
and a request beside it needs no listener thread, no path-length limit (a Unix socket's path
is 108 bytes at most, and SKYWARD_HOME may be deep) and no cleanup of its own: a request a
dead server never took is answered by the requester seeing the server's pid gone.
``NAME.serve.lock`` (flock) keeps a pool to one serving process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ServeError
from ..paths import skyward_home

_FRESH = 30.0  # a status file from another host counts while younger than this (no pid to check)


def _folder() -> Path:
    from .registry import pools_dir

    return pools_dir()


def status_path(name: str) -> Path:
    return _folder() / f"{name}.serve"


def _write(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _me() -> dict[str, Any]:
    from ..providers.local_procs import start_time

    return {"pid": os.getpid(), "started": start_time(os.getpid()), "host": socket.gethostname()}


def _running(status: dict[str, Any]) -> bool:
    if status.get("host") != socket.gethostname():
        return time.time() - float(status.get("updated") or 0) < _FRESH
    from ..providers.local_procs import process_running

    try:
        return process_running(int(status["pid"]), status.get("started"))
    except (KeyError, TypeError, ValueError):
        return False


# -- the serving process's side ------------------------------------------------------------------
@contextlib.contextmanager
def hold(name: str) -> Iterator[None]:
    """Be pool ``name``'s one serving process (a second one fails at once, naming the first)."""
    fd = os.open(_folder() / f"{name}.serve.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            now = read_status(name) or {}
            by = f" by pid {now.get('pid')} at {now.get('url')}" if now else ""
            raise ServeError(
                f"pool {name!r} is already being served{by}: one `skyward serve {name}` at a time. "
                f"Roll it to another app with `skyward serve {name} APP --update`, or stop it first "
                f"(Ctrl-C where it runs).") from None
        for left in (*_folder().glob(f"{name}.serve-update.*"), *_folder().glob(f"{name}.serve-result.*")):
            with contextlib.suppress(OSError):
                left.unlink()  # of a requester killed while it waited: it waits no more
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                status_path(name).unlink()
    finally:
        os.close(fd)


def write_status(name: str, **fields: Any) -> None:
    """Replace the status file (what ``ls`` shows); ``fields`` must not hold the token."""
    _write(status_path(name), {**_me(), "name": name, "updated": time.time(), **fields})


def take_requests(name: str) -> list[dict[str, Any]]:
    """The update requests waiting for this process, oldest first; each is removed as taken."""
    found = []
    for path in sorted(_folder().glob(f"{name}.serve-update.*"), key=lambda p: p.stat().st_mtime):
        request = _read(path)
        with contextlib.suppress(OSError):
            path.unlink()
        if request is not None:
            found.append({**request, "id": path.name.rsplit(".", 1)[1]})
    return found


def answer(name: str, request_id: str, result: dict[str, Any]) -> None:
    _write(_folder() / f"{name}.serve-result.{request_id}", result)


# -- the other commands' side --------------------------------------------------------------------
def read_status(name: str) -> dict[str, Any] | None:
    """The status of the process serving pool ``name``; None when none runs (no file, or a stale
    one: its process is gone)."""
    status = _read(skyward_home() / "registry" / f"{name}.serve")
    return status if status is not None and _running(status) else None


def request_update(name: str, app: str, factory: bool, who: str) -> dict[str, Any]:
    """Ask pool ``name``'s serving process to roll to ``app``; wait for its answer and return
    it. ServeError when no serving process runs, or when it ends before it answers."""
    status = read_status(name)
    if status is None:
        raise ServeError(
            f"no `skyward serve {name}` runs (on this machine, for this SKYWARD_HOME), so there is "
            f"nothing to update: start serving with `skyward serve {name} {app}`.")
    request_id = uuid.uuid4().hex[:12]
    request = _folder() / f"{name}.serve-update.{request_id}"
    result = _folder() / f"{name}.serve-result.{request_id}"
    _write(request, {"app": app, "factory": factory, "who": who, "asked": time.time()})
    try:
        while True:
            got = _read(result) if result.exists() else None
            if got is not None:
                return got
            if read_status(name) is None:
                raise ServeError(
                    f"the `skyward serve {name}` process (pid {status.get('pid')}) ended before it "
                    f"answered the update to {app!r}; its replicas ended with it.")
            time.sleep(0.2)
    finally:
        for path in (request, result):
            with contextlib.suppress(OSError):
                path.unlink()
