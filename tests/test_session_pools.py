"""A Session's pools as the reference's session and health-check tests use them (items
3 and 4): ``session.compute(..., name=...)`` is a label when the call also describes the pool,
and a pool with a sky.HealthChecker is ready only once its nodes passed a check (warming), while
a failure after warming replaces the node with a "health check" reason."""

from __future__ import annotations

import threading
import time

import pytest

import skyward as sky
from skyward.observe import events

pytestmark = pytest.mark.timeout(120)
QUIET = sky.Options(console=False)


@sky.function
def noop() -> int:
    return 42


def test_a_name_beside_the_pool_description_is_a_label() -> None:
    requested: list[sky.ClusterRequested] = []
    unsubscribe = sky.subscribe(lambda e: requested.append(e) if isinstance(e, sky.ClusterRequested) else None)
    try:
        with sky.Session(console=False) as session:
            a = session.compute(provider=sky.Local(), nodes=1, name="a")
            b = session.compute(sky.Spec(provider=sky.Local(), nodes=1), name="b")
            assert a is not b and a.label == "a" and b.label == "b"
            assert a.name is None  # not a named pool of skyward.toml: nothing to attach to
            assert noop() >> a == 42 and noop() >> b == 42
            assert a.record is not None and a.record["label"] == "a" and a.record["name"] is None
            with pytest.raises(sky.ConfigError, match=r"already has a pool called 'a'.*stop_pool\('a'\)"):
                session.compute(provider=sky.Local(), nodes=1, name="a")
            session.stop_pool("a")
            assert not a.is_active and b.is_active and session.pools == [b]
            with pytest.raises(sky.ConfigError, match=r"no pool called 'zz'.*'b'"):
                session.stop_pool("zz")
            again = session.compute(provider=sky.Local(), nodes=1, name="a")  # free once stopped
            assert again.label == "a" and noop() >> again == 42
    finally:
        unsubscribe()
    events.bus.flush()
    assert [e.label for e in requested][:2] == ["a", "b"]


def test_the_label_titles_the_console(capsys: pytest.CaptureFixture[str]) -> None:
    with sky.Session(console="log") as session:
        pool = session.compute(provider=sky.Local(), nodes=1, name="trainer")
        assert noop() >> pool == 42
    events.bus.flush()
    assert "pool trainer" in capsys.readouterr().err


def test_compute_name_alone_still_means_a_named_pool_and_mixing_still_fails() -> None:
    with pytest.raises(sky.ConfigError, match=r"sky.Compute\(name='a'\) got nodes, provider too"):
        sky.Compute(name="a", provider=sky.Local(), nodes=1)
    with sky.Session(console=False) as session, pytest.raises(sky.ConfigError, match="name"):
        session.compute(provider=sky.Local(), nodes=1, name="")


def test_warming_gates_readiness() -> None:
    # The reference's test: the pool whose check passes on its third tick takes >= 2 intervals longer.
    def warming() -> object:
        seen = {"n": 0}

        def fn(_info: object) -> bool:
            seen["n"] += 1
            return seen["n"] >= 3

        return fn

    def checker(fn: object) -> sky.Options:
        return sky.Options(console=False, health_checker=sky.HealthChecker(
            fn=fn, interval=1.0, timeout=2.0, consecutive_failures=5, initial_delay=0.0))  # type: ignore[arg-type]

    with sky.Session(console=False) as session:
        t0 = time.monotonic()
        healthy = session.compute(provider=sky.Local(), nodes=1, name="healthy", options=checker(lambda _i: True))
        t_healthy = time.monotonic() - t0
        t0 = time.monotonic()
        warm = session.compute(provider=sky.Local(), nodes=1, name="warming", options=checker(warming()))
        t_warming = time.monotonic() - t0
        assert healthy.current_nodes() == 1 and warm.current_nodes() == 1  # ready when handed over
        assert noop() >> warm == 42
    # Its check passes on the third tick, 1 s apart: at least two intervals before it is handed
    # over, whatever the machine's load made of the healthy pool's start (1.35 s once in CI).
    assert t_warming >= 1.9 and t_warming > t_healthy, (t_healthy, t_warming)


def test_a_failure_after_warming_replaces_the_node_with_a_health_check_reason() -> None:
    def once_then_fail() -> object:
        state = {"n": 0}

        def fn(_info: object) -> bool | str:
            state["n"] += 1
            return True if state["n"] == 1 else "synthetic failure"

        return fn

    lost: list[sky.InstanceLost] = []
    got = threading.Event()

    def seen(e: sky.Event) -> None:
        if isinstance(e, sky.InstanceLost):
            lost.append(e)
            got.set()

    unsubscribe = sky.subscribe(seen)
    try:
        with sky.Session(console=False) as session:
            session.compute(provider=sky.Local(), nodes=(1, 2), options=sky.Options(
                console=False, reconcile_tick_interval=2.0,
                health_checker=sky.HealthChecker(fn=once_then_fail(), interval=1.0, timeout=2.0,  # type: ignore[arg-type]
                                                 consecutive_failures=2, initial_delay=0.0)))
            assert got.wait(20), "no node was lost to its health check"
    finally:
        unsubscribe()
    assert any("health check" in e.reason and "synthetic failure" in e.reason for e in lost), [e.reason for e in lost]
