"""An asleep named pool on real sshd hosts answers `skyward ssh NAME -- CMD`:
asleep -> woken on a host for the command -> asleep again, the hosts given back."""

from __future__ import annotations

import json
import re

import pytest

from .conftest import CLI
from .ssh_helpers import netns_hosts, on_host


@pytest.mark.timeout(300)
def test_ssh_wakes_an_asleep_ssh_pool_runs_the_command_and_it_sleeps_again(cli: CLI) -> None:
    with netns_hosts(2) as hosts:
        targets = json.dumps([f"{h.user}@{h.address}:{h.port}" for h in hosts])
        cli.toml(f'[pools.lab]\nprovider = "ssh"\nnodes = [0, 2]\nttl = 120\n\n'
                 f'[pools.lab.ssh]\nhosts = {targets}\nkey = "{hosts[0].key_path}"\n')
        assert cli("up", "lab", timeout=180).code == 0
        assert cli.record("lab")["cluster"]["nodes"] == []

        refused = cli("ssh", "lab", "--no-wake", "--", "hostname")
        assert refused.code != 0 and "is asleep" in refused.err and "--no-wake" in refused.err, refused

        ran = cli("ssh", "lab", "--", "hostname", timeout=180)
        assert ran.code == 0 and ran.out.strip() in {h.name for h in hosts}, ran
        assert re.search(r"pool 'lab' woke in \d+\.\d s", ran.err), ran
        record = cli.record("lab")
        assert record["cluster"]["nodes"] == [] and record["asleep_since"], record  # asleep again
        for h in hosts:
            left = on_host(h, "pgrep -af skyward.bootstrap | grep -v pgrep; true")
            assert left.strip() == "", left  # its host given back

        trail = [e["event"] for e in cli("history", "lab", "--json").json()]
        assert trail.count("woke") == 1 and trail.count("asleep") == 1 and "ssh" in trail, trail
        assert cli("down", "lab", timeout=120).code == 0
