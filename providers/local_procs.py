"""Which process is which, for Local: a pid with its start time names one process even after the
pid is reused (the Local provider's nodes, and the GPU claims of local_gpus.py)."""

from __future__ import annotations

from pathlib import Path

from skyward.bootstrap.procs import alive


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, it names one process
    even after the pid is reused. None where /proc is missing."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def process_running(pid: int, started: int | None) -> bool:
    """Is this exact process (pid + start time) running? Zombies count as gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): ask the kernel
        return alive(pid)
    if fields[0] == "Z":
        return False
    return started is None or int(fields[19]) == started
