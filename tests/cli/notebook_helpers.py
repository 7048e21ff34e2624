"""``skyward notebook ... --json`` run in the background by the notebook tests (Local, SSH, Slurm)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .conftest import CLI, stop


@contextmanager
def notebook(cli: CLI, *args: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """`skyward notebook ... --json` running (the first start may install the server on the pool:
    the test's timeout bounds the wait) and its one-line announcement; stopped with SIGINT (Ctrl-C)
    and waited for on the way out."""
    proc = cli.start("notebook", *args, "--json")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait(30)
            raise AssertionError(f"skyward notebook did not start: {proc.stderr.read() if proc.stderr else ''}")
        yield proc, json.loads(line)
    finally:
        stop(proc, signal.SIGINT)
