"""Real sshd hosts for the named-pool tests that run on them (see tests/sshhosts.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sshhosts import SSHHost, SSHHosts, SSHHostsUnavailable


@contextmanager
def netns_hosts(n: int = 2) -> Iterator[SSHHosts]:
    """``n`` hosts in network namespaces, closed at the end; the test skips where they cannot run."""
    hosts = SSHHosts(n, mode="netns")
    try:
        hosts.start()
    except SSHHostsUnavailable as exc:
        pytest.skip(f"SSH test hosts unavailable: {exc}")
    try:
        yield hosts
    finally:
        hosts.close()


def on_host(host: SSHHost, command: str) -> str:
    """Run ``command`` on ``host`` over ssh and return its stdout (a failure raises)."""
    argv = [*host.ssh_argv("/dev/null", strict="no"), command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
