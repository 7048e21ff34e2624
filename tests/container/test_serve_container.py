"""pool.serve on a real podman sky.Container() pool: the replicas' packages from the Image's pip,
the app's module from its includes, and the router reaching each replica's Unix socket inside
its container the way the pool reaches that container."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serve import checks

import skyward as sky
from skyward.serve.endpoint import Endpoint

from .conftest import pool_containers

pytestmark = pytest.mark.timeout(600)
QUIET = sky.Options(console=False)


@pytest.fixture(scope="module")
def served(base_image: str) -> Iterator[tuple[sky.Pool, Endpoint]]:
    # Two slots a node: one for the replica, one for the tasks the tests run beside it.
    with sky.Compute(provider=sky.Container(image=base_image), nodes=2, image=checks.image(),
                     worker=sky.Worker(concurrency=2), options=QUIET) as pool, \
            pool.serve("apps:app", ready="/health") as endpoint:
        endpoint.wait_ready(timeout=300)
        yield pool, endpoint
    assert pool_containers(pool.id) == []


def test_concurrent_requests_are_all_answered_by_two_containers(served: tuple[sky.Pool, Endpoint]) -> None:
    _, endpoint = served
    assert [r.state for r in endpoint.replicas] == ["ready", "ready"]
    checks.every_request_is_answered_by_both_nodes(endpoint)


def test_server_sent_events_pass_out_of_a_container_as_they_are_produced(
        served: tuple[sky.Pool, Endpoint]) -> None:
    checks.events_pass_through_as_they_are_produced(*served)


def test_a_node_without_uvicorn_says_how_to_add_it(base_image: str) -> None:
    image = sky.Image(includes=[str(checks.APPS)])  # the app's module, and no uvicorn
    with sky.Compute(provider=sky.Container(image=base_image), nodes=1, image=image, options=QUIET) as pool, \
            pool.serve("apps:app") as endpoint, pytest.raises(sky.SkywardError) as info:
        endpoint.wait_ready(timeout=120)
    text = str(info.value)
    assert "uvicorn is not installed" in text and "image=sky.Image(pip=['uvicorn'" in text, text
