"""The serving router against real uvicorn replicas on Unix sockets, through real TCP clients."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from skyward.errors import ConfigError
from skyward.serve.router import AccessRecord, Router
from tests.helpers import free_port, wait_for, within
from tests.serve.conftest import Replica


def started(routers: list[Router], *replicas: Replica, max_concurrency: int = 0, **kw) -> tuple[Router, str]:
    kw.setdefault("token", None)
    router = Router(**kw)
    routers.append(router)
    host, port = router.start()
    for r in replicas:
        router.add(r.upstream(max_concurrency))
    return router, f"http://{host}:{port}"


def in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def outcome(t: threading.Thread, box: dict, seconds: float = 30):
    t.join(seconds)
    assert not t.is_alive(), "the request got no answer"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_many_concurrent_requests_each_answered(pair: list[Replica], routers: list[Router]) -> None:
    records: list[AccessRecord] = []
    router, url = started(routers, *pair, access_log=records.append)
    with httpx.Client(base_url=url, timeout=30) as client:
        def one(i: int) -> tuple[int, str]:
            r = client.get(f"/echo?i={i}")
            assert r.status_code == 200, r.text
            assert r.json()["query"] == f"i={i}"
            return i, r.json()["replica"]

        with ThreadPoolExecutor(12) as ex:
            answers = list(ex.map(one, range(120)))
    assert [i for i, _ in answers] == list(range(120))
    assert {name for _, name in answers} == {"a", "b"}
    stats = wait_for(lambda: (s := router.stats()).total == 120 and s, 10, "120 requests counted")
    assert stats.total == 120 and stats.by_status == {200: 120}
    assert stats.in_flight == 0 and stats.queued == 0 and stats.replicas == ("a", "b")
    assert stats.latency_buckets[-1] == (float("inf"), 120)
    assert len(records) == 120 and {r.path for r in records} == {"/echo"}
    assert all(r.status == 200 and r.replica in ("a", "b") and r.client == "127.0.0.1" for r in records)


def test_upstream_connections_are_reused(pair: list[Replica], routers: list[Router]) -> None:
    router, url = started(routers)
    opened = []
    for r in pair[:1]:
        up = r.upstream()
        real = up.connect

        async def counting(real=real):
            opened.append(1)
            return await real()

        up.connect = counting
        router.add(up)
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(30):
            assert client.get(f"/echo?i={i}").json()["query"] == f"i={i}"
            assert client.post("/echo", content=b"x" * 1000).json()["body"] == "x" * 1000
            assert client.head("/fixed").headers["content-length"] == "10"
    assert len(opened) <= 11, f"{len(opened)} connections for 90 sequential requests"


def test_least_outstanding_sends_next_requests_elsewhere(pair: list[Replica], routers: list[Router],
                                                        tmp_path: Path) -> None:
    router, url = started(routers, *pair)
    mark = tmp_path / "slow"
    with httpx.Client(base_url=url, timeout=30) as client:
        t, box = in_thread(client.get, f"/slow?s=2&mark={mark}")
        busy = wait_for(lambda: mark.exists() and mark.read_text(), 20, "the slow request to start")
        others = {client.get("/echo").json()["replica"] for _ in range(6)}
        assert others == ({"a", "b"} - {busy}), f"{busy} is busy, yet {others} answered"
        assert router.stats().per_replica == {busy: 1}
        assert outcome(t, box).json()["replica"] == busy


def test_max_concurrency_queues_then_refuses_past_max_queue(pair: list[Replica], routers: list[Router],
                                                           tmp_path: Path) -> None:
    router, url = started(routers, pair[0], max_concurrency=1, max_queue=1)
    with httpx.Client(base_url=url, timeout=30) as client:
        first = in_thread(client.get, "/slow?s=1.5")
        wait_for(lambda: router.stats().in_flight == 1, 20, "the first request in flight")
        second = in_thread(client.get, "/slow?s=0.1")
        wait_for(lambda: router.stats().queued == 1, 20, "the second request queued")
        assert router.stats().per_replica == {"a": 1}
        third = client.get("/echo")
        assert third.status_code == 503 and third.headers["retry-after"] == "1"
        assert outcome(*first).status_code == 200
        assert outcome(*second).status_code == 200
    stats = wait_for(lambda: (s := router.stats()).total == 3 and s, 10, "three requests counted")
    assert stats.by_status == {200: 2, 503: 1} and stats.queued == 0


def test_timeout_answers_504(pair: list[Replica], routers: list[Router]) -> None:
    records: list[AccessRecord] = []
    _router, url = started(routers, *pair, timeout=0.5, access_log=records.append)
    with httpx.Client(base_url=url, timeout=30) as client:
        began = time.monotonic()
        r = client.get("/slow?s=5")
        assert r.status_code == 504 and time.monotonic() - began < 3
        assert client.get("/echo").status_code == 200  # the router still serves
    wait_for(lambda: len(records) == 2, 10, "two access records")
    assert [x.status for x in records] == [504, 200]


def test_bearer_token(pair: list[Replica], routers: list[Router]) -> None:
    records: list[AccessRecord] = []
    router, url = started(routers, *pair, token="s3cret-token", access_log=records.append)
    with httpx.Client(base_url=url, timeout=30) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
            r = client.get("/echo", headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert "replica" not in r.text and "a" not in r.text.replace("unauthorized", "")
        r = client.get("/echo", headers={"Authorization": "Bearer s3cret-token", "X-Forwarded-For": "10.1.2.3"})
        assert r.status_code == 200
        seen = r.json()["headers"]
        assert "authorization" not in seen
        assert seen["x-forwarded-for"] == "10.1.2.3, 127.0.0.1"
        r = client.post("/echo", content=b"body", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
    wait_for(lambda: len(records) == 5, 10, "five access records")
    assert [x.status for x in records] == [401, 401, 401, 200, 401]
    assert "s3cret" not in repr(records) and "s3cret" not in repr(router.stats())


def test_server_sent_events_arrive_as_produced(pair: list[Replica], routers: list[Router], tmp_path: Path) -> None:
    _router, url = started(routers, *pair)
    gate = tmp_path / "gate"
    with httpx.Client(base_url=url, timeout=30) as client, \
            client.stream("GET", f"/events?gate={gate}") as r:
        assert r.status_code == 200
        chunks = r.iter_raw()
        first = within(10, next, chunks)  # the app sends "last" only once the gate exists
        assert first.startswith(b"data: first") and not gate.exists()
        gate.write_text("open")
        rest = first + b"".join(chunks)
    assert rest == b"data: first\n\ndata: last\n\n"


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_large_upload_streams(pair: list[Replica], routers: list[Router], tmp_path: Path, framing: str) -> None:
    _router, url = started(routers, pair[0])
    mark = tmp_path / "started"
    size, piece = 50 * 1024 * 1024, b"y" * (1024 * 1024)

    def body():
        for i in range(size // len(piece)):
            if i == 8:  # the app must see bytes before the client has sent the rest
                wait_for(mark.exists, 20, "the app to get the first bytes while the upload goes on")
            yield piece

    headers = {"Content-Length": str(size)} if framing == "content-length" else {}
    with httpx.Client(base_url=url, timeout=60) as client:
        r = client.post(f"/upload?mark={mark}", content=body(), headers=headers)
    assert r.status_code == 200 and r.json()["bytes"] == size


def test_websocket_echo(pair: list[Replica], routers: list[Router]) -> None:
    from websockets.sync.client import connect

    router, url = started(routers, pair[0], token="tok")
    with connect(url.replace("http", "ws") + "/ws", additional_headers={"Authorization": "Bearer tok"},
                 open_timeout=10) as ws:
        for text in ("hello", "x" * 100_000, "bye"):
            ws.send(text)
            assert ws.recv(timeout=10) == f"a:{text}"
    wait_for(lambda: router.stats().in_flight == 0, 10, "the websocket to end")
    assert router.stats().by_status == {101: 1}


def test_replica_killed_during_get_is_retried_elsewhere(own_pair: list[Replica], routers: list[Router],
                                                      tmp_path: Path) -> None:
    _router, url = started(routers, *own_pair)
    mark = tmp_path / "slow"
    with httpx.Client(base_url=url, timeout=30) as client:
        t, box = in_thread(client.get, f"/slow?s=1&mark={mark}")
        busy = wait_for(lambda: mark.exists() and mark.read_text(), 20, "the slow request to start")
        mark.unlink()
        next(r for r in own_pair if r.name == busy).kill()
        r = outcome(t, box)
        assert r.status_code == 200 and r.json()["replica"] == ({"c", "d"} - {busy}).pop()


def test_replica_killed_during_post_is_502(own_pair: list[Replica], routers: list[Router], tmp_path: Path) -> None:
    _router, url = started(routers, *own_pair)
    mark = tmp_path / "slow"
    with httpx.Client(base_url=url, timeout=30) as client:
        t, box = in_thread(client.post, f"/slow?s=5&mark={mark}", content=b"payload")
        busy = wait_for(lambda: mark.exists() and mark.read_text(), 20, "the slow request to start")
        next(r for r in own_pair if r.name == busy).kill()
        r = outcome(t, box)
        assert r.status_code == 502 and f"replica {busy} was lost" in r.text


def test_removed_as_lost_retries_idempotent_requests(own_pair: list[Replica], routers: list[Router],
                                                     tmp_path: Path) -> None:
    router, url = started(routers, *own_pair)
    mark = tmp_path / "slow"
    with httpx.Client(base_url=url, timeout=30) as client:
        t, box = in_thread(client.post, f"/slow?s=5&mark={mark}", content=b"p", headers={"Idempotency-Key": "k1"})
        busy = wait_for(lambda: mark.exists() and mark.read_text(), 20, "the slow request to start")
        router.remove(busy, lost=True)
        r = outcome(t, box)
        assert r.status_code == 200 and r.json()["replica"] != busy
        assert router.stats().replicas == tuple(sorted({"c", "d"} - {busy}))


def test_connect_failure_is_502_naming_the_replica(pair: list[Replica], routers: list[Router],
                                                   tmp_path: Path) -> None:
    ghost = Replica.__new__(Replica)
    ghost.name, ghost.path = "9.0", tmp_path / "nobody.sock"
    router, url = started(routers, ghost)
    with httpx.Client(base_url=url, timeout=30) as client:
        r = client.get("/echo")
        assert r.status_code == 502 and "could not connect to replica 9.0" in r.text
        router.add(pair[0].upstream())
        answers = {client.get("/echo").json()["replica"] for _ in range(6)}  # failed over to a
        assert answers == {"a"}
    assert router.stats().replicas == ("9.0", "a")  # only the coordinator removes replicas


def test_remove_drains(pair: list[Replica], routers: list[Router], tmp_path: Path) -> None:
    router, url = started(routers, *pair)
    mark = tmp_path / "slow"
    with httpx.Client(base_url=url, timeout=30) as client:
        t, box = in_thread(client.get, f"/slow?s=1.5&mark={mark}")
        busy = wait_for(lambda: mark.exists() and mark.read_text(), 20, "the slow request to start")
        router.remove(busy, lost=False)
        assert router.stats().replicas == tuple({"a", "b"} - {busy})
        assert not router.wait_drained(busy, 0.1)
        assert {client.get("/echo").json()["replica"] for _ in range(6)} == {"a", "b"} - {busy}
        assert router.wait_drained(busy, 20)
        r = outcome(t, box)
        assert r.status_code == 200 and r.json()["replica"] == busy
    wait_for(lambda: router.stats().per_replica == {}, 10, "nothing in flight")


def test_no_replicas_wakes_the_pool_once_and_waits(pair: list[Replica], routers: list[Router]) -> None:
    calls: list[float] = []
    router, url = started(routers, on_demand=lambda: calls.append(time.monotonic()))
    with httpx.Client(base_url=url, timeout=30) as client:
        waiting = [in_thread(client.get, f"/echo?i={i}") for i in range(3)]
        wait_for(lambda: router.stats().queued == 3, 20, "three requests waiting")
        time.sleep(0.2)
        assert len(calls) == 1 and router.stats().cold_waits == 3
        router.add(pair[1].upstream())
        assert [outcome(*w).json()["replica"] for w in waiting] == ["b"] * 3
    assert len(calls) == 1


def test_close_leaves_no_thread_and_no_socket(pair: list[Replica]) -> None:
    def sockets() -> int:
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            except OSError:
                pass  # the listing's own descriptor, closed by now
        return count

    before = sockets()
    router = Router(token=None)
    host, port = router.start()
    router.add(pair[0].upstream())
    raw = socket.create_connection((host, port))
    raw.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += raw.recv(65536)
    assert head.startswith(b"HTTP/1.1 200")
    head, _, body = head.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(body) < length:  # the body may come in a segment of its own
        body += raw.recv(65536)
    router.close()
    raw.settimeout(10)
    assert raw.recv(65536) == b""  # the open keep-alive connection was ended
    raw.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("skyward-serve")]
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=5).close()
    assert sockets() == before
    router.close()  # twice is fine


def test_port_in_use_is_a_config_error() -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        router = Router(token=None)
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}.*in use"):
            router.start("127.0.0.1", port)
    assert not [t for t in threading.enumerate() if t.name.startswith("skyward-serve")]


def test_pipelined_requests_answered_in_order_and_garbage_refused(pair: list[Replica], routers: list[Router]) -> None:
    router, url = started(routers, *pair)
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"GET /echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                    b"POST /echo?n=2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                    b"GET /echo?n=3 HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while got.count(b'"query"') < 3:
            data = raw.recv(65536)
            assert data, got
            got += data
        assert got.index(b"n=1") < got.index(b"n=2") < got.index(b"n=3")
        assert b'"body":"abc"' in got
        raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        rest = b""
        while data := raw.recv(65536):
            rest += data
        assert rest.startswith(b"HTTP/1.1 400")
    assert router.stats().by_status == {200: 3}
