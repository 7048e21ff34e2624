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
