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
    served = ssh_pool.shared.served[1]
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
    served = ssh_pool.shared.served[1]

    @sky.function
    def knock(host: str, port: int) -> bytes:
        import json

        from skyward.bootstrap.frames import HEADER, Kind

        hello = json.dumps({"token": "not the token"}).encode()
        got = b""
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(HEADER.pack(Kind.HELLO, 0, 0, 0, len(hello)) + hello)
            s.settimeout(10)
            try:
                while chunk := s.recv(100):
                    got += chunk
            except ConnectionResetError:
                pass
        return got

    # the listener's challenge (a header and its 32-byte nonce), then nothing: closed
    got = ssh_pool.run(knock(served["host"], served["port"]), target=2)
    assert len(got) == 20 + 32 and got[0] == 41


# -- the rest of the proof list, through the SSH tunnels ---------------------------------------
@sky.function
def bump_slowly(n: int) -> None:
    import time

    c = sky.counter("ssh-mid")
    for _ in range(n):
        c.increment()
        time.sleep(0.01)


def test_the_client_reads_a_counter_while_tasks_run(ssh_pool: sky.Pool) -> None:
    import time

    futures = [bump_slowly(200) > ssh_pool for _ in range(3)]  # ~2 s each
    seen = []
    while not all(f.done() for f in futures):
        seen.append(sky.counter("ssh-mid").value)
        time.sleep(0.1)
    for f in futures:
        f.result()
    assert any(0 < v < 600 for v in seen), seen  # values from the middle of the run
    assert sky.counter("ssh-mid").value == 600


@sky.function
def counting(name: str) -> Iterator[int]:
    produced = sky.counter(name)
    i = 0
    while True:
        produced.increment()
        yield i
        i += 1


@sky.function
def fails_midway() -> Iterator[int]:
    yield 1
    yield 2
    raise KeyError("third")


def test_early_break_stops_the_node_and_an_error_arrives_mid_stream(ssh_pool: sky.Pool) -> None:
    import time

    from skyward.bootstrap.stream import WINDOW_ITEMS

    for x in counting("ssh-early") >> ssh_pool:
        if x == 10:
            break
    time.sleep(1.0)
    stopped_at = sky.counter("ssh-early").value
    time.sleep(0.5)
    assert sky.counter("ssh-early").value == stopped_at  # it produces nothing more
    assert stopped_at <= 11 + WINDOW_ITEMS + 1
    got: list[int] = []
    with pytest.raises(KeyError, match="third"):
        for x in fails_midway() >> ssh_pool:
            got.append(x)
    assert got == [1, 2]


def test_a_million_item_input_stream_keeps_the_client_flat(ssh_pool: sky.Pool) -> None:
    def rss_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

    assert (total(iter(range(10))) >> ssh_pool) == 45  # warm up
    before = rss_mb()
    assert (total(i for i in range(1_000_000)) >> ssh_pool) == sum(range(1_000_000))
    assert rss_mb() - before < 100


def test_the_process_executor_shares_one_object_across_hosts(three_hosts: SSHHosts) -> None:
    with sky.Compute(provider=provider(three_hosts), nodes=3, options=QUIET,
                     worker=sky.Worker(concurrency=2, executor="process")) as pool:
        futures = [bump(250, consistency) > pool for consistency in ("strong", "eventual") for _ in range(6)]
        for f in futures:
            f.result()
        assert sky.counter("ssh-strong").value == 1500
        assert sky.counter("ssh-eventual").value == 1500
