"""Taking a value out of this process's environment block, not only out of ``os.environ``.

On Linux, ``/proc/PID/environ`` is not ``os.environ``: it is the memory the kernel filled with
the environment at ``exec`` (the range ``env_start``..``env_end`` of ``/proc/PID/stat``), which
``os.environ.pop`` (or ``unsetenv``) leaves as it was, and which every forked child copies. The
pool's secret reaches each agent in its environment, so without this a task could read it from
``/proc/self/environ`` or from its agent's. :func:`scrub` overwrites the value of each variable
named with NUL bytes where it lies in that block, in place, through ``/proc/self/mem`` (stdlib
only: the agent's start imports nothing more), or ``ctypes`` where that file cannot be written.
What ``/proc/PID/environ`` shows afterwards is ``NAME=`` and NULs.
"""

from __future__ import annotations

import os

__all__ = ["scrub"]


def scrub(*names: str) -> list[str]:
    """Overwrite the values of the variables ``names`` in this process's environment block.

    Returns the names that were found and overwritten. Call it after the values have been read
    (``os.environ`` is a copy and keeps them, unless popped as well); a process started from
    this one with ``env=None`` would get the overwritten values, so pass ``env`` explicitly.
    Where this is not Linux, or the block cannot be written, nothing happens.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
    except OSError:
        return []
    # Fields after the command's ")": the first is field 3 (state); env_start is field 50.
    fields = stat.rsplit(b")", 1)[1].split()
    try:
        env_start = int(fields[50 - 3])
    except (IndexError, ValueError):
        return []
    done: list[str] = []
    spans: list[tuple[int, int]] = []
    for name in names:
        entry = name.encode() + b"="
        if block.startswith(entry):
            start = len(entry)
        else:
            at = block.find(b"\0" + entry)
            if at == -1:
                continue
            start = at + 1 + len(entry)
        end = block.find(b"\0", start)
        end = len(block) if end == -1 else end
        if end > start:
            spans.append((env_start + start, end - start))
            done.append(name)
    if spans and not _write(spans):
        return []
    return done


def _write(spans: list[tuple[int, int]]) -> bool:
    try:
        fd = os.open("/proc/self/mem", os.O_RDWR)
    except OSError:
        return _write_ctypes(spans)
    try:
        for address, length in spans:
            if os.pwrite(fd, b"\0" * length, address) != length:
                return _write_ctypes(spans)
    except OSError:
        return _write_ctypes(spans)
    finally:
        os.close(fd)
    return True


def _write_ctypes(spans: list[tuple[int, int]]) -> bool:
    try:
        import ctypes

        for address, length in spans:
            ctypes.memset(address, 0, length)
    except Exception:
        return False
    return True
