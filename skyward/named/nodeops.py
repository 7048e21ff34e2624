"""Small tasks the CLI runs on a pool's nodes (``skyward exec``, ``skyward logs``).

They travel pickled by reference, so this module is imported on the nodes: standard library
only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections import deque
from typing import Any


def run_shell(command: str, timeout: float | None = None) -> dict[str, Any]:
    """Run ``command`` with bash in the node's working directory; what it printed and its code."""
    start = time.monotonic()
    try:
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = 124
        out = _text(exc.stdout)
        err = _text(exc.stderr) + f"\n(stopped after {timeout:g} s)"
    return {"hostname": socket.gethostname(), "exit_code": code, "stdout": out, "stderr": err,
            "seconds": round(time.monotonic() - start, 3), "cwd": os.getcwd()}


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def tail(path: str, lines: int) -> dict[str, Any]:
    """The last ``lines`` lines of a file on the node."""
    try:
        with open(path, errors="replace") as f:
            text = "".join(deque(f, maxlen=lines))
        return {"hostname": socket.gethostname(), "path": path, "text": text, "error": None}
    except OSError as exc:
        return {"hostname": socket.gethostname(), "path": path, "text": "",
                "error": f"{exc.strerror or exc}"}


def log_since(path: str, offset: int | None, lines: int, _info: Any = None, limit: int = 1 << 20) -> dict[str, Any]:
    """The complete lines of a file from byte ``offset`` on (None: its last ``lines`` lines), and
    the offset to ask from next time (``skyward logs -f``). A line still being written waits
    for its end; a file that shrank (rotated, truncated) is read again from its start."""
    out: dict[str, Any] = {"hostname": socket.gethostname(), "path": path, "text": "", "offset": offset,
                           "error": None, "restarted": False}
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset is None:
                start = max(0, size - max(limit, lines * 512))
                f.seek(start)
                data = f.read(size - start)
                end = data.rfind(b"\n") + 1
                kept = data[:end].splitlines(keepends=True)
                if start > 0 and kept:
                    kept = kept[1:]  # the first line read may be cut
                out.update(text=b"".join(kept[-lines:] if lines > 0 else []).decode("utf-8", "replace"),
                           offset=start + end)
                return out
            if size < offset:
                offset, out["restarted"] = 0, True
            f.seek(offset)
            data = f.read(limit)
    except OSError as exc:
        out["error"] = exc.strerror or str(exc)
        return out
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == limit:  # one line longer than the limit: give what there is
        end = len(data)
    out.update(text=data[:end].decode("utf-8", "replace"), offset=offset + end)
    return out


def install_locked(lock: str, wheels: dict[str, bytes], sources: list[str], timeout: float,
                   _info: Any = None, *, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Install exactly the packages of ``lock`` (a requirements file of ``name==version`` lines,
    with hashes when every line has some) into this node's live folder (``SKYWARD_SITE``, on
    the workers' path) with uv, no dependency resolution (``skyward install`` resolved them on
    the client). ``wheels``: the client's wheelhouse for nodes with no index (file name ->
    bytes), else uv finds them through ``sources`` (its options) and ``env`` (the index URLs, in
    its environment: never on its argv, which every user of the node can read). Nodes that share the folder (Local) take
    turns; a package already there is not installed again. Never raises: the outcome, the end
    of uv's output, and the versions now in the folder."""
    import fcntl
    import importlib
    import importlib.metadata
    import re
    import shutil
    import sys
    import tempfile

    start = time.monotonic()
    out: dict[str, Any] = {"hostname": socket.gethostname(), "ok": False, "exit_code": None, "output": "",
                           "seconds": 0.0, "versions": {}}
    site = os.environ.get("SKYWARD_SITE")
    if not site or not os.path.isdir(site):
        out["output"] = ("this node's agent takes no packages while it runs (a skyward older than `skyward "
                         "install` started it); stop and start the pool again (`skyward down`, `skyward up`)")
        return out
    uv = os.environ.get("SKYWARD_UV") or shutil.which("uv") or "uv"
    hashed = all(ln.endswith("\\") for ln in lock.splitlines() if ln.strip() and not ln.startswith(" "))
    with open(site + ".lock", "w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        work = tempfile.mkdtemp(prefix=".install-", dir=os.path.dirname(site))
        text = ""
        try:
            with open(os.path.join(work, "lock.txt"), "w") as f:
                f.write(lock)
            for name, data in wheels.items():
                with open(os.path.join(work, os.path.basename(name)), "wb") as w:
                    w.write(data)
            where = ["--no-index", "--find-links", work] if wheels else list(sources)
            cmd = [uv, "pip", "install", "--quiet", "--no-deps", "--target", site, "--python", sys.executable,
                   *(["--require-hashes"] if hashed else []), *where, "-r", os.path.join(work, "lock.txt")]
            settings = {} if wheels else dict(env or {})
            if settings.get("UV_EXTRA_INDEX_URL"):  # the node's own extra indexes too
                urls = [*settings["UV_EXTRA_INDEX_URL"].split(), *os.environ.get("UV_EXTRA_INDEX_URL", "").split()]
                settings["UV_EXTRA_INDEX_URL"] = " ".join(dict.fromkeys(urls))
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  env={**os.environ, **settings, "UV_NO_PROGRESS": "1"})
            out["exit_code"], text = proc.returncode, (proc.stderr or "") + (proc.stdout or "")
        except subprocess.TimeoutExpired as exc:
            out["exit_code"], text = 124, _text(exc.stderr) + f"\n(stopped after {timeout:g} s)"
        except OSError as exc:  # no uv there, a full disk
            text = f"{type(exc).__name__}: {exc} (uv: {uv})"
        finally:
            shutil.rmtree(work, ignore_errors=True)
    importlib.invalidate_caches()  # what landed in the folder is importable from now on
    found = {_canon(d.metadata["Name"] or ""): d.version for d in importlib.metadata.distributions(path=[site])}
    wanted = dict(re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", lock, re.M))
    out["versions"] = {_canon(n): found.get(_canon(n)) for n in wanted}
    out["output"] = "\n".join(text.strip().splitlines()[-20:])
    out["ok"] = out["exit_code"] == 0 and all(found.get(_canon(n)) == v for n, v in wanted.items())
    out["seconds"] = round(time.monotonic() - start, 3)
    return out


def _canon(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()
