"""A cloud node's replacement is one more stack update: refresh, then an update that drops the
lost instance and adds a new one (tested through the fake automation-API workspace)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pulumi")

from stackfakes import FakeWorkspace, make_plan

from skyward.stacks import keys
from skyward.stacks.cloudpool import CloudPool

pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def cloud_pool(ws: FakeWorkspace, *, spot: bool) -> CloudPool:
    plan = make_plan(nodes=0)
    key_path, _ = keys.client_key(plan.stack)
    return CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=spot,
                     fallback_to_on_demand=False, record={"skyward": "0.1.0"}, connect=ws)


def test_replacing_a_node_refreshes_then_updates_once(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = cloud_pool(ws, spot=False)
    nodes = cloud.start(3)
    updates_before = [k for k, _ in ws.calls].count("update")

    class Host:  # what the SSH provider hands over: it knows nodes by address
        address = nodes[1].address

    new, reclaimed = cloud.replace(Host())
    ops = [k for k, _ in ws.calls]
    assert ops.count("update") == updates_before + 1  # one more update, in the stack's history
    assert ops.index("refresh") < len(ops) - 1 - ops[::-1].index("update")  # refresh first
    assert new.index == 3 and reclaimed is None  # a new index: never the lost node's
    plan = ws.plans[cloud.plan.stack][-1]
    assert [n["index"] for n in plan["nodes"]] == [0, 2, 3]
    assert new.host_key not in (nodes[0].host_key, nodes[2].host_key)
    history = ws.history[cloud.plan.stack]
    assert [h.kind for h in history].count("update") == updates_before + 1


def test_a_spot_node_the_cloud_took_back_is_reported_as_preempted(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = cloud_pool(ws, spot=True)
    cloud.start(2)
    state = ws.states[cloud.plan.stack]
    state["resources"] = [r for r in state["resources"] if r["urn"] != 1]  # reclaimed: gone
    new, reclaimed = cloud.replace(1)
    assert new.index == 2 and reclaimed and "spot" in reclaimed
    # A spot node whose instance is still there (its agent died) was not preempted.
    _, reclaimed = cloud.replace(0)
    assert reclaimed is None


def test_a_failed_replacement_leaves_the_plan_as_it_was(home: Path) -> None:
    from stackfakes import command_error

    from skyward.errors import StackError

    ws = FakeWorkspace()
    cloud = cloud_pool(ws, spot=False)
    cloud.start(2)
    before = cloud.plan
    ws.fail["update"] = [command_error("error: boom")]
    with pytest.raises(StackError):
        cloud.replace(1)
    assert cloud.plan == before
