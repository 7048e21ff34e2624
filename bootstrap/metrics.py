"""Node-side metric sampling: one daemon thread that samples ``Spec``s and hands each value
to a callback.

The agent builds one :class:`Collector` per node, from the pool's configuration as
``sky.metrics.to_config`` wrote it (``node_specs``: the client checked the specs already)::

    collector = Collector(node_specs(cfg), emit=lambda name, value, unit: send(...))
    collector.start()
    ...
    collector.stop()

Standard library only (this runs inside the agent on bare nodes) and Linux only: values come
from /proc, ``statvfs``, ``nvidia-smi`` and shell commands. Nothing here raises out of
the thread: a sample that fails is skipped (its metric's first failure is logged at debug level,
later ones are not, so a broken metric cannot flood the log) and the next one is tried as usual.

It imports little (every node starts it right after the pool is configured, beside the pool's
first tasks): not ``skyward.metrics`` (dataclasses and inspect, 14 ms), and ``subprocess`` and
``logging`` only when a GPU or custom metric runs a command, or a metric fails.
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["GPU_KINDS", "Collector", "node_specs"]

# Kinds whose values come from nvidia-smi; the collector drops them where it is missing.
GPU_KINDS: frozenset[str] = frozenset({"gpu", "gpu_memory", "gpu_memory_total", "gpu_temp"})


class Spec(Protocol):
    """What the collector reads of a metric (sky.metrics.MetricSpec has it, and _NodeSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def interval(self) -> float: ...
    @property
    def unit(self) -> str: ...
    def param(self, key: str, default: str = "") -> str: ...


class _NodeSpec:
    """One metric of the pool's configuration, as the node reads it."""

    __slots__ = ("interval", "kind", "name", "params", "unit")

    def __init__(self, entry: dict[str, Any]) -> None:
        self.name = str(entry["name"])
        self.kind = str(entry["kind"])
        self.interval = float(entry.get("interval", 1.0))
        self.unit = str(entry.get("unit", ""))
        self.params = {str(k): str(v) for k, v in (entry.get("params") or {}).items()}

    def param(self, key: str, default: str = "") -> str:
        return self.params.get(key, default)


def node_specs(config: Sequence[dict[str, Any]]) -> list[Spec]:
    """The metrics of ``sky.metrics.to_config``'s output (what CONFIGURE carries)."""
    return [_NodeSpec(entry) for entry in config]


def _debug(message: str, *args: Any, exc_info: Any = None) -> None:
    import logging  # (only when a metric fails: the agent has no other use for it)

    logging.getLogger(__name__).debug(message, *args, exc_info=exc_info)

Emit = Callable[[str, float, str], None]

_GiB = float(2**30)
_MiB = float(2**20)

# Metrics due within this much of each other are sampled in the same wake-up, so GPU metrics
# with equal intervals share one nvidia-smi call even when float rounding differs by a hair.
_SLACK = 0.005

# nvidia-smi normally answers in well under a second; a hung driver must not stall the thread.
_NVIDIA_SMI_TIMEOUT = 5.0

_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


class _Sampler(Protocol):
    def prime(self) -> None:
        """Take the baseline reading a rate needs; called once when the thread starts."""

    def sample(self, tick: _Tick) -> float | None:
        """The current value, or None when there is nothing to report this time."""


class _Tick:
    """What the metrics sampled in one wake-up share: one nvidia-smi result at most."""

    __slots__ = ("gpu", "gpu_error")

    def __init__(self) -> None:
        self.gpu: list[tuple[float, float, float, float]] | None = None
        # A failed query is failed for every GPU metric of the tick: no second call to retry it.
        self.gpu_error: Exception | None = None


class _Stopped(Exception):
    """The collector is stopping; abandon the sample in progress."""


# --- CPU ---------------------------------------------------------------------------------------


def _read_cpu() -> tuple[int, int]:
    """(busy, total) jiffies summed over all cores, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    if not fields or fields[0] != "cpu":
        raise ValueError(f"unexpected first line of /proc/stat: {fields!r}")
    # user nice system idle iowait irq softirq steal [guest guest_nice]; guest time is already
    # counted in user and nice, so only the first eight add up to the total.
    values = [int(v) for v in fields[1:9]]
    total = sum(values)
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return total - idle, total


class _CpuSampler:
    """Share of all CPU time since the last sample that was not idle or iowait, in %.

    100 means every core was busy for the whole interval (not 100 per core as top shows it),
    so one busy thread on an 8-core node reads about 12.5.
    """

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None

    def prime(self) -> None:
        self._last = _read_cpu()

    def sample(self, tick: _Tick) -> float | None:
        busy, total = _read_cpu()
        last, self._last = self._last, (busy, total)
        if last is None:
            return None
        d_total = total - last[1]
        if d_total <= 0:
            return None  # two reads within one jiffy: no rate to report yet
        return min(100.0, max(0.0, 100.0 * (busy - last[0]) / d_total))


# --- memory ------------------------------------------------------------------------------------


def _read_meminfo() -> tuple[int, int]:
    """(total, available) bytes from /proc/meminfo."""
    values: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                values[key] = int(parts[0]) * 1024  # meminfo's "kB" are KiB
    total = values["MemTotal"]
    available = values.get("MemAvailable")
    if available is None:
        # Kernels before 3.14 lack MemAvailable; this is the estimate it replaced.
        available = values.get("MemFree", 0) + values.get("Buffers", 0) + values.get("Cached", 0)
    return total, available


class _MemorySampler:
    def __init__(self, kind: str) -> None:
        self._kind = kind

    def prime(self) -> None:
        pass

    def sample(self, tick: _Tick) -> float | None:
        total, available = _read_meminfo()
        used = max(0, total - available)
        if self._kind == "memory":
            return 100.0 * used / total if total else None
        if self._kind == "memory_used":
            return used / _GiB
        return total / _GiB


# --- disk --------------------------------------------------------------------------------------


class _DiskSampler:
    def __init__(self, path: str) -> None:
        self._path = path

    def prime(self) -> None:
        pass

    def sample(self, tick: _Tick) -> float | None:
        st = os.statvfs(self._path)  # (what shutil.disk_usage reads)
        used, free = (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize
        # df's Use%: free here is what unprivileged users may still write (root's reserve is
        # excluded), so 100 means "full" as users experience it.
        room = used + free
        return 100.0 * used / room if room else None


# --- network -----------------------------------------------------------------------------------


def _read_net(column: int) -> int:
    """Bytes summed over all interfaces but lo: column 0 is received, 8 is sent."""
    total = 0
    with open("/proc/net/dev") as f:
        for line in f:
            name, sep, rest = line.partition(":")
            if not sep or name.strip() == "lo":
                continue  # the two header lines have no colon
            fields = rest.split()
            if len(fields) > column and fields[column].isdigit():
                total += int(fields[column])
    return total


class _NetSampler:
    """Bytes per second since the last sample, in MB/s (2**20 bytes)."""

    def __init__(self, column: int) -> None:
        self._column = column
        self._last: tuple[float, int] | None = None

    def prime(self) -> None:
        self._last = (time.monotonic(), _read_net(self._column))

    def sample(self, tick: _Tick) -> float | None:
        now, count = time.monotonic(), _read_net(self._column)
        last, self._last = self._last, (now, count)
        if last is None or now <= last[0]:
            return None
        # An interface that went away takes its counters with it; report 0, not a negative rate.
        return max(0, count - last[1]) / (now - last[0]) / _MiB


# --- GPU ---------------------------------------------------------------------------------------


def _nvidia_smi() -> str | None:
    """Path to nvidia-smi, or None where it is not on PATH (tests monkeypatch this or PATH). As
    shutil.which looks (shutil's import is a tenth of the agent's start on a node)."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or os.curdir, "nvidia-smi")
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def _query_gpus(exe: str) -> list[tuple[float, float, float, float]]:
    """(utilisation %, memory used MiB, memory total MiB, temperature C) per GPU of this node:
    on a Local node, only its own (SKYWARD_GPUS, which sky.Local sets beside CUDA_VISIBLE_DEVICES:
    nvidia-smi does not read the latter), else every GPU of the machine. The node's own are
    picked here by index or UUID from every GPU's row (``--id`` takes one GPU on older drivers)."""
    import subprocess

    own = {d.strip() for d in os.environ.get("SKYWARD_GPUS", "").split(",") if d.strip()}
    out = subprocess.run(
        [
            exe,
            "--query-gpu=utilization.gpu,memory.used,memory.total,temperature.gpu"
            + (",index,uuid" if own else ""),
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        timeout=_NVIDIA_SMI_TIMEOUT,
        check=True,
    ).stdout
    gpus: list[tuple[float, float, float, float]] = []
    for line in out.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if own:
            if len(values) != 6:
                raise ValueError(f"nvidia-smi printed {line!r}, expected 4 numbers, an index and a UUID")
            if values[4] not in own and values[5] not in own:
                continue
            values = values[:4]
        fields = [float(v) for v in values]  # "[N/A]" raises: the sample is skipped
        if len(fields) != 4:
            raise ValueError(f"nvidia-smi printed {line!r}, expected 4 comma-separated numbers")
        gpus.append((fields[0], fields[1], fields[2], fields[3]))
    if not gpus:
        among = f" among this node's ({', '.join(sorted(own))})" if own else ""
        raise ValueError(f"nvidia-smi listed no GPUs{among}")
    return gpus


class _GpuSampler:
    def __init__(self, kind: str, exe: str) -> None:
        self._kind = kind
        self._exe = exe

    def prime(self) -> None:
        pass

    def sample(self, tick: _Tick) -> float | None:
        if tick.gpu_error is not None:
            raise tick.gpu_error
        if tick.gpu is None:
            try:
                tick.gpu = _query_gpus(self._exe)  # shared by every GPU metric due in this tick
            except Exception as exc:
                tick.gpu_error = exc
                raise
        gpus = tick.gpu
        if self._kind == "gpu":
            return sum(g[0] for g in gpus) / len(gpus)
        if self._kind == "gpu_memory":
            return sum(100.0 * g[1] / g[2] if g[2] else 0.0 for g in gpus) / len(gpus)
        if self._kind == "gpu_memory_total":
            return sum(g[2] for g in gpus) * _MiB / _GiB
        return sum(g[3] for g in gpus) / len(gpus)


# --- custom ------------------------------------------------------------------------------------


class _CustomSampler:
    """Runs a shell command; the value is the first number in its stdout."""

    def __init__(self, command: str, interval: float, stopping: threading.Event) -> None:
        self._command = command
        # A command slower than its interval could never keep up, and while it runs the other
        # metrics wait (one thread), so the timeout is the interval, clamped to 1..10 s.
        self._timeout = min(max(interval, 1.0), 10.0)
        self._stopping = stopping

    def prime(self) -> None:
        pass

    def sample(self, tick: _Tick) -> float | None:
        import subprocess

        # Popen rather than subprocess.run: the command gets its own process group so a timeout
        # or stop() kills everything it started (run() kills only the shell, and a grandchild
        # still holding stdout would keep run() waiting), and stop() need not wait for it.
        proc = subprocess.Popen(
            self._command,
            shell=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        deadline = time.monotonic() + self._timeout
        try:
            while True:
                try:
                    out, _ = proc.communicate(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    if self._stopping.is_set():
                        raise _Stopped() from None
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"command {self._command!r} ran longer than {self._timeout:g} s"
                        ) from None
        finally:
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    proc.communicate(timeout=1.0)
                except subprocess.TimeoutExpired:
                    # Something that left the group (setsid) still holds stdout: stop reading.
                    if proc.stdout is not None:
                        proc.stdout.close()
                    proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"command {self._command!r} exited with {proc.returncode}")
        match = _NUMBER.search(out)
        if match is None:
            raise ValueError(f"command {self._command!r} printed no number: {out[:200]!r}")
        value = float(match.group())
        return value if math.isfinite(value) else None


# --- the collector -----------------------------------------------------------------------------


class Collector:
    """Samples ``specs`` on one daemon thread and calls ``emit(name, value, unit)`` per sample,
    then ``after_tick()`` (when given) once the samples due together are all taken: the agent
    sends them in one frame.

    The thread sleeps until the next metric is due, samples every metric due then (metrics on
    the same interval are sampled together) and goes back to sleep. Each metric keeps its own
    schedule ``start + k * interval``; a sample that overruns skips the missed slots rather than
    bursting to catch up. ``emit`` is called on the collector's thread; it should be quick and
    thread-safe (e.g. put a frame on a queue or a locked writer). An exception from ``emit`` is
    treated like a failed sample.

    GPU metrics are dropped at construction when nvidia-smi is not on PATH. Rates (CPU,
    network) take a baseline when the thread starts, so the first value emitted is a real rate
    over one interval. A Collector runs once: start() it, stop() it, make a new one to restart.
    """

    def __init__(self, specs: Sequence[Spec], emit: Emit, after_tick: Callable[[], None] | None = None) -> None:
        self._emit = emit
        self._after_tick = after_tick
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: set[str] = set()
        nvidia_smi = _nvidia_smi()
        self._metrics: list[tuple[Spec, _Sampler]] = []
        for spec in specs:
            if spec.kind in GPU_KINDS and nvidia_smi is None:
                continue  # documented: GPU metrics are absent where there is no nvidia-smi
            self._metrics.append((spec, self._sampler(spec, nvidia_smi)))

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the metrics this collector will emit (GPU ones dropped without nvidia-smi)."""
        return tuple(spec.name for spec, _ in self._metrics)

    def _sampler(self, spec: Spec, nvidia_smi: str | None) -> _Sampler:
        kind = spec.kind
        if kind == "cpu":
            return _CpuSampler()
        if kind in ("memory", "memory_used", "memory_total"):
            return _MemorySampler(kind)
        if kind == "disk":
            return _DiskSampler(spec.param("path"))
        if kind in ("net_rx", "net_tx"):
            return _NetSampler(0 if kind == "net_rx" else 8)
        if kind in GPU_KINDS:
            assert nvidia_smi is not None
            return _GpuSampler(kind, nvidia_smi)
        if kind == "custom":
            return _CustomSampler(spec.param("command"), spec.interval, self._stopping)
        raise AssertionError(f"no sampler for metric kind {kind!r}")  # (the client validated the kinds: sky.metrics.MetricSpec)

    def start(self) -> None:
        """Start the sampling thread; returns at once. Does nothing if already started or if
        there is nothing to sample."""
        if self._stopping.is_set():
            raise RuntimeError("this Collector was stopped; create a new one to sample again")
        if self._thread is not None or not self._metrics:
            return
        self._thread = threading.Thread(target=self._run, name="skyward-metrics", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop sampling and wait up to ``timeout`` seconds for the thread to end. A Custom
        command in progress is killed; no ``emit`` happens after this returns (unless the
        thread outlived the timeout, which only a stuck /proc or nvidia-smi read could cause)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:  # the thread must never die loudly; the agent keeps serving
            _debug("metrics collector stopped on an unexpected error", exc_info=True)

    def _loop(self) -> None:
        for spec, sampler in self._metrics:
            try:
                sampler.prime()
            except Exception as exc:
                self._failure(spec, exc)
        start = time.monotonic()
        # per metric: how many intervals after start its next sample is due
        slots = [1] * len(self._metrics)
        while not self._stopping.is_set():
            dues = [
                start + k * spec.interval for k, (spec, _) in zip(slots, self._metrics, strict=True)
            ]
            wait = min(dues) - time.monotonic()
            if wait > 0 and self._stopping.wait(wait):
                return
            now = time.monotonic()
            tick = _Tick()
            for i, (spec, sampler) in enumerate(self._metrics):
                if dues[i] > now + _SLACK:
                    continue
                if self._stopping.is_set():
                    return
                self._sample(spec, sampler, tick)
                # next slot strictly in the future: an overrun skips slots, it does not burst.
                after = time.monotonic()
                slots[i] = max(slots[i] + 1, math.floor((after - start) / spec.interval) + 1)
            if self._after_tick is not None and not self._stopping.is_set():
                try:
                    self._after_tick()
                except Exception:
                    _debug("metrics: sending a tick's samples failed", exc_info=True)

    def _sample(self, spec: Spec, sampler: _Sampler, tick: _Tick) -> None:
        try:
            value = sampler.sample(tick)
            if value is not None and not self._stopping.is_set():
                self._emit(spec.name, float(value), spec.unit)
        except _Stopped:
            pass
        except Exception as exc:
            self._failure(spec, exc)

    def _failure(self, spec: Spec, exc: Exception) -> None:
        if spec.name not in self._failed:
            self._failed.add(spec.name)
            _debug(
                "metric %r failed (%s); skipping failed samples from now on quietly",
                spec.name,
                exc,
                exc_info=exc,
            )
