"""The elastic-pool decision, step by step."""

from __future__ import annotations

import skyward as sky
from skyward.core.autoscale import ScaleState, decide

OPTS = sky.Options(autoscale_cooldown=10, autoscale_idle_timeout=30)
ELASTIC = sky.Nodes(desired=2, max=6)


def test_fixed_pools_never_scale() -> None:
    assert decide(sky.Nodes(desired=2), 2, 100, 1, 100.0, ScaleState(0.0), OPTS) is None


def test_grows_by_the_waiting_tasks_up_to_max_and_respects_cooldown() -> None:
    state = ScaleState(last_change=0.0)
    assert decide(ELASTIC, 2, 3, 1, 5.0, state, OPTS) is None  # within cooldown
    assert decide(ELASTIC, 2, 3, 1, 11.0, state, OPTS) == 3  # one task waiting -> one node
    assert decide(ELASTIC, 3, 50, 1, 12.0, state, OPTS) is None  # cooldown again
    assert decide(ELASTIC, 3, 50, 1, 22.0, state, OPTS) == 6  # capped at max
    assert decide(ELASTIC, 6, 50, 1, 40.0, state, OPTS) is None  # already at max


def test_slots_count_as_capacity() -> None:
    assert decide(ELASTIC, 2, 8, 4, 100.0, ScaleState(0.0), OPTS) is None  # 8 tasks fit 2x4 slots
    assert decide(ELASTIC, 2, 9, 4, 100.0, ScaleState(0.0), OPTS) == 3


def test_shrinks_to_desired_after_idle_timeout_only() -> None:
    state = ScaleState(last_change=0.0)
    assert decide(ELASTIC, 5, 0, 1, 100.0, state, OPTS) is None  # idle starts
    assert decide(ELASTIC, 5, 1, 1, 110.0, state, OPTS) is None  # busy again: idle resets
    assert state.idle_since is None
    assert decide(ELASTIC, 5, 0, 1, 120.0, state, OPTS) is None
    assert decide(ELASTIC, 5, 0, 1, 151.0, state, OPTS) == 2
    assert decide(ELASTIC, 2, 0, 1, 200.0, state, OPTS) is None  # at desired: stays


def test_min_is_the_floor_an_idle_elastic_pool_shrinks_to() -> None:
    # The reference's scale to zero: Nodes(desired=5, min=0, max=5) starts 5 and reaps to 0.
    nodes = sky.Nodes(desired=5, min=0, max=5)
    assert nodes.floor == 0 and sky.Nodes(desired=2, max=6).floor == 2 and sky.Nodes(desired=8, min=4, max=9).floor == 4
    state = ScaleState(last_change=0.0)
    assert decide(nodes, 5, 0, 1, 100.0, state, OPTS) is None  # idle starts
    assert decide(nodes, 5, 0, 1, 131.0, state, OPTS) == 0  # idle past the timeout: to the floor
    assert decide(sky.Nodes(desired=2, min=0), 2, 0, 1, 500.0, ScaleState(0.0), OPTS) is None  # no max: fixed


def test_an_idle_pool_waits_out_the_cooldown_before_it_shrinks() -> None:
    options = sky.Options(autoscale_cooldown=50, autoscale_idle_timeout=5)
    state = ScaleState(last_change=0.0)
    assert decide(ELASTIC, 2, 5, 1, 50.0, state, options) == 5  # a burst: it grows
    assert decide(ELASTIC, 5, 0, 1, 51.0, state, options) is None
    assert decide(ELASTIC, 5, 0, 1, 70.0, state, options) is None  # idle 19 s, but 20 s since it grew
    assert decide(ELASTIC, 5, 0, 1, 101.0, state, options) == 2
    fresh = ScaleState(last_change=0.0)  # no step yet: the pool's start is not one
    assert decide(ELASTIC, 5, 0, 1, 1.0, fresh, options) is None
    assert decide(ELASTIC, 5, 0, 1, 7.0, fresh, options) == 2
