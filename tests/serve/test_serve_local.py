"""pool.serve on sky.Local(): real agents, real uvicorn replicas, real HTTP through the router."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from helpers import wait_for

import skyward as sky
from serve.checks import Load, every_request_is_answered_by_both_nodes
from skyward.observe import events

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)
APPS = "serve.apps"  # tests/ is on the nodes' path as it is on this one's (conftest)


def agent_pids(pool: sky.Pool) -> dict[int, int]:
    by_index = {n["index"]: n["pid"] for n in pool.cluster.describe()["nodes"]}
    return {m.rank: by_index[m.endpoint.index] for m in pool.members.records()}


def test_a_model_served_by_two_nodes_answers_every_request_and_uses_both() -> None:
    with sky.Compute(nodes=2, options=QUIET) as pool, pool.serve(f"{APPS}:app") as endpoint:
        endpoint.wait_ready(timeout=120)
        assert [r.state for r in endpoint.replicas] == ["ready", "ready"]
        every_request_is_answered_by_both_nodes(endpoint, 400)
        # Without the token: 401, and nothing about the replicas.
        bare = httpx.post(endpoint.url + "/predict", json={"x": 1})
        assert bare.status_code == 401
        assert "replica" not in bare.text and "pid" not in bare.text
        assert endpoint.stats().total >= 401


def test_on_head_the_router_runs_on_node_0_and_replicas_listen_on_tcp_with_the_token() -> None:
    import psutil

    with sky.Compute(nodes=2, worker=sky.Worker(concurrency=2), options=QUIET) as pool, \
            pool.serve(f"{APPS}:app", on="head", ready="/health") as endpoint:
        endpoint.wait_ready(timeout=120)
        assert endpoint.url.startswith("http://127.0.0.1:")  # a Local node's private address
        every_request_is_answered_by_both_nodes(endpoint)
        assert httpx.post(endpoint.url + "/predict", json={"x": 1}).status_code == 401
        # The router is the head node's (its agent's process tree), not this process's.
        port = int(endpoint.url.rsplit(":", 1)[1])
        agents = agent_pids(pool)

        def listeners(root: int, tree: bool = True) -> set[int]:
            procs = [psutil.Process(root), *(psutil.Process(root).children(recursive=True) if tree else ())]
            return {c.laddr.port for p in procs for c in p.net_connections("tcp") if c.status == "LISTEN"}

        assert port in listeners(agents[0]) and port not in listeners(os.getpid(), tree=False)
        # Each replica listens on TCP of its node's address, and asks for the token itself.
        replica_ports = (listeners(agents[0]) | listeners(agents[1])) - {port}
        assert len(replica_ports) == 2
        for p in replica_ports:
            assert httpx.get(f"http://127.0.0.1:{p}/whoami").status_code == 401
            assert httpx.get(f"http://127.0.0.1:{p}/whoami", headers=endpoint.headers).status_code == 200
        wait_for(lambda: endpoint.stats().total >= 201, 10, "the head's counts reaching the client")


def test_an_app_that_cannot_be_imported_on_the_node_says_so_with_the_nodes_traceback() -> None:
    with sky.Compute(nodes=1, options=QUIET) as pool, pool.serve("no_such_module_here:app") as endpoint:
        with pytest.raises(sky.SkywardError) as info:
            endpoint.wait_ready(timeout=60)
        assert "no_such_module_here" in str(info.value)


def test_a_startup_that_fails_names_the_replica_and_its_log_lines() -> None:
    with sky.Compute(nodes=1, options=QUIET) as pool, pool.serve(f"{APPS}:broken") as endpoint:
        with pytest.raises(sky.SkywardError) as info:
            endpoint.wait_ready(timeout=60)
        text = str(info.value)
        assert "replica 0.0" in text and "the model file is missing" in text


def test_server_sent_events_pass_through_as_they_are_produced(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with sky.Compute(nodes=1, options=QUIET) as pool, pool.serve(f"{APPS}:app", ready="/health") as endpoint:
        endpoint.wait_ready(timeout=120)
        with httpx.Client(timeout=30) as client, client.stream(
                "GET", endpoint.url + "/tokens", params={"gate": str(gate)}, headers=endpoint.headers) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines) == "data: first"  # before the last is produced: the gate is not there yet
            gate.touch()
            rest = [line for line in lines if line]
        assert rest == ["data: last"]


def test_a_killed_node_loses_no_idempotent_request_and_its_replica_comes_back() -> None:
    lost = []
    unsubscribe = sky.subscribe(lambda e: lost.append(e) if isinstance(e, sky.ReplicaLost | sky.ReplicaReady) else None)
    try:
        with sky.Compute(nodes=2, options=QUIET) as pool, pool.serve(f"{APPS}:app") as endpoint:
            endpoint.wait_ready(timeout=120)
            victim = agent_pids(pool)[1]
            with Load(endpoint) as load:
                wait_for(lambda: len(load.statuses) > 100 and len(load.pids) == 2, 30,
                         "both replicas answering before the kill")
                original = set(load.pids)
                os.kill(victim, signal.SIGKILL)
                wait_for(lambda: any(isinstance(e, sky.ReplicaLost) for e in lost), 30, "the replica lost")
                # Healing puts a new node at rank 1 and the endpoint starts its replica there.
                wait_for(lambda: sum(isinstance(e, sky.ReplicaReady) for e in lost) >= 3, 120,
                         "the replica back on the new node")
                wait_for(lambda: load.pids - original, 30, "the new replica answering")
            assert load.statuses and not load.failed(), load.failed()
    finally:
        unsubscribe()


def test_an_update_under_load_fails_no_request() -> None:
    with sky.Compute(nodes=2, options=QUIET) as pool, pool.serve(f"{APPS}:app") as endpoint:
        endpoint.wait_ready(timeout=120)
        stop = threading.Event()
        seen: list[tuple[int, int]] = []

        def load() -> None:
            with httpx.Client(base_url=endpoint.url, headers=endpoint.headers, timeout=60) as client:
                while not stop.is_set():
                    r = client.post("/predict", json={"x": 3})
                    seen.append((r.status_code, 0))
                    v = client.get("/whoami")
                    seen.append((v.status_code, v.json()["version"] if v.status_code == 200 else 0))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: len(seen) > 50, 30, "requests before the update")
            endpoint.update(f"{APPS}:make_app_v2", factory=True)
            mark = len(seen)
            wait_for(lambda: len(seen) > mark + 50, 30, "requests after the update")
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert all(status == 200 for status, _ in seen), {s for s, _ in seen if s != 200}
        assert {v for s, v in seen[mark:] if v} == {2}  # only the new version answers after it


def test_an_update_to_an_app_that_does_not_start_stops_at_the_first_replica_and_keeps_serving() -> None:
    with sky.Compute(nodes=2, options=QUIET) as pool, pool.serve(f"{APPS}:app") as endpoint:
        endpoint.wait_ready(timeout=120)
        with pytest.raises(sky.ServeError) as info:
            endpoint.update(f"{APPS}:broken")
        assert "replica 0.0" in str(info.value) and "the model file is missing" in str(info.value)
        endpoint.wait_ready(timeout=120)  # 0.0 back with the previous app; 1.0 never stopped
        with httpx.Client(base_url=endpoint.url, headers=endpoint.headers, timeout=30) as client:
            answers = [client.post("/predict", json={"x": 2}) for _ in range(20)]
        assert [a.json()["y"] for a in answers] == [5.0] * 20
        assert len({a.json()["pid"] for a in answers}) == 2


def test_a_request_wakes_an_asleep_pool_and_is_answered() -> None:
    woke = []
    unsubscribe = sky.subscribe(lambda e: woke.append(e) if isinstance(e, sky.ClusterWoke) else None)
    try:
        options = sky.Options(console=False, autoscale_idle_timeout=600)
        with sky.Compute(nodes=sky.Nodes(desired=0, max=1), options=options) as pool, \
                pool.serve(f"{APPS}:app") as endpoint:
            assert pool.current_nodes() == 0
            began = time.monotonic()
            r = httpx.get(endpoint.url + "/whoami", headers=endpoint.headers, timeout=120)
            assert r.status_code == 200, r.text
            cold = time.monotonic() - began
            events.bus.flush()
            assert woke, "the pool did not wake for the request"
            assert endpoint.stats().cold_waits == 1
            print(f"cold start of an asleep Local pool: {cold:.2f} s")
    finally:
        unsubscribe()


def test_closing_the_pool_closes_its_endpoint_and_frees_the_port() -> None:
    with sky.Compute(nodes=1, options=QUIET) as pool:
        endpoint = pool.serve(f"{APPS}:app")
        endpoint.wait_ready(timeout=120)
        url = endpoint.url
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/whoami", timeout=5)
    assert endpoint.replicas == []


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"replicas_per_node": 0}, "replicas_per_node=0"),
    ({"replicas_per_node": 2}, "sky.Worker(concurrency=2)"),
    ({"ready": "health"}, "starting with '/'"),
    ({"on": "moon"}, "on='moon'"),
    ({"on": "head"}, "sky.Worker(concurrency=2)"),  # the head's router holds a slot beside its replica
    ({"timeout": 0}, "timeout=0"),
])
def test_bad_serve_options_say_the_value_and_the_rule(kwargs: dict, words: str) -> None:
    with sky.Compute(nodes=1, options=QUIET) as pool, pytest.raises(sky.ConfigError, match=re.escape(words)):
        pool.serve(f"{APPS}:app", **kwargs)


def test_an_elastic_pool_grows_for_the_endpoints_load_and_sleeps_when_it_is_idle() -> None:
    """Scaling reads the requests, not the slots the replicas hold: one node serves until the
    requests in flight pass target_concurrency, then a second joins and takes its share; idle,
    the pool goes back to zero (its replicas with it), and the next request wakes it."""
    options = sky.Options(console=False, autoscale_cooldown=1, autoscale_idle_timeout=3,
                          reconcile_tick_interval=0.25)
    with sky.Compute(nodes=sky.Nodes(desired=1, min=0, max=2), options=options) as pool, \
            pool.serve(f"{APPS}:app", target_concurrency=2) as endpoint:
        endpoint.wait_ready(timeout=120)
        with Load(endpoint, sleep=0.3, timeout=120) as load:
            began = time.monotonic()
            wait_for(lambda: pool.current_nodes() == 2, 60, "the pool to grow to 2 nodes for 8 requests")
            print(f"grew in {time.monotonic() - began:.1f} s")
            wait_for(lambda: len(load.pids) == 2, 60, "the second node's replica to take requests")
            print(f"second replica used after {time.monotonic() - began:.1f} s")
        assert load.statuses and not load.failed(), load.failed()
        # Idle: back to the floor (0), the replicas with it; a request wakes it again.
        began = time.monotonic()
        wait_for(lambda: pool.current_nodes() == 0, 60, "the idle pool to sleep")
        print(f"asleep after {time.monotonic() - began:.1f} s")
        wait_for(lambda: endpoint.replicas == [], 30, "the replicas to end with their nodes")
        print(f"replicas gone after {time.monotonic() - began:.1f} s")
        began = time.monotonic()
        r = httpx.get(endpoint.url + "/whoami", headers=endpoint.headers, timeout=120)
        assert r.status_code == 200
        print(f"woke and answered in {time.monotonic() - began:.1f} s")
