"""Distributed collections on real Local pools: one object per name for every task, on every
node, under both executors and from the client; strong and eventual consistency; waits that end;
locks released when their holder dies; the listener admits only the pool's token."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import skyward as sky
from skyward.bootstrap.frames import HEADER, Kind
from skyward.bootstrap.handshake import AGENT, COLLECTIONS, derive
from skyward.bootstrap.state import StateConnection

pytestmark = pytest.mark.timeout(180)
QUIET = sky.Options(console=False)


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.Pool]:
    """2 nodes x 4 slots (thread executor)."""
    with sky.Compute(nodes=2, worker=sky.Worker(concurrency=4), options=QUIET) as p:
        yield p


@sky.function
def bump(name: str, n: int, consistency: str) -> int:
    c = sky.counter(name, consistency=consistency)  # type: ignore[arg-type]
    for _ in range(n):
        c.increment()
    return sky.instance_info().node


@pytest.mark.parametrize("consistency", ["strong", "eventual"])
def test_counter_is_exact_after_10000_increments_from_2_nodes_x_4_slots(pool: sky.Pool, consistency: str) -> None:
    name = f"exact-{consistency}"
    futures = [bump(name, 1250, consistency) > pool for _ in range(8)]
    nodes = {f.result() for f in futures}
    assert nodes == {0, 1}
    assert sky.counter(name).value == 10_000


@sky.function
def read_modify_write(rounds: int) -> None:
    d, lock = sky.dict("balances"), sky.lock("balances-lock", timeout=60)
    for _ in range(rounds):
        with lock:
            d["total"] = d.get("total", 0) + 1  # a lost update without the lock


def test_lock_makes_a_read_modify_write_on_a_dict_exact_under_contention(pool: sky.Pool) -> None:
    futures = [read_modify_write(50) > pool for _ in range(8)]
    for f in futures:
        f.result()
    assert sky.dict("balances")["total"] == 400


@sky.function
def produce(n: int) -> int:
    q = sky.queue("jobs")
    for i in range(n):
        q.put({"job": i})
    for _ in range(4):
        q.put(None)  # one stop marker per consumer
    return sky.instance_info().node


@sky.function
def consume() -> tuple[int, list[int]]:
    q, got = sky.queue("jobs"), []
    while (item := q.get(timeout=60)) is not None:
        got.append(item["job"])
    return sky.instance_info().node, got


def test_queue_producer_on_one_node_consumers_on_two(pool: sky.Pool) -> None:
    consumers = [pool.run_async(consume(), target=t) for t in (0, 0, 1, 1)]
    assert pool.run(produce(200), target=1) == 1
    results = [f.result() for f in consumers]
    assert {node for node, _ in results} == {0, 1}
    taken = sorted(j for _, jobs in results for j in jobs)
    assert taken == list(range(200))  # every job once, none twice
    for _, jobs in results:
        assert jobs == sorted(jobs)  # FIFO as each consumer sees it
    assert sky.queue("jobs").empty() and len(sky.queue("jobs")) == 0


@sky.function
def get_or_none(name: str, timeout: float) -> tuple[int, bool, float]:
    start = time.monotonic()
    item = sky.queue(name).get(timeout=timeout)
    return sky.instance_info().node, item is None, time.monotonic() - start


def test_queue_get_gives_none_when_its_timeout_passes_as_in_the_reference(pool: sky.Pool) -> None:
    # Code written for the reference project tests `if item is None` after get(timeout=...).
    q = sky.queue("nothing-comes")
    start = time.monotonic()
    assert q.get(timeout=0.3) is None
    assert 0.25 < time.monotonic() - start < 3
    assert q.get(timeout=0) is None
    assert q.get_async(timeout=0.2).result() is None

    async def main() -> object:
        return await q.get_async(timeout=0.2)

    assert asyncio.run(main()) is None
    # On the head node and on the other one (its own connection to the head's server).
    for node in (0, 1):
        got_node, was_none, took = pool.run(get_or_none("nothing-comes", 0.3), target=node)
        assert (got_node, was_none) == (node, True) and took >= 0.25
    # Asked for, the timeout is an error still, and the async twin says so the same way.
    with pytest.raises(sky.CollectionTimeoutError, match="stayed empty"):
        q.get(timeout=0.1, raise_on_timeout=True)
    with pytest.raises(sky.CollectionTimeoutError, match="does not wait"):
        q.get_async(timeout=0, raise_on_timeout=True).result()
    # A get that gave up took nothing: the next item goes to the next get.
    q.put("late")
    assert q.get(timeout=5) == "late" and q.empty()
    with pytest.raises(sky.ConfigError, match="raise_on_timeout='yes'"):
        q.get(timeout=1, raise_on_timeout="yes")  # type: ignore[arg-type]


@sky.function
def set_and_dict_methods() -> dict[str, object]:
    s, d = sky.set("s"), sky.dict("d")
    s.add("a")
    s.add("b")
    s.discard("b")
    s.discard("never there")
    d["x"] = [1, 2, 3]
    d.update({"y": 2, "z": 3})
    d.update([("w", 4)])
    del d["z"]
    missing = None
    try:
        d["nope"]
    except KeyError as exc:
        missing = str(exc)
    return {
        "in": "a" in s, "not_in": "b" in s, "len": len(s), "x": d["x"], "get": d.get("q", 7),
        "has_y": "y" in d, "has_z": "z" in d, "pop": d.pop("w"), "pop_missing": d.pop("w", "gone"),
        "missing": missing, "no_items": not hasattr(d, "items") and not hasattr(s, "remove"),
    }


def test_every_reference_method_works_from_a_task_and_the_client(pool: sky.Pool) -> None:
    got = set_and_dict_methods() >> pool
    assert got == {"in": True, "not_in": False, "len": 1, "x": [1, 2, 3], "get": 7, "has_y": True,
                   "has_z": False, "pop": 4, "pop_missing": "gone", "missing": "'nope'", "no_items": True}
    c = sky.counter("client-side")
    assert c.increment(5) == 5 and c.decrement() == 4 and int(c) == 4
    c.reset(10)
    assert c.value == 10
    q = sky.queue("client-q")
    q.put("hello")
    assert len(q) == 1 and q.get() == "hello" and q.empty()


def test_async_variants_are_futures_and_awaitables(pool: sky.Pool) -> None:
    c, d = sky.counter("async"), sky.dict("async-d")
    assert c.increment_async(3).result() == 3
    d.set_async("k", "v").result()

    async def main() -> tuple[int, str, bool]:
        return await c.increment_async(), await d.get_async("k"), await d.contains_async("k")

    assert asyncio.run(main()) == (4, "v", True)
    names = {m for cls in (sky.dict, sky.set, sky.counter, sky.queue) for m in dir(type(cls("n")))}
    for method in ("get", "update", "pop", "add", "discard", "increment", "decrement", "reset", "put"):
        assert f"{method}_async" in names


def test_large_values_travel_out_of_band(pool: sky.Pool) -> None:
    np = pytest.importorskip("numpy")

    @sky.function
    def store() -> None:
        sky.dict("arrays")["a"] = np.arange(2_000_000, dtype=np.float64)

    store() >> pool
    got = sky.dict("arrays")["a"]
    assert got.shape == (2_000_000,) and float(got[-1]) == 1_999_999.0


@sky.function
def slow_map_item(x: int) -> int:
    time.sleep(0.01)
    sky.counter("progress").increment()
    return x


def test_the_client_reads_a_counter_while_a_map_runs(pool: sky.Pool) -> None:
    seen: list[int] = []
    result: list[list[int]] = []
    t = threading.Thread(target=lambda: result.append(pool.map(slow_map_item, range(300), chunksize=5)))
    progress = sky.counter("progress")
    t.start()
    while t.is_alive():
        seen.append(progress.value)
        time.sleep(0.02)
    t.join()
    assert result[0] == list(range(300))
    assert progress.value == 300
    assert any(0 < v < 300 for v in seen), seen  # watched it move, not just the end


def test_eventual_writes_batch_and_reads_see_own_writes(pool: sky.Pool) -> None:
    @sky.function
    def writer() -> tuple[int, bool]:
        c, s = sky.counter("ev", consistency="eventual"), sky.set("ev-set", consistency="eventual")
        for i in range(1000):
            c.increment()
            s.add(i % 10)
        assert c.increment() is None  # buffered: no new value to report
        return c.value, 3 in s  # a process reads its own writes

    own = [writer() > pool for _ in range(4)]
    for f in own:
        value, member = f.result()
        assert value >= 1001 and member
    assert sky.counter("ev").value == 4004
    assert len(sky.set("ev-set")) == 10


@sky.function
def die_holding(name: str) -> None:
    sky.lock(name).acquire()
    os._exit(3)


def test_a_lock_whose_holder_died_is_released_with_a_log_event() -> None:
    logs: list[str] = []
    unsubscribe = sky.subscribe(lambda e: logs.append(e.message) if isinstance(e, sky.Log) else None)
    try:
        with sky.Compute(nodes=2, options=QUIET) as p:
            with pytest.raises(sky.WorkerDiedError):
                p.run(die_holding("held"), target=1)

            @sky.function
            def take() -> bool:
                return sky.lock("held", timeout=20).acquire()

            assert p.run(take(), target=0) is True
            deadline = time.monotonic() + 10
            while not any("lock 'held' released" in m for m in logs) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        unsubscribe()
    assert any("lock 'held' released" in m and "node 1" in m for m in logs), logs


def test_waits_end_with_clear_errors(pool: sky.Pool) -> None:
    with pytest.raises(sky.CollectionTimeoutError, match="stayed empty"):
        sky.queue("empty").get(timeout=0.2, raise_on_timeout=True)

    @sky.function
    def hold(seconds: float) -> None:
        with sky.lock("busy"):
            time.sleep(seconds)

    held = hold(3) > pool
    time.sleep(0.5)
    start = time.monotonic()
    with pytest.raises(sky.CollectionTimeoutError, match="lock 'busy' was not acquired"):
        sky.lock("busy", timeout=0.5).acquire()
    assert time.monotonic() - start < 2.5
    held.result()
    with pytest.raises(sky.CollectionError, match="not held"):
        sky.lock("busy").release()
    with pytest.raises(sky.CollectionTimeoutError, match="barrier 'alone' is broken"):
        sky.barrier("alone", 2).wait(timeout=0.3)
    with pytest.raises(sky.CollectionError, match="n=2"):
        sky.barrier("alone", 3)


@sky.function
def phased(name: str, n: int) -> tuple[int, float]:
    b = sky.barrier(name, n)
    time.sleep(0.3 * sky.instance_info().node)  # arrive at different times
    b.wait(timeout=60)
    return sky.instance_info().node, time.monotonic()


def test_barrier_across_3_nodes() -> None:
    with sky.Compute(nodes=3, options=QUIET) as p:
        results = phased("sync", 3) @ p
    assert [n for n, _ in results] == [0, 1, 2]
    times = [t for _, t in results]
    assert max(times) - min(times) < 0.25  # released together, after the last (0.6 s late) arrived


def test_process_executor_and_nested_tasks_share_one_object() -> None:
    @sky.function
    def inner() -> int:
        return sky.counter("nested").increment() or 0

    @sky.function
    def outer() -> int:
        sky.counter("nested").increment()
        return inner()  # a @sky.function called inside a task runs there

    with sky.Compute(nodes=2, worker=sky.Worker(concurrency=2, executor="process"), options=QUIET) as p:
        futures = [bump("proc", 500, "strong") > p for _ in range(4)]
        futures += [bump("proc-ev", 500, "eventual") > p for _ in range(4)]
        for f in futures:
            f.result()
        assert sky.counter("proc").value == 2000
        assert sky.counter("proc-ev").value == 2000
        assert (outer() >> p) == 2



def _count_nested(i: int) -> int:
    sky.counter("nested-joblib").increment()
    return os.getpid()


def test_nested_tasks_a_task_fans_out_share_one_object() -> None:
    pytest.importorskip("joblib")

    @sky.function
    def fan_out() -> set[int]:
        from joblib import Parallel, delayed

        sky.counter("nested-joblib").increment()
        return set(Parallel(n_jobs=-1)(delayed(_count_nested)(i) for i in range(40)))

    with sky.Compute(nodes=2, plugins=[sky.plugins.joblib()], options=QUIET) as p:
        pids = fan_out() >> p  # the nested batches go through the client to both nodes
        assert len(pids) >= 2
        assert sky.counter("nested-joblib").value == 41


def test_outside_a_pool_and_with_cluster_false_the_factories_say_so() -> None:
    # A process with no pool open. (A thread of this one would find the module's pool, the one
    # pool open in the process: threads a program starts inside its `with` block use it.)
    code = ("import skyward as sky\ntry:\n    sky.counter('c')\nexcept sky.NoActivePoolError as exc:\n"
            "    print('refused:', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("refused:") and "sky.counter('c')" in out.stdout, out.stdout + out.stderr
    with pytest.raises(sky.ConfigError, match="consistency"):
        sky.dict("d", consistency="sometimes")  # type: ignore[arg-type]
    with sky.Compute(nodes=1, options=sky.Options(console=False, cluster=False)) as p:
        with pytest.raises(sky.ConfigError, match=r"sky\.queue\('q'\).*cluster=False"):
            sky.queue("q")

        @sky.function
        def on_node() -> str:
            try:
                sky.lock("l")
            except sky.ConfigError as exc:
                return str(exc)
            return "no error"

        assert "cluster=False" in (on_node() >> p)


def test_lock_is_callable_after_a_pool(pool: sky.Pool) -> None:
    """`sky.lock` stays the factory even once every skyward module is imported."""
    assert callable(sky.lock)
    assert isinstance(sky.lock("callable"), type(sky.lock("again")))


def test_the_listener_admits_only_the_pool_key(pool: sky.Pool) -> None:
    where = pool.shared.served[1]
    # Local: a Unix socket in the head node's 0700 folder, no TCP port
    assert where["host"].startswith("/") and where["port"] == 0
    assert os.stat(os.path.dirname(where["host"])).st_mode & 0o077 == 0
    for hello in (b'{"token": "wrong"}', b"x" * 10_000):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(where["host"])
            s.sendall(HEADER.pack(Kind.HELLO, 0, 0, 0, len(hello)) + hello)
            assert _drain(s).startswith(HEADER.pack(Kind.CHALLENGE, 0, 0, 0, 32)[:1])  # then closed
    # with the collections key a peer is served (what every worker does)...
    key = derive(pool.cluster.token, COLLECTIONS).hex()
    conn = StateConnection(where["host"], 0, key, node=0)
    conn.close()
    # ...and not with the agents' key, nor the secret itself
    for wrong in (derive(pool.cluster.token, AGENT).hex(), pool.cluster.token.encode().hex()):
        with pytest.raises(ConnectionError, match="refused"):
            StateConnection(where["host"], 0, wrong, node=0)


def _drain(s: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except ConnectionResetError:  # closed with our bytes unread
        pass
    return got


def _agent_pid(pool: sky.Pool, rank: int) -> int:
    by_index = {n["index"]: n["pid"] for n in pool.cluster.describe()["nodes"]}
    return int(by_index[pool.members.channels[rank].node])


def _wait(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@sky.function
def read_twice(name: str) -> tuple[str, int]:
    """The first operation after a head loss raises; the next one works, on the new head."""
    try:
        first = f"no error: {sky.counter(name).value}"
    except sky.CollectionError as exc:
        first = str(exc)
    return first, sky.counter(name).value


def test_losing_the_head_node_is_said_once_per_process_never_silent() -> None:
    replaced: list[sky.InstanceReplaced] = []
    with sky.Compute(nodes=2, options=QUIET) as p:
        p.subscribe(lambda e: replaced.append(e) if isinstance(e, sky.InstanceReplaced) else None)
        for _ in range(5):
            p.run(bump("kept", 1, "strong"), target=1)  # node 1's worker holds a connection
        assert sky.counter("kept").value == 5
        os.kill(_agent_pid(p, 0), signal.SIGKILL)
        _wait(lambda: replaced and p.current_nodes() == 2, 60)
        with pytest.raises(sky.CollectionError, match=r"collections were lost: node \d+, the head"):
            print(sky.counter("kept").value)  # the client: no silent 0
        assert sky.counter("kept").increment(2) == 2  # then a fresh state, served by the new head
        for rank in (1, 0):  # the surviving node reaches the new head too, not the dead address
            first, value = p.run(read_twice("kept"), target=rank)
            assert "collections were lost" in first and value == 2


@sky.function
def hold_forever(name: str) -> None:
    lock = sky.lock(name, timeout=60)
    lock.acquire()
    sky.dict("holders")[name] = (os.getpid(), os.getppid())  # (worker, agent)
    time.sleep(600)


def test_a_lock_held_on_a_node_that_went_silent_is_released_when_the_node_is_lost() -> None:
    """A frozen node keeps its sockets open (the kernel still answers keepalives): the lock is
    released because the client tells the head the node is lost, not by a socket timing out."""
    logs: list[str] = []
    stopped: list[int] = []
    unsubscribe = sky.subscribe(lambda e: logs.append(e.message) if isinstance(e, sky.Log) else None)
    try:
        with sky.Compute(nodes=2, options=QUIET) as p:
            p.run_async(hold_forever("frozen"), target=1)
            _wait(lambda: sky.dict("holders").get("frozen") is not None, 30)
            stopped.extend(sky.dict("holders")["frozen"])
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            start = time.monotonic()
            assert sky.lock("frozen", timeout=45).acquire() is True
            assert time.monotonic() - start < 30  # ~10 s of silence, then released at once
            _wait(lambda: any("lock 'frozen' released" in m for m in logs), 10)
    finally:
        unsubscribe()
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert any("lock 'frozen' released" in m and "which the client lost" in m for m in logs), logs
