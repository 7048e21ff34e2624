"""A real Slurm cluster for the sky.Slurm tests: four netns SSH hosts sharing one home (as a
Slurm site's home is shared), a login user who is not root, host 0 the login node and hosts 1-3
the compute nodes (tests/slurmcluster.py). One cluster per test module: it starts in ~3 s."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from slurmcluster import SlurmCluster, SlurmUnavailable, unavailable_reason
from sshhosts import SSHHosts, SSHHostsUnavailable

import skyward as sky


class Site:
    """The hosts, the cluster and how a test reaches them."""

    def __init__(self, hosts: SSHHosts, cluster: SlurmCluster, known_hosts: str) -> None:
        self.hosts = hosts
        self.cluster = cluster
        self.login = hosts[0]
        self.compute = cluster.compute
        self.known_hosts = known_hosts

    def provider(self, **kw: Any) -> sky.Slurm:
        return sky.Slurm(f"{self.login.user}@{self.login.address}", key=str(self.hosts.client_key),
                         known_hosts=self.known_hosts, **kw)

    def on_login(self, command: str, timeout: float = 60) -> str:
        """A command on the login node, as the site's user (a shell the way the user has one)."""
        argv = [*self.login.ssh_argv("/dev/null", strict="no"), command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True).stdout

    def muxes(self) -> list[str]:
        """The pids of the multiplexers running on the login node (bootstrap/mux.py)."""
        return self.on_login("pgrep -f '[s]kyward[.]bootstrap[.]mux' || true").split()


@contextlib.contextmanager
def open_site(tmp_path_factory: pytest.TempPathFactory, hosts: int = 4, **options: Any) -> Iterator[Site]:
    """A cluster on ``hosts`` netns SSH hosts sharing one home (``options``: SSHHosts' own, such
    as sshd_options), skipping the test where it cannot run; everything goes at the end."""
    why = unavailable_reason()
    if why is not None:
        pytest.skip(why)
    fleet = SSHHosts(hosts, shared_home=True, user="auto", **options)
    try:
        try:
            fleet.start()
        except SSHHostsUnavailable as exc:
            pytest.skip(f"SSH test hosts unavailable: {exc}")
        cluster = SlurmCluster(fleet)
        try:
            try:
                cluster.start()
            except SlurmUnavailable as exc:
                pytest.skip(str(exc))
            known = str(tmp_path_factory.mktemp("slurm-known") / "known_hosts")
            yield Site(fleet, cluster, known)
        finally:
            cluster.close()
    finally:
        fleet.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with open_site(tmp_path_factory) as made:
        yield made
