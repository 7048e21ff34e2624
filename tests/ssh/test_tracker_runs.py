"""Offline tracker runs written on SSH nodes come back before the nodes go: the
W&B plugin's hand-back, as the pool's block ends, over the pool's own SSH connections (the copy
of ``skyward cp``, through ``nodeaccess.pool_nodes``). Real sshd hosts (tests/sshhosts.py); the
nodes need no W&B: each makes a run folder as W&B lays one out (with the link to a log outside
it that W&B makes), and the plugin's own node-side part names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sshhosts import SSHHosts

import skyward as sky
from skyward.plugins import trackers

pytestmark = pytest.mark.timeout(300)


def provider(hosts: SSHHosts) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts])


def test_offline_runs_of_ssh_nodes_come_back_before_they_go(
        ssh_hosts: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    hosts = ssh_hosts(2)

    def a_run_on_the_node(failed: bool, processes: int = 1) -> dict[str, Any]:
        """On the node, in place of the finishing task (defined here: it travels by value): an
        offline run in the node's own folder, then what the plugin's node-side part answers."""
        import os

        node = sky.instance_info().node
        folder = os.path.join(os.getcwd(), "wandb", f"offline-run-20260101_000000-node{node}")
        os.makedirs(os.path.join(folder, "logs"), exist_ok=True)
        with open(os.path.join(folder, f"run-node{node}.wandb"), "w") as f:
            f.write(f"the run of node {node}")
        os.makedirs(os.path.expanduser("~/.cache/wandb/logs"), exist_ok=True)
        outside = os.path.expanduser("~/.cache/wandb/logs/core-debug.log")
        with open(outside, "w") as f:
            f.write("core log")
        os.symlink(outside, os.path.join(folder, "logs", "debug-core.log"))
        trackers._wandb_home[:] = [os.path.dirname(folder)]
        return trackers.wandb_close(failed, processes)

    monkeypatch.setattr(trackers, "wandb_close", a_run_on_the_node)
    with sky.Compute(provider=provider(hosts), nodes=2, options=sky.Options(console=False)) as pool:
        trackers._wandb_hand_back(pool, {"node_dir": None, "back_to": str(tmp_path)}, False)
    home = tmp_path / "wandb"
    for node in (0, 1):
        folder = home / f"offline-run-20260101_000000-node{node}"
        assert (folder / f"run-node{node}.wandb").read_text() == f"the run of node {node}"
        log = folder / "logs" / "debug-core.log"
        assert not log.is_symlink() and log.read_text() == "core log"  # the link became the file
    line = [x for x in capfd.readouterr().err.splitlines() if x.startswith("skyward: W&B:")]
    assert len(line) == 1 and "brought back from its nodes" in line[0], line
    assert "wandb sync " + " ".join(str(home / f"offline-run-20260101_000000-node{n}") for n in (0, 1)) in line[0]
