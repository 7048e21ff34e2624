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
