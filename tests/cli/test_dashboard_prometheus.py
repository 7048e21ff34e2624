"""A real Prometheus server scrapes ``skyward dashboard``'s ``/metrics`` with the bearer token
while a program's pool runs, and its query API returns the pool's task counts.

Prometheus is Debian's ``prometheus`` package (.ci/run installs it); without it the test skips.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import free_port

from .conftest import CLI
from .dashboard_helpers import dashboard, program, wait_for

PROMETHEUS = shutil.which("prometheus")


@contextlib.contextmanager
def prometheus(folder: Path, target: str, token: str) -> Iterator[str]:
    """A Prometheus server scraping ``target`` every second with ``token``; yields its URL and
    stops (and waits for) it whatever happens."""
    assert PROMETHEUS is not None
    folder.mkdir()
    secret = folder / "token"
    secret.write_text(token)
    secret.chmod(0o600)
    config = folder / "prometheus.yml"
    config.write_text(textwrap.dedent(f"""
        global:
          scrape_interval: 1s
        scrape_configs:
          - job_name: skyward
            metrics_path: /metrics
            authorization:
              type: Bearer
              credentials_file: {secret}
            static_configs:
              - targets: ["{target}"]
    """))
    port = free_port()
    log = (folder / "prometheus.log").open("w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


@pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (.ci/run installs it)")
def test_prometheus_scrapes_a_running_pool_through_the_dashboard(cli: CLI, tmp_path: Path) -> None:
    with dashboard(cli) as d:
        # /metrics is behind the token like every other route.
        assert httpx.get(d.base + "/metrics").status_code == 401
        prog = program(cli, """
            import sys, time, skyward as sky

            @sky.function
            def work(x):
                return x * 2

            @sky.function
            def fails():
                raise ValueError("no")

            image = sky.Image(metrics=[sky.metrics.CPU(interval=0.3)])
            with sky.Compute(nodes=2, image=image, options=sky.Options(console="silent")) as pool:
                time.sleep(2.5)  # the hook looks for a dashboard once a second
                pool.map(work, range(12), chunksize=1)
                try:
                    fails() >> pool
                except ValueError:
                    pass
                print("mapped", flush=True)
                sys.stdin.readline()  # hold the pool open until the test has looked
        """)
        try:
            text = wait_for(lambda: (t := d.api("GET", "/metrics").text)
                            and 'skyward_tasks_failed_total{function="fails"' in t and t, 60, "the pool's counts")
            assert d.api("GET", "/metrics").headers["content-type"].startswith("text/plain")
            assert 'skyward_tasks_done_total{function="work"' in text
            assert "skyward_task_duration_seconds_bucket" in text and "skyward_node_cpu_percent" in text
            target = d.base.removeprefix("http://")
            with prometheus(tmp_path / "prom", target, d.token) as prom:
                up = wait_for(lambda: _query(prom, 'up{job="skyward"}') and _query(prom, 'up{job="skyward"}'),
                              60, "a first scrape")
                assert up[0]["value"][1] == "1", up  # the token was accepted
                done = wait_for(lambda: _query(prom, 'skyward_tasks_done_total{function="work"}'), 30, "task counts")
                failed = _query(prom, 'skyward_tasks_failed_total{function="fails"}')
                nodes = _query(prom, 'skyward_pool_nodes{state="ready"}')
                cpu = wait_for(lambda: _query(prom, "skyward_node_cpu_percent"), 30, "node samples")
        finally:
            prog.communicate(timeout=60)
        assert prog.returncode == 0
    assert [float(r["value"][1]) for r in done] == [12.0]
    pool_id = done[0]["metric"]["pool"]
    assert len(pool_id) == 8 and done[0]["metric"]["job"] == "skyward"
    assert [float(r["value"][1]) for r in failed] == [1.0]
    assert [(r["metric"]["pool"], r["metric"]["provider"], r["value"][1]) for r in nodes] == [(pool_id, "local", "2")]
    assert {r["metric"]["node"] for r in cpu} == {"0", "1"}


@pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (.ci/run installs it)")
def test_prometheus_scrapes_a_programs_metrics_port_with_its_token(cli: CLI, tmp_path: Path) -> None:
    """A program's own /metrics answers only the token of SKYWARD_HOME/metrics/token;
    Prometheus is given it as the guide says (``credentials_file``), and without it is refused."""
    prog = program(cli, """
        import json, sys, skyward as sky
        from skyward.observe import prometheus

        @sky.function
        def work(x):
            return x * 2

        with sky.Compute(nodes=1, options=sky.Options(metrics_port=0, console="silent")) as pool:
            pool.map(work, range(7), chunksize=1)
            print(json.dumps(prometheus.metrics_address()), flush=True)
            sys.stdin.readline()  # hold the pool open until the test has looked
    """)
    try:
        assert prog.stdout is not None
        line = prog.stdout.readline()
        assert line, prog.stderr.read() if prog.stderr else ""
        host, port = json.loads(line)
        token = (cli.home / "metrics" / "token").read_text().strip()
        with prometheus(tmp_path / "prom", f"{host}:{port}", token) as prom, \
                prometheus(tmp_path / "guess", f"{host}:{port}", "a-guess") as refused:
            done = wait_for(lambda: _query(prom, 'skyward_tasks_done_total{function="work"}'), 60, "task counts")
            down = wait_for(lambda: _query(refused, 'up{job="skyward"}'), 60, "the refused scrape")
            assert [float(r["value"][1]) for r in done] == [7.0]
            assert down[0]["value"][1] == "0", down  # a wrong token scrapes nothing
            assert _query(refused, "skyward_tasks_done_total") == []
    finally:
        prog.communicate("\n", timeout=60)
    assert prog.returncode == 0
