"""Options(metrics_port=...): a program without a dashboard serves its pools' Prometheus metrics
, on loopback unless told otherwise, to whoever has the token of
SKYWARD_HOME/metrics/token only (every local user read them)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import skyward as sky
from skyward.errors import ConfigError
from skyward.observe import prometheus


@sky.function
def double(x: int) -> int:
    return x * 2


@sky.function
def broken() -> None:
    raise RuntimeError("no")


def _scrape() -> dict[str, float]:
    address = prometheus.metrics_address()
    assert address is not None
    host, port = address
    assert host == "127.0.0.1"  # loopback unless told otherwise
    request = urllib.request.Request(f"http://{host}:{port}/metrics",
                                     headers={"Authorization": f"Bearer {prometheus.metrics_token()}"})
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("skyward_")}


def test_a_programs_pool_serves_its_metrics_on_the_port_it_was_given() -> None:
    image = sky.Image(metrics=[sky.metrics.CPU(interval=0.2), sky.metrics.Custom("answer", "echo 42", 0.2)])
    options = sky.Options(metrics_port=0, console="silent")
    with sky.Compute(nodes=2, image=image, options=options) as pool:
        assert pool.map(double, range(20), chunksize=5) == [x * 2 for x in range(20)]
        with pytest.raises(RuntimeError):
            broken() >> pool
        from skyward.observe.events import bus

        deadline = time.monotonic() + 10
        while True:
            bus.flush()
            got = _scrape()
            wanted = [f'skyward_node_sample{{metric="answer",node="1",pool="{pool.id}",unit=""}}',
                      *(f'skyward_node_cpu_percent{{node="{n}",pool="{pool.id}"}}' for n in (0, 1))]
            if all(w in got for w in wanted) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        p = pool.id
    assert got[f'skyward_pool_info{{pool="{p}",provider="local"}}'] == 1
    assert got[f'skyward_pool_nodes{{pool="{p}",provider="local",state="ready"}}'] == 2
    assert got[f'skyward_tasks_done_total{{function="double",pool="{p}"}}'] == 20
    assert got[f'skyward_tasks_failed_total{{function="broken",pool="{p}"}}'] == 1
    assert got[f'skyward_tasks_running{{function="double",pool="{p}"}}'] == 0
    assert got[f'skyward_tasks_queued{{function="double",pool="{p}"}}'] == 0
    assert got[f'skyward_task_duration_seconds_count{{function="double",pool="{p}"}}'] == 4  # 4 chunks
    assert got[f'skyward_task_sent_bytes_total{{function="double",pool="{p}"}}'] > 0
    assert got[f'skyward_task_received_bytes_total{{function="double",pool="{p}"}}'] > 0
    assert 0 <= got[f'skyward_node_cpu_percent{{node="0",pool="{p}"}}'] <= 100
    assert got[f'skyward_node_sample{{metric="answer",node="1",pool="{p}",unit=""}}'] == 42
    assert got[f'skyward_pool_hourly_cost_dollars{{pool="{p}",provider="local"}}'] == 0
    # After the pool: its final counts stay, its nodes are gone.
    after = _scrape()
    assert after[f'skyward_tasks_done_total{{function="double",pool="{p}"}}'] == 20
    assert after[f'skyward_pool_nodes{{pool="{p}",provider="local",state="ready"}}'] == 0


@pytest.mark.parametrize("value", [-1, 70000, "host", "host:port", True, 1.5])
def test_a_bad_metrics_port_says_what_to_give(value: object) -> None:
    with pytest.raises(ConfigError, match="metrics_port"):
        sky.Options(metrics_port=value)  # type: ignore[arg-type]


def test_cost_so_far_adds_each_nodes_time() -> None:
    stats = prometheus.PoolStats("p", "aws", hourly_cost=3.6, started=1000.0)
    stats.apply({"type": "InstanceProvisioned", "node": 0, "time": 1000.0})
    stats.apply({"type": "InstanceProvisioned", "node": 1, "time": 1000.0})
    stats.apply({"type": "InstanceDestroyed", "node": 1, "time": 1010.0})  # 2 nodes for 10 s
    assert stats.cost_so_far(now=1020.0) == pytest.approx(3.6 * (2 * 10 + 1 * 10) / 3600)


def test_nodes_of_two_groups_are_series_of_their_own() -> None:
    stats = prometheus.PoolStats("p", "local", started=1000.0)
    for group in ("prep", "train"):
        stats.apply({"type": "InstanceBootstrapped", "node": 0, "group": group, "time": 1000.0})
        stats.apply({"type": "Metric", "node": 0, "group": group, "name": "cpu", "value": 10.0 if group == "prep"
                     else 90.0, "unit": "%", "time": 1001.0})
    assert stats.nodes == {"prep:0": "ready", "train:0": "ready"}
    assert stats.samples[("train:0", "cpu")] == (90.0, "%") and stats.samples[("prep:0", "cpu")] == (10.0, "%")
    stats.apply({"type": "InstanceDestroyed", "node": 0, "group": "prep", "time": 1002.0})
    assert list(stats.nodes) == ["train:0"] and [k for k, _ in stats.samples] == ["train:0"]


_GET = """
import sys, urllib.error, urllib.request
url, token = sys.argv[1], sys.argv[2]
request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
try:
    with urllib.request.urlopen(request, timeout=10) as r:
        print(r.status, len(r.read()))
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode()[:200].replace("\\n", " "))
"""


def test_the_metrics_port_answers_only_the_token() -> None:
    """`Options(metrics_port=)` served pool and function names, costs and node load
    to every local user. Now it wants the token of SKYWARD_HOME/metrics/token, which only the
    user can read; another user (setpriv nobody) is refused, with or without a guess."""
    with sky.Compute(nodes=1, options=sky.Options(metrics_port=0, console="silent")) as pool:
        assert pool.map(double, range(3)) == [0, 2, 4]
        address = prometheus.metrics_address()
        assert address is not None
        url = f"http://{address[0]}:{address[1]}/metrics"
        for headers in ({}, {"Authorization": "Bearer guess"}, {"Authorization": f"Basic {pool.id}"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
            assert refused.value.code == 401, headers
            assert b"skyward_" not in refused.value.read()
        token_file = prometheus.metrics_token_file()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert "skyward_tasks_done_total" in _scrape_text(url, token_file.read_text().strip())
        if os.geteuid() == 0 and shutil.which("setpriv"):
            def as_nobody(*argv: str) -> str:
                out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                      sys.executable, *argv], capture_output=True, text=True, timeout=60)
                return out.stdout.strip() or out.stderr.strip()

            assert as_nobody("-c", _GET, url, "").startswith("401 "), "another user read the metrics"
            assert as_nobody("-c", _GET, url, "guess").startswith("401 ")
            read = as_nobody("-c", "import sys; print(open(sys.argv[1]).read())", str(token_file))
            assert "Permission denied" in read, read  # nor can it read the token


def _scrape_text(url: str, token: str) -> str:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    return str(urllib.request.urlopen(request, timeout=10).read().decode())
