"""`ssh`, `scp` and `rsync` reach a named pool's nodes by name: `skyward up` writes an
SSH config entry per node whose ProxyCommand is `skyward proxy`, on real sshd hosts reachable
only through a bastion. ssh checks each node's key against the pool's pin, so a node whose host
key changed is refused; `skyward down` removes the entries."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshhosts import SSHHosts, SSHHostsUnavailable

from .conftest import CLI

pytestmark = pytest.mark.timeout(600)


class Lab:
    def __init__(self, cli: CLI, hosts: SSHHosts, up: str) -> None:
        self.cli, self.hosts, self.up = cli, hosts, up
        self.config = cli.home / "ssh" / "config"

    def ssh(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        # No ~/.ssh/config of this machine and no agent: only the generated entries decide.
        env = {k: v for k, v in self.cli.env.items() if k != "SSH_AUTH_SOCK"}
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=self.cli.cwd, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    hosts = SSHHosts(2, mode="netns", bastion=True, user="auto")
    try:
        hosts.start()
    except SSHHostsUnavailable as exc:
        pytest.skip(f"netns SSH test hosts unavailable: {exc}")
    cli = CLI(tmp_path_factory.mktemp("sshconfig"))
    try:
        targets = json.dumps([f"{h.user}@{h.address}:{h.port}" for h in hosts])
        cli.toml(f'[pools.lab]\nprovider = "ssh"\nnodes = 2\nttl = 300\n\n'
                 f'[pools.lab.ssh]\nhosts = {targets}\nkey = "{hosts[0].key_path}"\n'
                 f'jump = "{hosts.jump}"\nknown_hosts = "{cli.cwd / "known_hosts"}"\n')
        up = cli("up", "lab", "--console", "silent", timeout=300)
        assert up.code == 0, up
        yield Lab(cli, hosts, up.out)
    finally:
        try:
            cli("down", "--all", "--force", timeout=120)
        finally:
            hosts.close()


def test_up_writes_entries_and_says_the_include_line(lab: Lab) -> None:
    assert f"Include {lab.config}" in lab.up and "never edits" in lab.up, lab.up
    assert lab.config.stat().st_mode & 0o077 == 0
    entries = (lab.cli.home / "ssh" / "pools" / "lab.conf").read_text()
    assert "Host lab-0" in entries and "Host lab-1" in entries and "skyward proxy lab 1" in entries
    assert f"User {lab.hosts.user}" in entries and "StrictHostKeyChecking yes" in entries
    # ssh-config for a pool already up writes the same entries again, and says the line too.
    again = lab.cli("ssh-config", "lab")
    assert again.code == 0 and "lab-0, lab-1" in again.out and f"Include {lab.config}" in again.out, again


def test_ssh_scp_and_rsync_reach_the_nodes_by_name_through_the_bastion(lab: Lab, tmp_path: Path) -> None:
    for rank, host in enumerate(lab.hosts):
        done = lab.ssh("ssh", "-F", str(lab.config), f"lab-{rank}", "hostname; id -un")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [host.name, lab.hosts.user], done.stdout
    src = tmp_path / "data.txt"
    src.write_text("through the pool's own route\n")
    sent = lab.ssh("scp", "-F", str(lab.config), str(src), "lab-1:data.txt")
    assert sent.returncode == 0, sent.stderr
    assert lab.ssh("ssh", "-F", str(lab.config), "lab-1", "cat data.txt").stdout == src.read_text()
    if shutil.which("rsync") is None:
        pytest.skip("rsync is not installed here")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.py").write_text("print('a')\n")
    (tree / "b.txt").write_text("b\n")
    pushed = lab.ssh("rsync", "-a", "-e", f"ssh -F {lab.config}", f"{tree}/", "lab-0:tree/")
    assert pushed.returncode == 0, pushed.stderr
    back = tmp_path / "back"
    pulled = lab.ssh("rsync", "-a", "-e", f"ssh -F {lab.config}", "lab-0:tree/", f"{back}/")
    assert pulled.returncode == 0, pulled.stderr
    assert (back / "sub" / "a.py").read_text() == "print('a')\n" and (back / "b.txt").read_text() == "b\n"


def test_a_changed_host_key_is_refused_and_down_removes_the_entries(lab: Lab) -> None:
    # Last in this module: the host restarts with a new key (its agent goes with it).
    lab.hosts[1].restart(new_host_key=True)
    refused = lab.ssh("ssh", "-F", str(lab.config), "lab-1", "hostname")
    assert refused.returncode == 255, refused
    assert "Host key verification failed" in refused.stderr and "lab-1" in refused.stderr, refused.stderr
    assert not refused.stdout
    # The pool's pins were not changed by it: writing the entries again keeps refusing.
    assert lab.cli("ssh-config", "lab").code == 0
    assert lab.ssh("ssh", "-F", str(lab.config), "lab-1", "hostname").returncode == 255
    assert lab.ssh("ssh", "-F", str(lab.config), "lab-0", "hostname").returncode == 0  # the other one
    assert lab.cli("down", "lab", "--force", timeout=120).code == 0
    assert not (lab.cli.home / "ssh" / "pools" / "lab.conf").exists()
    gone = lab.ssh("ssh", "-F", str(lab.config), "lab-0", "hostname")
    assert gone.returncode == 255 and "lab-0" in gone.stderr  # no such host any more
