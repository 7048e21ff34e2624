"""SSH config entries of a named pool of several groups: a Local group (no sshd: no entries) and an
SSH group on a real netns host. The SSH group's node gets its entry under its pool-wide rank
(``NAME-N``, numbered group after group as ``--node N`` is), with its group in a comment, and
``ssh NAME-N`` reaches that host through ``skyward proxy``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from sshhosts import SSHHosts

from .conftest import CLI
from .ssh_helpers import netns_hosts

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def mixed(cli: CLI) -> Iterator[tuple[CLI, SSHHosts]]:
    with netns_hosts(1) as hosts:
        targets = json.dumps([f"{h.user}@{h.address}:{h.port}" for h in hosts])
        cli.toml(f'[pools.mix]\nttl = 300\nhead = "work"\n\n'
                 f'[pools.mix.groups.prep]\nnodes = 2\n\n'
                 f'[pools.mix.groups.work]\nprovider = "ssh"\nnodes = 1\n'
                 f'[pools.mix.groups.work.ssh]\nhosts = {targets}\nkey = "{hosts[0].key_path}"\n'
                 f'known_hosts = "{cli.cwd / "known_hosts"}"\n')
        try:
            yield cli, hosts
        finally:
            cli("down", "--all", "--force", timeout=120)


def test_the_ssh_groups_nodes_get_entries_under_their_pool_wide_rank(mixed: tuple[CLI, SSHHosts]) -> None:
    cli, hosts = mixed
    up = cli("up", "mix", "--console", "silent", timeout=300)
    assert up.code == 0, up
    entries = (cli.home / "ssh" / "pools" / "mix.conf").read_text()
    # prep's two Local nodes are ranks 0 and 1 of the pool and have no sshd; work's node is rank 2.
    assert "Host mix-2" in entries and "Host mix-0" not in entries and "Host mix-1" not in entries, entries
    assert "# group 'work', its node 0" in entries and "skyward proxy mix 2" in entries, entries
    again = cli("ssh-config", "mix")
    assert again.code == 0 and "mix-2" in again.out, again
    env = {k: v for k, v in cli.env.items() if k != "SSH_AUTH_SOCK"}
    done = subprocess.run(["ssh", "-F", str(cli.home / "ssh" / "config"), "mix-2", "hostname"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=cli.cwd, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [hosts[0].name], done.stdout
    # The proxy of a rank the pool does not have says what the pool has.
    gone = cli("proxy", "mix", "3")
    assert gone.code != 0 and "3 node(s) across its groups" in gone.err, gone
