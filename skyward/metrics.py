"""What to measure on every node: ``Image(metrics=[sky.metrics.CPU(), sky.metrics.Disk("/data")])``.

Each helper returns a :class:`MetricSpec`, a plain frozen value that says *what* to sample and
how often; the node's agent does the sampling (``skyward.bootstrap.metrics.Collector``) and
sends back one ``(name, value, unit)`` per sample.

Names and units:

=====================  ==========================  ====================================
helper                 name                        unit
=====================  ==========================  ====================================
``CPU()``              ``cpu``                     ``%`` of all cores (100 = every core busy)
``Memory()``           ``memory``                  ``%`` of RAM in use (total - MemAvailable)
``MemoryUsed()``       ``memory_used``             ``GB``
``MemoryTotal()``      ``memory_total``            ``GB``
``GPU()``              ``gpu``                     ``%`` utilisation, averaged over GPUs
``GPUMemory()``        ``gpu_memory``              ``%`` of GPU memory in use, averaged over GPUs
``GPUMemoryTotal()``   ``gpu_memory_total``        ``GB``, summed over GPUs
``GPUTemp()``          ``gpu_temp``                ``C``, averaged over GPUs
``Disk(path)``         ``disk:<path>``             ``%`` used, as ``df`` shows it
``NetworkRx()``        ``net_rx``                  ``MB/s`` received, all interfaces but ``lo``
``NetworkTx()``        ``net_tx``                  ``MB/s`` sent, all interfaces but ``lo``
``Custom(name, cmd)``  ``name``                    what you pass as ``unit=``
=====================  ==========================  ====================================

GB and MB are binary here (2**30 and 2**20 bytes), the units ``free -g`` and ``nvidia-smi``
report in, so a node's numbers match what you would see logged in on it.

GPU metrics are silently absent on a node without ``nvidia-smi``; :func:`Default` includes them
so one spec works for CPU and GPU pools alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skyward.errors import ConfigError

__all__ = [
    "CPU",
    "GPU",
    "Custom",
    "Default",
    "Disk",
    "GPUMemory",
    "GPUMemoryTotal",
    "GPUTemp",
    "Memory",
    "MemoryTotal",
    "MemoryUsed",
    "MetricSpec",
    "NetworkRx",
    "NetworkTx",
    "from_config",
    "normalize",
    "to_config",
]

# kind -> the params it requires (exactly these keys). Kinds not listed take none.
_PARAMS: dict[str, frozenset[str]] = {
    "disk": frozenset({"path"}),
    "custom": frozenset({"command"}),
}

KINDS: frozenset[str] = frozenset(
    {
        "cpu",
        "memory",
        "memory_used",
        "memory_total",
        "gpu",
        "gpu_memory",
        "gpu_memory_total",
        "gpu_temp",
        "disk",
        "net_rx",
        "net_tx",
        "custom",
    }
)



@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric to sample on every node.

    ``name`` is what samples are reported under and must be unique in a pool's metrics (see
    :func:`normalize`). ``kind`` picks the sampler (one of ``KINDS``), ``interval`` is seconds
    between samples, ``unit`` is passed through with every value, and ``params`` holds the
    kind's options as ``(key, value)`` string pairs so the spec stays hashable
    (``(("path", "/data"),)`` for disk, ``(("command", "..."),)`` for custom).
    """

    name: str
    kind: str
    interval: float = 1.0
    unit: str = ""
    params: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(
                f"metric name {self.name!r} is not valid: a metric name is a non-empty string. "
                f"Use e.g. Custom('queue_depth', ...)."
            )
        if self.kind not in KINDS:
            raise ConfigError(
                f"metric {self.name!r} has kind {self.kind!r}, which is not known: the kinds are "
                f"{', '.join(sorted(KINDS))}. Build specs with the sky.metrics helpers "
                f"(CPU(), Disk('/'), Custom(name, command), ...)."
            )
        interval = self.interval
        # bool is an int; interval=True is a slip, not "every second".
        if isinstance(interval, bool) or not isinstance(interval, int | float):
            raise ConfigError(
                f"metric {self.name!r} has interval {interval!r}, not a number: the interval is "
                f"seconds between samples. Use e.g. interval=1.0."
            )
        if not math.isfinite(interval) or interval <= 0:
            raise ConfigError(
                f"metric {self.name!r} has interval {interval!r}: the interval must be a finite "
                f"number of seconds greater than 0. Use e.g. interval=1.0."
            )
        object.__setattr__(self, "interval", float(interval))
        if not isinstance(self.unit, str):
            raise ConfigError(
                f"metric {self.name!r} has unit {self.unit!r}: a unit is a string such as '%' or "
                f"'GB'. Use unit='' for none."
            )
        self._check_params()

    def _check_params(self) -> None:
        params = self.params
        if not isinstance(params, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and all(isinstance(s, str) for s in p)
            for p in params
        ):
            raise ConfigError(
                f"metric {self.name!r} has params {params!r}: params are a tuple of (key, value) "
                f"string pairs. Use e.g. params=(('path', '/data'),)."
            )
        keys = [k for k, _ in params]
        expected = _PARAMS.get(self.kind, frozenset())
        if len(set(keys)) != len(keys) or set(keys) != expected:
            want = ", ".join(sorted(expected)) or "none"
            raise ConfigError(
                f"metric {self.name!r} of kind {self.kind!r} has params {keys!r}: that kind takes "
                f"exactly these params: {want}. Build it with its sky.metrics helper."
            )
        if self.kind == "disk" and not self.param("path").startswith("/"):
            raise ConfigError(
                f"Disk(path={self.param('path')!r}) is not valid: the path must be absolute, since "
                f"it is resolved on the node, not here. Use e.g. Disk('/data')."
            )
        if self.kind == "custom" and not self.param("command").strip():
            raise ConfigError(
                f"Custom({self.name!r}, command={self.param('command')!r}) is not valid: the "
                f"command is a shell command that prints a number. Use e.g. "
                f"Custom({self.name!r}, 'cat /tmp/queue_depth')."
            )

    def param(self, key: str, default: str = "") -> str:
        """The value of param ``key``, or ``default`` when the spec has none."""
        for k, v in self.params:
            if k == key:
                return v
        return default


def CPU(interval: float = 1.0) -> MetricSpec:
    """Overall CPU utilisation in %, 0 to 100 across all cores (100 = every core busy)."""
    return MetricSpec("cpu", "cpu", interval, "%")


def Memory(interval: float = 1.0) -> MetricSpec:
    """RAM in use in %: (MemTotal - MemAvailable) / MemTotal, so page cache counts as free."""
    return MetricSpec("memory", "memory", interval, "%")


def MemoryUsed(interval: float = 1.0) -> MetricSpec:
    """RAM in use in GB (2**30 bytes): MemTotal - MemAvailable."""
    return MetricSpec("memory_used", "memory_used", interval, "GB")


def MemoryTotal(interval: float = 60.0) -> MetricSpec:
    """The node's RAM in GB (2**30 bytes). It does not change, hence the long interval."""
    return MetricSpec("memory_total", "memory_total", interval, "GB")


def GPU(interval: float = 1.0) -> MetricSpec:
    """GPU utilisation in %, averaged over the node's GPUs. Absent without nvidia-smi."""
    return MetricSpec("gpu", "gpu", interval, "%")


def GPUMemory(interval: float = 1.0) -> MetricSpec:
    """GPU memory in use in %, averaged over the node's GPUs. Absent without nvidia-smi."""
    return MetricSpec("gpu_memory", "gpu_memory", interval, "%")


def GPUMemoryTotal(interval: float = 60.0) -> MetricSpec:
    """GPU memory in GB (2**30 bytes), summed over the node's GPUs. Absent without nvidia-smi."""
    return MetricSpec("gpu_memory_total", "gpu_memory_total", interval, "GB")


def GPUTemp(interval: float = 5.0) -> MetricSpec:
    """GPU temperature in degrees C, averaged over the node's GPUs. Absent without nvidia-smi."""
    return MetricSpec("gpu_temp", "gpu_temp", interval, "C")


def Disk(path: str = "/", interval: float = 5.0) -> MetricSpec:
    """Space used on the filesystem holding ``path``, in % as ``df`` shows it.

    Named ``disk:<path>`` so several disks can be watched at once. Space reserved for root
    counts as unavailable, as in ``df``, so 100 means ordinary users can write nothing more.
    """
    if not isinstance(path, str):
        raise ConfigError(
            f"Disk(path={path!r}) is not valid: the path is a string naming a directory on the "
            f"node. Use e.g. Disk('/data')."
        )
    return MetricSpec(f"disk:{path}", "disk", interval, "%", (("path", path),))


def NetworkRx(interval: float = 1.0) -> MetricSpec:
    """Bytes received per second in MB/s (2**20 bytes), summed over all interfaces but lo."""
    return MetricSpec("net_rx", "net_rx", interval, "MB/s")


def NetworkTx(interval: float = 1.0) -> MetricSpec:
    """Bytes sent per second in MB/s (2**20 bytes), summed over all interfaces but lo."""
    return MetricSpec("net_tx", "net_tx", interval, "MB/s")


def Custom(name: str, command: str, interval: float = 3.0, *, unit: str = "") -> MetricSpec:
    """Run shell ``command`` on the node every ``interval`` seconds; the value is the first
    number in its stdout.

    A run that exits non-zero, prints no number or outlives its timeout (its interval, at least
    1 s and at most 10 s) yields no sample; the next run is tried as usual.
    """
    if not isinstance(command, str):
        raise ConfigError(
            f"Custom({name!r}, command={command!r}) is not valid: the command is one shell "
            f"command line as a string. Use e.g. Custom({name!r}, 'cat /tmp/queue_depth')."
        )
    return MetricSpec(name, "custom", interval, unit, (("command", command),))


def Default(interval: float = 1.0) -> tuple[MetricSpec, ...]:
    """The metrics skyward suggests: CPU, Memory, GPU and GPUMemory (the GPU ones are absent
    on nodes without nvidia-smi)."""
    return (CPU(interval), Memory(interval), GPU(interval), GPUMemory(interval))


# helper name per metric name, for the hint when someone writes metrics=["cpu"].
_HELPERS: dict[str, str] = {
    "cpu": "CPU()",
    "memory": "Memory()",
    "memory_used": "MemoryUsed()",
    "memory_total": "MemoryTotal()",
    "gpu": "GPU()",
    "gpu_memory": "GPUMemory()",
    "gpu_memory_total": "GPUMemoryTotal()",
    "gpu_temp": "GPUTemp()",
    "disk": "Disk('/')",
    "net_rx": "NetworkRx()",
    "net_tx": "NetworkTx()",
    "default": "Default()",
}


def normalize(value: Any) -> tuple[MetricSpec, ...]:
    """Turn what a user may pass as ``metrics=`` into a flat tuple of specs.

    Accepts None (no metrics), one :class:`MetricSpec`, or a list/tuple of them, nested
    lists/tuples (such as :func:`Default`'s result) flattened. Anything else is a ConfigError.

    Duplicate names: the last spec wins, in the place where the name first appeared. That lets
    ``[*Default(), CPU(interval=0.2)]`` override one default without listing the others.
    """
    by_name: dict[str, MetricSpec] = {}
    for spec in _flatten(value, value):
        by_name[spec.name] = spec
    return tuple(by_name.values())


def _flatten(value: Any, whole: Any) -> list[MetricSpec]:
    if value is None:
        return []
    if isinstance(value, MetricSpec):
        return [value]
    if isinstance(value, list | tuple):
        out: list[MetricSpec] = []
        for item in value:
            if item is None:
                # None inside a list is a slip (a helper that returned nothing), not "no metrics".
                raise ConfigError(
                    f"metrics={whole!r} contains None: every item must be a sky.metrics spec. "
                    f"Remove it, or pass metrics=None for no metrics."
                )
            out.extend(_flatten(item, whole))
        return out
    raise ConfigError(_not_a_spec(value))


def _not_a_spec(value: Any) -> str:
    if isinstance(value, str):
        helper = _HELPERS.get(value.strip().lower())
        if helper is None and value.strip().lower().startswith("disk"):
            helper = "Disk('/')"
        hint = f"sky.metrics.{helper}" if helper else "sky.metrics.CPU()"
        return (
            f"metric {value!r} is a string: metrics are specs built by the sky.metrics helpers, "
            f"not names. Use {hint}."
        )
    if callable(value) and getattr(value, "__module__", None) == __name__:
        # metrics=sky.metrics.CPU, without the call.
        fname = getattr(value, "__name__", "CPU")
        return (
            f"metric {fname} is the helper itself, not a spec: the helpers must be called. "
            f"Use sky.metrics.{fname}()."
        )
    return (
        f"metric {value!r} is a {type(value).__name__}: metrics are sky.metrics specs, "
        f"a list of them or None. Use e.g. metrics=[sky.metrics.CPU(), sky.metrics.Memory()]."
    )


def to_config(specs: Sequence[MetricSpec]) -> list[dict[str, Any]]:
    """JSON-able form of ``specs``, for shipping them to nodes; :func:`from_config` reverses it."""
    return [
        {
            "name": s.name,
            "kind": s.kind,
            "interval": s.interval,
            "unit": s.unit,
            "params": dict(s.params),
        }
        for s in specs
    ]


def from_config(config: Sequence[dict[str, Any]]) -> tuple[MetricSpec, ...]:
    """Specs back from :func:`to_config`'s output, validated as if built by the helpers."""
    if not isinstance(config, list | tuple):
        raise ConfigError(
            f"metrics config {config!r} is a {type(config).__name__}: it must be the list that "
            f"sky.metrics.to_config() returns."
        )
    specs: list[MetricSpec] = []
    for entry in config:
        if not isinstance(entry, dict) or not {"name", "kind"} <= entry.keys():
            raise ConfigError(
                f"metrics config entry {entry!r} is not valid: each entry is a dict with at least "
                f"'name' and 'kind', as sky.metrics.to_config() writes it."
            )
        unknown = entry.keys() - {"name", "kind", "interval", "unit", "params"}
        if unknown:
            raise ConfigError(
                f"metrics config entry {entry!r} has unknown keys {sorted(unknown)}: the keys are "
                f"name, kind, interval, unit and params. Rebuild it with sky.metrics.to_config()."
            )
        params = entry.get("params") or {}
        if not isinstance(params, dict):
            raise ConfigError(
                f"metrics config entry {entry!r} has params {params!r}: params are a dict of "
                f"strings, as sky.metrics.to_config() writes them."
            )
        specs.append(
            MetricSpec(
                name=entry["name"],
                kind=entry["kind"],
                interval=entry.get("interval", 1.0),
                unit=entry.get("unit", ""),
                params=tuple(params.items()),
            )
        )
    return tuple(specs)
