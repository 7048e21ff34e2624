"""sky.metrics: the specs, normalize() and the config round trip."""

from __future__ import annotations

import json

import pytest

import skyward.metrics as m
from skyward.errors import ConfigError


@pytest.mark.parametrize(
    ("spec", "name", "kind", "unit", "interval"),
    [
        (m.CPU(), "cpu", "cpu", "%", 1.0),
        (m.Memory(), "memory", "memory", "%", 1.0),
        (m.MemoryUsed(), "memory_used", "memory_used", "GB", 1.0),
        (m.MemoryTotal(), "memory_total", "memory_total", "GB", 60.0),
        (m.GPU(), "gpu", "gpu", "%", 1.0),
        (m.GPUMemory(), "gpu_memory", "gpu_memory", "%", 1.0),
        (m.GPUMemoryTotal(), "gpu_memory_total", "gpu_memory_total", "GB", 60.0),
        (m.GPUTemp(), "gpu_temp", "gpu_temp", "C", 5.0),
        (m.Disk(), "disk:/", "disk", "%", 5.0),
        (m.NetworkRx(), "net_rx", "net_rx", "MB/s", 1.0),
        (m.NetworkTx(), "net_tx", "net_tx", "MB/s", 1.0),
        (m.Custom("q", "echo 1"), "q", "custom", "", 3.0),
    ],
)
def test_helpers(spec: m.MetricSpec, name: str, kind: str, unit: str, interval: float) -> None:
    assert (spec.name, spec.kind, spec.unit, spec.interval) == (name, kind, unit, interval)
    assert type(spec.interval) is float
    hash(spec)  # specs are hashable values


def test_params_and_interval() -> None:
    disk = m.Disk("/data", interval=2)
    assert disk.name == "disk:/data"
    assert disk.params == (("path", "/data"),)
    assert disk.param("path") == "/data"
    assert disk.interval == 2.0 and type(disk.interval) is float
    custom = m.Custom("depth", "cat /tmp/depth", interval=0.5, unit="jobs")
    assert custom.param("command") == "cat /tmp/depth"
    assert custom.unit == "jobs"
    assert m.CPU(interval=0.25).interval == 0.25
    assert m.Disk("/data") == m.Disk("/data")
    assert len({m.Disk("/a"), m.Disk("/a"), m.Disk("/b")}) == 2


def test_default() -> None:
    assert [s.name for s in m.Default()] == ["cpu", "memory", "gpu", "gpu_memory"]
    assert all(s.interval == 2.0 for s in m.Default(interval=2))


@pytest.mark.parametrize("interval", [0, -1, float("nan"), float("inf"), True, "1", None])
def test_bad_interval_is_refused(interval: object) -> None:
    with pytest.raises(ConfigError) as info:
        m.CPU(interval=interval)  # type: ignore[arg-type]
    message = str(info.value)
    assert repr(interval) in message
    assert "interval=1.0" in message  # says what to write instead


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: m.Disk("data"), "absolute"),
        (lambda: m.Disk(3), "string"),  # type: ignore[arg-type]
        (lambda: m.Custom("", "echo 1"), "non-empty"),
        (lambda: m.Custom("x", "  "), "prints a number"),
        (lambda: m.Custom("x", ["echo", "1"]), "shell command"),  # type: ignore[arg-type]
        (lambda: m.MetricSpec("x", "bogus"), "kinds are"),
        (lambda: m.MetricSpec("x", "disk"), "path"),
        (lambda: m.MetricSpec("x", "cpu", params=(("path", "/"),)), "none"),
        (lambda: m.MetricSpec("x", "cpu", params=[("a", "b")]), "tuple"),  # type: ignore[arg-type]
        (lambda: m.MetricSpec("x", "cpu", unit=None), "unit"),  # type: ignore[arg-type]
    ],
)
def test_bad_specs_are_refused(make, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        make()


def test_normalize_accepts_none_one_and_nested_sequences() -> None:
    assert m.normalize(None) == ()
    assert m.normalize([]) == ()
    assert m.normalize(m.CPU()) == (m.CPU(),)
    flat = m.normalize([m.Default(), m.Disk("/data"), (m.NetworkRx(), [m.NetworkTx()])])
    assert [s.name for s in flat] == [
        "cpu",
        "memory",
        "gpu",
        "gpu_memory",
        "disk:/data",
        "net_rx",
        "net_tx",
    ]
    assert m.normalize(m.Default()) == m.Default()


def test_normalize_duplicates_last_wins_in_first_place() -> None:
    specs = m.normalize([*m.Default(), m.CPU(interval=0.2)])
    assert [s.name for s in specs] == ["cpu", "memory", "gpu", "gpu_memory"]
    assert specs[0].interval == 0.2


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("cpu", "sky.metrics.CPU()"),
        (["memory"], "sky.metrics.Memory()"),
        ("disk:/data", "sky.metrics.Disk('/')"),
        ("whatever", "sky.metrics.CPU()"),
        (m.CPU, "sky.metrics.CPU()"),
        ([m.GPU], "sky.metrics.GPU()"),
        (42, "sky.metrics.CPU()"),
        ({"cpu": 1}, "sky.metrics.CPU()"),
        ([m.CPU(), None], "metrics=None"),
    ],
)
def test_normalize_refuses_what_is_not_a_spec(value: object, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        m.normalize(value)
    assert hint in str(info.value)


def test_config_round_trip_through_json() -> None:
    specs = m.normalize(
        [
            m.Default(),
            m.MemoryTotal(),
            m.Disk("/data", interval=10),
            m.Custom("q", "echo '1'", unit="jobs"),
        ]
    )
    config = m.to_config(specs)
    assert m.from_config(json.loads(json.dumps(config))) == specs
    assert config[-1] == {
        "name": "q",
        "kind": "custom",
        "interval": 3.0,
        "unit": "jobs",
        "params": {"command": "echo '1'"},
    }


@pytest.mark.parametrize(
    "config",
    [
        {"name": "cpu"},
        ["cpu"],
        [{"name": "cpu"}],
        [{"name": "cpu", "kind": "cpu", "colour": "red"}],
        [{"name": "d", "kind": "disk", "params": [["path", "/"]]}],
        [{"name": "d", "kind": "disk", "params": {"path": "/", "extra": "x"}}],
        [{"name": "c", "kind": "cpu", "interval": 0}],
        [{"name": "t", "kind": "teleport"}],
    ],
)
def test_from_config_refuses_bad_entries(config: object) -> None:
    with pytest.raises(ConfigError):
        m.from_config(config)  # type: ignore[arg-type]
