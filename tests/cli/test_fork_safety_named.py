"""Fork safety with a named pool: a program attached to a pool that `skyward up`
started forks children while attached; none of them detaches it, cuts its connections or
touches its registry entry, and each gets InheritedPoolError when it uses the pool. (The Local
and sshd variants are tests/test_fork_safety.py and tests/ssh/test_fork_safety.py.)"""

from __future__ import annotations

import fork_program
import pytest

from .conftest import CLI

pytestmark = pytest.mark.timeout(240)
MODES = ["exit", "os._exit", "mp"]


def test_forked_children_leave_an_attached_named_pool_running_and_registered(cli: CLI) -> None:
    up = cli("up", "forky", "--provider", "local", "--nodes", "2", "--ttl", "120")
    assert up.code == 0, up
    before = cli.record("forky")
    report = fork_program.run(cli.cwd, MODES, name="forky", env=cli.env)
    fork_program.check(report, MODES, name="forky")
    status = cli("status", "forky", "--json")
    assert status.code == 0, status
    assert status.json()["state"] == "running", status
    after = cli.record("forky")
    assert after["cluster"] == before["cluster"], "the pool's nodes changed"
    assert after["clients"] == [], "the attached program's client entry was not dropped by it"
    assert cli("down", "forky").code == 0
