"""Fixtures giving tests real sshd hosts (see tests/sshhosts.py for how they are isolated)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sshhosts import Mode, SSHHosts, SSHHostsUnavailable


def _started(hosts: SSHHosts) -> SSHHosts:
    try:
        hosts.start()  # cleans up after itself if it fails half way
    except SSHHostsUnavailable as e:
        pytest.skip(f"SSH test hosts unavailable: {e}")
    return hosts


@pytest.fixture
def ssh_hosts() -> Iterator[Callable[..., SSHHosts]]:
    """Factory: ssh_hosts(n, mode="auto", **options) -> started SSHHosts, closed at test end.

    mode="netns" skips unless this machine can run namespaced hosts (root)."""
    made: list[SSHHosts] = []

    def make(n: int = 3, *, mode: Mode = "auto", **options: Any) -> SSHHosts:
        hosts = SSHHosts(n, mode=mode, **options)
        made.append(hosts)  # registered before start, so even a half-done setup is closed
        return _started(hosts)

    try:
        yield make
    finally:
        # Close every set even if one fails to close; report the first failure.
        errors: list[BaseException] = []
        for hosts in reversed(made):
            try:
                hosts.close()
            except BaseException as e:
                errors.append(e)
        if errors:
            raise errors[0]


@pytest.fixture(scope="module")
def three_hosts() -> Iterator[SSHHosts]:
    """Three hosts shared by a module's tests (netns when possible, else loopback)."""
    hosts = SSHHosts(3)
    try:
        yield _started(hosts)
    finally:
        hosts.close()


@pytest.fixture(scope="module")
def shared_home_hosts() -> Iterator[SSHHosts]:
    """Three hosts with one home shared by all (NFS-like; hosts.shared_home_dir on the client)."""
    hosts = SSHHosts(3, shared_home=True)
    try:
        yield _started(hosts)
    finally:
        hosts.close()


@pytest.fixture(scope="module")
def bastion_hosts() -> Iterator[SSHHosts]:
    """Two hosts reachable only through a jump host (hosts.bastion, hosts.jump,
    hosts.write_ssh_config); skips unless namespaced hosts can run (root)."""
    hosts = SSHHosts(2, bastion=True)
    try:
        yield _started(hosts)
    finally:
        hosts.close()
