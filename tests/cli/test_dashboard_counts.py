"""Every task and item of a program reaches ``skyward dashboard``'s ``/metrics``: a program
attached to a named Local pool maps at once and exits right after, and the dashboard still
counts all of its items and tasks (the real server, the real pool, the real program)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from .conftest import CLI
from .dashboard_helpers import dashboard, wait_for

PROGRAM = """
    import skyward as sky

    @sky.function
    def double(x):
        return 2 * x

    @sky.function
    def one():
        return 1

    with sky.Compute(name="counted", options=sky.Options(console="silent")) as pool:
        assert pool.map(double, range(500), chunksize=50) == [2 * x for x in range(500)]
        assert one() >> pool == 1
"""


def _series(text: str, metric: str, function: str) -> float | None:
    match = re.search(rf'^{metric}\{{function="{function}",pool="counted"\}} (\S+)$', text, re.M)
    return None if match is None else float(match[1])


def test_a_program_that_exits_right_after_its_map_is_counted_whole(cli: CLI) -> None:
    up = cli("up", "counted", "--provider", "local", "--nodes", "2", "--ttl", "120")
    assert up.code == 0, up
    with dashboard(cli) as d:
        for run in (1, 2):  # the program ends at once, each time: nothing waits for the hook
            ran = cli.python(PROGRAM)
            assert ran.code == 0, ran

            def counted(run: int = run) -> str | None:
                text = d.api("GET", "/metrics").text
                done = _series(text, "skyward_tasks_done_total", "one")
                return text if done == run else None

            text = wait_for(counted, 30, f"program {run}'s call on /metrics")
            assert _series(text, "skyward_tasks_done_total", "double") == 500 * run
            assert _series(text, "skyward_task_duration_seconds_count", "double") == 10 * run  # chunks
            assert _series(text, "skyward_task_duration_seconds_count", "one") == run
            assert _series(text, "skyward_tasks_running", "double") == 0
            assert _series(text, "skyward_tasks_queued", "double") == 0
