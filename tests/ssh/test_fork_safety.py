"""Fork safety on real sshd hosts: children forked while an SSH pool is open (a
normal exit, os._exit, a multiprocessing fork child) leave the parent's nodes, tunnels and
collections alone and get InheritedPoolError when they use the pool. The Local variant, with
the event bus, the log file and the dashboard hook, is tests/test_fork_safety.py."""

from __future__ import annotations

from pathlib import Path

import fork_program
import pytest
from sshhosts import SSHHosts

pytestmark = pytest.mark.timeout(400)
MODES = ["exit", "os._exit", "mp"]


def test_forked_children_leave_the_parents_ssh_pool_alone(three_hosts: SSHHosts, tmp_path: Path) -> None:
    hosts = [{"address": h.address, "port": h.port, "user": h.user, "key": str(h.key_path)}
             for h in list(three_hosts)[:2]]
    report = fork_program.run(tmp_path, MODES, ssh=hosts, timeout=360)
    fork_program.check(report, MODES)
