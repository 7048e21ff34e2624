"""Collections and streaming on real sshd hosts (tests/sshhosts.py): the head node's agent
serves the state on its private address, the other hosts reach it over the private bridge,
the client through its SSH tunnel to the head; generator tasks stream through the tunnels."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from sshhosts import SSHHosts

import skyward as sky

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


def provider(hosts: SSHHosts) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts])


@pytest.fixture(scope="module")
def ssh_pool(three_hosts: SSHHosts) -> Iterator[sky.Pool]:
    with sky.Compute(provider=provider(three_hosts), nodes=3, worker=sky.Worker(concurrency=4),
                     options=QUIET) as pool:
        yield pool


@sky.function
def bump(n: int, consistency: str) -> str:
    c = sky.counter(f"ssh-{consistency}", consistency=consistency)  # type: ignore[arg-type]
    for _ in range(n):
        c.increment()
    return socket.gethostname()


@pytest.mark.parametrize("consistency", ["strong", "eventual"])
def test_counter_exact_from_every_host(ssh_pool: sky.Pool, consistency: str) -> None:
    futures = [bump(1250, consistency) > ssh_pool for _ in range(8)]
    for f in futures:
        f.result()
    assert sky.counter(f"ssh-{consistency}").value == 10_000


@sky.function
def meet(n: int) -> dict[str, Any]:
    info = sky.instance_info()
    sky.barrier("ssh-sync", n).wait(timeout=60)
    d = sky.dict("ssh-hosts")
    with sky.lock("ssh-hosts-lock", timeout=60):
        d["seen"] = [*d.get("seen", []), info.node]
    return {"node": info.node, "head": info.head_addr}


def test_barrier_lock_and_dict_across_three_hosts(ssh_pool: sky.Pool, three_hosts: SSHHosts) -> None:
    results = meet(3) @ ssh_pool
    assert [r["node"] for r in results] == [0, 1, 2]
    assert sorted(sky.dict("ssh-hosts")["seen"]) == [0, 1, 2]
    served = ssh_pool._state_served[1]
    assert served["host"] == three_hosts[0].address  # the head's private address, not 0.0.0.0
    assert served["host"] not in ("0.0.0.0", "127.0.0.1")


@sky.function
def produce(n: int) -> None:
    q = sky.queue("ssh-jobs")
    for i in range(n):
        q.put(i)
    for _ in range(2):
        q.put(None)


@sky.function
def consume() -> list[int]:
    q, got = sky.queue("ssh-jobs"), []
    while (item := q.get(timeout=60)) is not None:
        got.append(item)
    return got


def test_queue_producer_on_one_host_consumers_on_two(ssh_pool: sky.Pool) -> None:
    consumers = [ssh_pool.run_async(consume(), target=t) for t in (1, 2)]
    ssh_pool.run(produce(100), target=0)
    taken = sorted(x for f in consumers for x in f.result())
    assert taken == list(range(100))


@sky.function
def numbers(n: int) -> Iterator[int]:
    yield from range(n)


@sky.function
def total(xs: Iterator[int]) -> int:
    return sum(xs)


def test_streams_through_the_ssh_tunnel(ssh_pool: sky.Pool) -> None:
    assert sum(numbers(50_000) >> ssh_pool) == sum(range(50_000))
    for x in numbers(10**9) >> ssh_pool:
        if x == 3:
            break
    assert (total(iter(range(50_000))) >> ssh_pool) == sum(range(50_000))


def test_the_state_listener_refuses_a_wrong_token(ssh_pool: sky.Pool) -> None:
    served = ssh_pool._state_served[1]

    @sky.function
    def knock(host: str, port: int) -> bytes:
        import json

        from skyward.bootstrap.frames import HEADER, Kind

        hello = json.dumps({"token": "not the token"}).encode()
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(HEADER.pack(Kind.HELLO, 0, 0, 0, len(hello)) + hello)
            s.settimeout(10)
            return s.recv(100)

    assert ssh_pool.run(knock(served["host"], served["port"]), target=2) == b""
