"""pool.serve(on="head", allow_from=...): the CIDRs are checked where they are given, refused where
skyward manages no firewall, and on a pool whose cluster has one (a cloud pool's stack; here a
recording stand-in on a real Local pool) the head's port is opened to them once the router
listens, and closed when the endpoint closes."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

import skyward as sky
from skyward.errors import StackError

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)
APPS = "serve.apps"  # tests/ is on the nodes' path as it is on this one's (conftest)


class Recording:
    """A firewall (providers.base.Firewall) that records what it was asked."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail

    def open_port(self, node: int, port: int, cidrs: Sequence[str]) -> None:
        self.calls.append(("open", node, port, tuple(cidrs)))
        if self.fail is not None:
            raise self.fail

    def close_port(self, node: int, port: int) -> None:
        self.calls.append(("close", node, port))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.Pool]:
    with sky.Compute(nodes=1, worker=sky.Worker(concurrency=2), options=QUIET) as pool:
        yield pool


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"allow_from": ["10.0.0.0/8"]}, "on='client'"),  # the router of on='client' is this machine's
    ({"on": "head", "port": 8000, "allow_from": ["10.0.0.300/8"]}, "'10.0.0.300/8' is not an address or a CIDR"),
    ({"on": "head", "port": 8000, "allow_from": ["0.0.0.0/0"]}, "'0.0.0.0/0' would open the endpoint to the whole world"),
    ({"on": "head", "port": 8000, "allow_from": ["10.0.0.0/8", "::/0"]}, "'::/0' would open the endpoint to the whole world"),
    ({"on": "head", "port": 8000, "allow_from": ["64.0.0.0/2"]}, "1,073,741,824 public addresses"),
    ({"on": "head", "allow_from": ["10.0.0.0/8"]}, "give the port to open, e.g. port=8000"),
    ({"on": "head", "port": 8000, "allow_from": ["10.0.0.0/8"]}, "skyward manages no firewall for this pool's nodes"),
])
def test_allow_from_is_checked_and_says_the_value_and_the_rule(pool: sky.Pool, kwargs: dict, words: str) -> None:
    with pytest.raises(sky.ConfigError, match=re.escape(words)):
        pool.serve(f"{APPS}:app", **kwargs)
    assert pool.endpoints == []


def test_the_world_is_refused_with_what_to_do_instead(pool: sky.Pool) -> None:
    pool.cluster.firewall = Recording()  # even where a firewall could open it
    try:
        with pytest.raises(sky.ConfigError) as info:
            pool.serve(f"{APPS}:app", on="head", port=8000, allow_from=["0.0.0.0/0"])
    finally:
        pool.cluster.firewall = None
    message = str(info.value)
    assert "whole world" in message and "10.0.0.0/8" in message and "on='client'" in message, message


def test_the_heads_port_is_opened_to_the_cidrs_and_closed_with_the_endpoint(pool: sky.Pool) -> None:
    firewall = Recording()
    pool.cluster.firewall = firewall
    port = _free_port()
    head = next(m.endpoint.index for m in pool.members.records() if m.rank == 0)
    try:
        with pool.serve(f"{APPS}:app", on="head", port=port, ready="/health",
                        allow_from=["10.0.0.0/8", "2001:db8::1/48"]) as endpoint:
            assert endpoint.url.endswith(f":{port}")
            assert endpoint.allow_from == ("10.0.0.0/8", "2001:db8::/48")
            assert firewall.calls == [("open", head, port, ("10.0.0.0/8", "2001:db8::/48"))]
            endpoint.wait_ready(timeout=120)
            assert httpx.post(endpoint.url + "/predict", json={"x": 1}, headers=endpoint.headers).status_code == 200
        assert firewall.calls[1:] == [("close", head, port)]
    finally:
        pool.cluster.firewall = None


def test_an_open_that_fails_ends_the_router_and_says_why(pool: sky.Pool) -> None:
    pool.cluster.firewall = Recording(fail=StackError("the update failed", stack="s", operation="update"))
    port = _free_port()
    try:
        with pytest.raises(StackError, match="the update failed"):
            pool.serve(f"{APPS}:app", on="head", port=port, allow_from=["10.0.0.0/8"])
    finally:
        pool.cluster.firewall = None
    assert pool.endpoints == []
    with pytest.raises(httpx.ConnectError):  # the head's router is gone with its port
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    # The head's slot is free again: an endpoint without allow_from serves.
    with pool.serve(f"{APPS}:app", on="head", ready="/health") as endpoint:
        endpoint.wait_ready(timeout=120)
