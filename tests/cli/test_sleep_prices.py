"""What a sleeping pool's wakes cost, each group at its own price (skyward.named.sleep): a pool of
a CPU group and a GPU group is not billed at the head group's price for every node."""

from __future__ import annotations

from typing import Any

import pytest

from skyward.named import sleep
from skyward.records import audit

pytestmark = pytest.mark.usefixtures("home")


def grouped(cpu_nodes: int, gpu_nodes: int, **extra: Any) -> dict[str, Any]:
    """A named pool's record of two groups that sleep at zero: cpu at $1/node-hour, gpu at $10."""
    def group(n: int, price: float | None) -> dict[str, Any]:
        return {"config": {"nodes": [0, 4]}, "cluster": {"nodes": [{"index": i} for i in range(n)]},
                "hourly_cost": price}

    return {"name": "pipe", "hourly_cost": 1.0, "config": {"nodes": [0, 4]},
            "groups": {"cpu": group(cpu_nodes, 1.0), "gpu": group(gpu_nodes, 10.0)}, **extra}


def test_a_wake_of_two_groups_costs_each_groups_nodes_at_its_own_price() -> None:
    price = sleep.prices(grouped(0, 0))
    assert price == {"cpu": 1.0, "gpu": 10.0}
    meter = sleep.Meter(nodes={"cpu": 0, "gpu": 0}, at=0.0, price=price)
    meter.count({"cpu": 2, "gpu": 0}, 100.0)  # the cpu group wakes with 2 nodes
    meter.count({"cpu": 2, "gpu": 1}, 1900.0)  # then a GPU node, for half an hour
    awake, node_seconds, cost = meter.slept(3700.0)
    assert awake == 3600.0 and node_seconds == 2 * 3600 + 1800
    assert cost == pytest.approx(2 * 1.0 + 0.5 * 10.0)  # not (9000 node-s at the head's $1): 2.5
    # reset for the next wake
    meter.count({"cpu": 1, "gpu": 0}, 4000.0)
    assert meter.slept(4360.0) == (360.0, 360.0, pytest.approx(0.1))


def test_an_unknown_price_counts_only_while_its_group_has_nodes() -> None:
    price = {"cpu": 1.0, "gpu": None}
    assert sleep.rate(price, {"cpu": 3, "gpu": 0}) == 3.0
    assert sleep.rate(price, {"cpu": 3, "gpu": 1}) is None
    meter = sleep.Meter(nodes={"cpu": 1, "gpu": 0}, at=0.0, price=price, woke_at=0.0)
    meter.count({"cpu": 1, "gpu": 1}, 3600.0)
    meter.count({"cpu": 1, "gpu": 0}, 3660.0)
    assert meter.slept(7200.0)[2] is None  # a minute of a node whose price nobody knows


def test_what_a_pool_of_groups_spent_prices_the_wake_going_on_by_group() -> None:
    audit.append("pipe", "woke", "p1", nodes=1, seconds=3.0, hourly_cost=10.0)
    audit.append("pipe", "asleep", "p1", awake_seconds=600.0, node_seconds=600.0, cost=1.25)
    record = grouped(2, 1, woke=1000.0)
    assert sleep.spent(record, 1000.0 + 1800) == pytest.approx(1.25 + (2 * 1.0 + 10.0) / 2)
    assert sleep.spent({**record, "asleep_since": 2000.0}, 5000.0) == pytest.approx(1.25)
    unknown = grouped(2, 0, woke=1000.0)
    unknown["groups"]["gpu"]["hourly_cost"] = None
    assert sleep.spent(unknown, 2000.0) is None


def test_a_pool_of_one_spec_is_one_group_at_the_records_price() -> None:
    record = {"name": "solo", "hourly_cost": 0.5, "config": {"nodes": [0, 2]},
              "cluster": {"nodes": [{"index": 0}, {"index": 1}]}, "woke": 0.0}
    assert sleep.prices(record) == {"default": 0.5}
    assert sleep.spent(record, 3600.0) == pytest.approx(1.0)
