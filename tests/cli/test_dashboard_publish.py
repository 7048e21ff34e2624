"""Who hears what the dashboard's server publishes: a pool's page hears its own pool's news and
the registry's, never another pool's."""

from __future__ import annotations

import asyncio

from skyward.dashboard.app import Hub


def _heard(hub: Hub) -> dict[str | None, list[dict]]:
    out: dict[str | None, list[dict]] = {}
    for queue, wanted in hub.subscribers:
        out[wanted] = []
        while not queue.empty():
            out[wanted].append(queue.get_nowait())
    return out


def test_a_pools_page_hears_that_the_registry_changed_and_only_its_own_pools_events() -> None:
    hub = Hub(token="t")
    for wanted in (None, "demo", "other"):
        hub.subscribers.add((asyncio.Queue(), wanted))
    changed = {"type": "changed", "what": "pools"}
    hub.publish(changed)  # a record was written (a resize from another process): every page reloads
    hub.publish({"type": "events", "ref": "demo"}, ref="demo", name="demo")
    heard = _heard(hub)
    assert heard[None] == [changed, {"type": "events", "ref": "demo"}]
    assert heard["demo"] == [changed, {"type": "events", "ref": "demo"}]
    assert heard["other"] == [changed]
