"""The node-side Collector, run for real on this (Linux) machine for a second or two."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward.metrics as m
from skyward.bootstrap import metrics as collector_mod
from skyward.bootstrap.metrics import Collector

GiB = 2**30


class Recorder:
    """An emit callback that keeps (time, name, value, unit) for every sample."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, str, float, str]] = []
        self.lock = threading.Lock()

    def __call__(self, name: str, value: float, unit: str) -> None:
        with self.lock:
            self.samples.append((time.monotonic(), name, value, unit))

    def values(self, name: str) -> list[float]:
        with self.lock:
            return [v for _, n, v, _ in self.samples if n == name]

    def names(self) -> set[str]:
        with self.lock:
            return {n for _, n, _, _ in self.samples}


@pytest.fixture
def busy_cpu() -> Iterator[None]:
    """Spin one thread so CPU > 0 is likely (nothing asserts a lower bound)."""
    done = threading.Event()

    def spin() -> None:
        while not done.is_set():
            sum(range(1000))

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    yield
    done.set()
    t.join()


@pytest.fixture
def no_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    # Patch the lookup rather than PATH so the test holds on GPU machines too.
    monkeypatch.setattr(collector_mod, "_nvidia_smi", lambda: None)


def meminfo_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def collector_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "skyward-metrics"]


def run_for(collector: Collector, seconds: float) -> float:
    """Run ``collector`` for ``seconds``; return how long stop() took."""
    collector.start()
    time.sleep(seconds)
    t0 = time.monotonic()
    collector.stop()
    return time.monotonic() - t0


@pytest.mark.usefixtures("busy_cpu", "no_nvidia_smi")
def test_samples_this_machine(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=collector_mod.__name__)
    iv = 0.2
    specs = [
        m.CPU(interval=iv),
        m.Memory(interval=iv),
        m.MemoryUsed(interval=iv),
        m.MemoryTotal(interval=iv),
        m.Disk("/", interval=iv),
        m.NetworkRx(interval=iv),
        m.NetworkTx(interval=iv),
        m.Custom("answer", "echo 42", interval=iv, unit="x"),
        m.Custom("broken", "echo 7; exit 3", interval=iv),
        m.Custom("wordy", "echo no number here", interval=iv),
        *m.Default(interval=iv),  # GPU ones must vanish; CPU/Memory replace nothing new
    ]
    rec = Recorder()
    collector = Collector(m.normalize(specs), rec)
    assert "gpu" not in collector.names and "gpu_memory" not in collector.names
    started = time.monotonic()
    # At least 1.5 s, and on until four CPU samples came (a loaded CI machine, with the spinning
    # thread holding the GIL, fits fewer slots into 1.5 s; missed slots are skipped, not queued).
    collector.start()
    time.sleep(1.5)
    deadline = started + 15.0
    while len(rec.values("cpu")) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    collector.stop()
    stop_took = time.monotonic() - t0

    assert stop_took < 0.5
    assert not collector_threads()

    cpu = rec.values("cpu")
    assert len(cpu) >= 4
    assert all(0.0 <= v <= 100.0 for v in cpu)

    memory = rec.values("memory")
    assert memory and all(0.0 < v <= 100.0 for v in memory)
    used, total = rec.values("memory_used"), rec.values("memory_total")
    machine_total = meminfo_total_bytes() / GiB
    assert used and total
    assert all(0.0 < u < t for u in used for t in total)
    assert all(u < machine_total for u in used)
    assert total[0] == pytest.approx(machine_total)

    disk = rec.values("disk:/")
    usage = shutil.disk_usage("/")
    assert disk and all(0.0 < v <= 100.0 for v in disk)
    assert disk[-1] == pytest.approx(100.0 * usage.used / (usage.used + usage.free), abs=5.0)

    for name in ("net_rx", "net_tx"):
        values = rec.values(name)
        assert values and all(v >= 0.0 for v in values)

    assert rec.values("answer") and set(rec.values("answer")) == {42.0}
    units = {(n, u) for _, n, _, u in rec.samples}
    assert ("answer", "x") in units and ("cpu", "%") in units and ("memory_used", "GB") in units

    # Failing samplers emit nothing, are logged once, and the thread carries on.
    assert not rec.names() & {"broken", "wordy", "gpu", "gpu_memory"}
    failures = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert sum("'broken'" in r.getMessage() for r in failures) == 1
    assert sum("'wordy'" in r.getMessage() for r in failures) == 1
    late = [t for t, n, _, _ in rec.samples if n == "cpu" and t - started > 1.0]
    assert late, "sampling stopped after the first failures"


@pytest.mark.usefixtures("no_nvidia_smi")
def test_first_rate_is_a_real_rate() -> None:
    """A baseline is taken at start, so the first slot (0.5 s) already emits CPU and network
    rates; without one the first value would only come at the second slot (1.0 s)."""
    rec = Recorder()
    collector = Collector([m.CPU(interval=0.5), m.NetworkRx(interval=0.5)], rec)
    started = time.monotonic()
    collector.start()
    deadline = started + 3.0
    while not {"cpu", "net_rx"} <= rec.names() and time.monotonic() < deadline:
        time.sleep(0.02)
    collector.stop()
    assert {"cpu", "net_rx"} <= rec.names()
    first = {n: t - started for t, n, _, _ in reversed(rec.samples)}
    assert 0.45 < first["cpu"] < 0.85
    assert 0.45 < first["net_rx"] < 0.85


def test_gpu_metrics_absent_without_nvidia_smi_on_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no nvidia-smi anywhere
    rec = Recorder()
    collector = Collector([m.GPU(0.1), m.GPUMemory(0.1), m.GPUTemp(0.1), m.Memory(0.1)], rec)
    assert collector.names == ("memory",)
    run_for(collector, 0.5)
    assert rec.names() == {"memory"}


def fake_nvidia_smi(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f'#!/bin/sh\necho call >> "{tmp_path}/calls"\n{body}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return tmp_path / "calls"


def test_gpu_metrics_share_one_nvidia_smi_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = fake_nvidia_smi(tmp_path, "printf '50, 1024, 4096, 60\\n30, 3072, 4096, 70\\n'")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    rec = Recorder()
    specs = [m.GPU(0.2), m.GPUMemory(0.2), m.GPUMemoryTotal(0.2), m.GPUTemp(0.2)]
    collector = Collector(specs, rec)
    run_for(collector, 1.1)

    assert set(rec.values("gpu")) == {40.0}  # mean utilisation
    assert set(rec.values("gpu_memory")) == {50.0}  # mean of 25 % and 75 %
    assert set(rec.values("gpu_memory_total")) == {8.0}  # 8192 MiB summed = 8 GB
    assert set(rec.values("gpu_temp")) == {65.0}
    ticks = len(rec.values("gpu"))
    assert ticks >= 3
    assert all(len(rec.values(s.name)) == ticks for s in specs)
    assert len(calls.read_text().splitlines()) == ticks  # one call per tick, not per metric


def test_failing_nvidia_smi_is_called_once_per_tick(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = fake_nvidia_smi(tmp_path, "echo 'NVIDIA-SMI has failed' ; exit 9")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    rec = Recorder()
    collector = Collector([m.GPU(0.2), m.GPUMemory(0.2), m.Memory(0.2)], rec)
    run_for(collector, 0.9)
    assert rec.names() == {"memory"}
    n_calls = len(calls.read_text().splitlines())
    assert 1 <= n_calls <= len(rec.values("memory")) + 1


def sleepers(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            pids.append(int(proc.name))
    return pids


@pytest.mark.usefixtures("no_nvidia_smi")
def test_stop_is_prompt_and_kills_a_running_custom_command() -> None:
    marker = "30.4817"
    rec = Recorder()
    # The shell does not exec sleep (a command follows it), so sleep is a grandchild: killing
    # only the shell would leave it behind.
    collector = Collector([m.Custom("slow", f"sleep {marker}; echo 1", interval=0.05)], rec)
    collector.start()
    deadline = time.monotonic() + 3.0
    while not sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sleepers(marker), "the custom command never started"
    t0 = time.monotonic()
    collector.stop()
    assert time.monotonic() - t0 < 0.5
    assert not collector_threads()
    deadline = time.monotonic() + 2.0
    while sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not sleepers(marker)
    assert rec.samples == []


@pytest.mark.usefixtures("no_nvidia_smi")
def test_custom_command_timeout_skips_the_sample_and_carries_on() -> None:
    rec = Recorder()
    # interval 0.1 -> timeout clamped up to 1 s; "sleep 3" outlives it.
    collector = Collector([m.Custom("slow", "sleep 3; echo 1", interval=0.1), m.Memory(0.1)], rec)
    run_for(collector, 1.6)
    assert "slow" not in rec.names()
    assert any(n == "memory" for _, n, _, _ in rec.samples)


@pytest.mark.usefixtures("no_nvidia_smi")
def test_an_emit_that_raises_does_not_kill_the_thread() -> None:
    rec = Recorder()

    def emit(name: str, value: float, unit: str) -> None:
        if name == "cpu":
            raise BrokenPipeError("agent connection closed")
        rec(name, value, unit)

    collector = Collector([m.CPU(0.1), m.Memory(0.1)], emit)
    run_for(collector, 0.6)
    assert len(rec.values("memory")) >= 3


def test_lifecycle() -> None:
    rec = Recorder()
    empty = Collector([], rec)
    empty.start()  # nothing to sample: no thread
    assert not collector_threads()
    empty.stop()

    collector = Collector([m.Memory(0.1)], rec)
    collector.stop()  # before start: harmless
    with pytest.raises(RuntimeError, match="new one"):
        collector.start()

    collector = Collector([m.Memory(0.1)], rec)
    collector.start()
    collector.start()  # idempotent while running
    assert len(collector_threads()) == 1
    assert collector_threads()[0].daemon
    collector.stop()
    collector.stop()
    assert not collector_threads()


def test_a_node_builds_its_collector_from_the_pools_configuration_as_the_client_wrote_it() -> None:
    """CONFIGURE carries sky.metrics.to_config's dicts; the node reads them without
    sky.metrics (node_specs) into the same metrics: names, kinds, intervals, units, params."""
    specs = (m.CPU(interval=0.5), m.Disk("/", interval=2.0), m.Custom("depth", "echo 3", unit="jobs"),
             m.MemoryUsed())
    node = collector_mod.node_specs(m.to_config(specs))
    assert [(s.name, s.kind, s.interval, s.unit) for s in node] == [(s.name, s.kind, s.interval, s.unit) for s in specs]
    assert node[1].param("path") == "/" and node[2].param("command") == "echo 3" and node[0].param("x", "d") == "d"
    assert Collector(node, Recorder()).names == Collector(specs, Recorder()).names


def test_the_nodes_metrics_start_imports_no_more_than_it_needs() -> None:
    """Every node starts its collector right after the pool is configured, beside the first
    tasks: it must not import sky.metrics (dataclasses and inspect: 14 ms of a node's CPU), nor
    subprocess, logging or shutil before a command runs or a metric fails."""
    import json
    import subprocess
    import sys

    code = ("import sys, json\n"
            "from skyward.bootstrap.metrics import Collector, node_specs\n"
            "before = set(sys.modules)\n"
            "config = [{'name': 'cpu', 'kind': 'cpu', 'interval': 0.05, 'unit': '%', 'params': {}},\n"
            "          {'name': 'disk', 'kind': 'disk', 'interval': 0.05, 'unit': '%', 'params': {'path': '/'}}]\n"
            "got = []\n"
            "c = Collector(node_specs(config), lambda *a: got.append(a)); c.start()\n"
            "import time; time.sleep(0.3); c.stop()\n"
            "print(json.dumps({'new': sorted(set(sys.modules) - before), 'all': sorted(sys.modules),\n"
            "                  'names': sorted({a[0] for a in got})}))\n")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    timeout=60).stdout)
    assert out["names"] == ["cpu", "disk"], out["names"]  # (it did sample)
    heavy = {"skyward.metrics", "dataclasses", "inspect", "subprocess", "logging", "shutil", "tempfile"}
    assert not heavy & set(out["all"]), sorted(heavy & set(out["all"]))


@pytest.mark.usefixtures("no_nvidia_smi")
def test_the_samples_due_together_end_with_one_after_tick() -> None:
    """The agent sends a tick's samples in one frame: ``after_tick`` comes once per tick, after
    every sample due then (CPU and memory on the same interval: both, then the call)."""
    events: list[str] = []
    lock = threading.Lock()

    def emit(name: str, value: float, unit: str) -> None:
        with lock:
            events.append(name)

    def after_tick() -> None:
        with lock:
            events.append("|")

    collector = Collector([m.CPU(0.1), m.Memory(0.1)], emit, after_tick)
    run_for(collector, 0.65)
    with lock:
        ticks = "".join(e if e == "|" else e[0] for e in events).split("|")  # (the last: a tick cut short)
    assert len(ticks) >= 4 and all(sorted(t) == ["c", "m"] for t in ticks[:-1]), events
