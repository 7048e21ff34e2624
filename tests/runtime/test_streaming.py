"""Streaming on real Local pools: generator tasks yield as they go, with backpressure; breaking
out stops the node; errors arrive mid-stream with their type; iterator arguments stream in
lazily with the client's memory flat."""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from typing import Any

import pytest

import skyward as sky

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.Pool]:
    with sky.Compute(nodes=2, worker=sky.Worker(concurrency=2), options=sky.Options(console=False)) as p:
        yield p


@sky.function
def ticks(n: int, every: float) -> Iterator[tuple[int, float]]:
    for i in range(n):
        yield i, time.time()
        time.sleep(every)


def test_values_arrive_as_the_node_yields_them(pool: sky.Pool) -> None:
    arrivals = [(i, sent, time.time()) for i, sent in ticks(5, 0.3) >> pool]
    assert [i for i, _, _ in arrivals] == [0, 1, 2, 3, 4]
    first_at = arrivals[0][2]
    assert arrivals[-1][2] - first_at > 1.0  # not all at the end: the first came 1.2 s earlier
    assert all(got - sent < 0.25 for _, sent, got in arrivals)


@sky.function
def counting(name: str) -> Iterator[int]:
    produced = sky.counter(name)
    i = 0
    try:
        while True:
            produced.increment()
            yield i
            i += 1
    finally:
        sky.dict("finally")[name] = "ran"


def test_breaking_out_stops_the_generator_on_the_node(pool: sky.Pool) -> None:
    for x in counting("early") >> pool:
        if x == 10:
            break
    produced = sky.counter("early")
    deadline = time.monotonic() + 10
    while sky.dict("finally").get("early") != "ran" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sky.dict("finally").get("early") == "ran"  # GeneratorExit at its yield: finally ran
    stopped_at = produced.value
    time.sleep(0.5)
    assert produced.value == stopped_at  # it produces nothing more
    from skyward.bootstrap.stream import WINDOW_ITEMS

    assert stopped_at <= 11 + WINDOW_ITEMS + 1  # it never ran further ahead than its window
    assert (sky.function(lambda: "slot free")() >> pool) == "slot free"


def test_a_slow_consumer_holds_the_node_back(pool: sky.Pool) -> None:
    from skyward.bootstrap.stream import WINDOW_ITEMS

    stream = counting("slow") >> pool
    for _ in range(5):
        next(stream)
    time.sleep(1.0)  # consume nothing for a while
    assert sky.counter("slow").value <= WINDOW_ITEMS + 5 + 1
    stream.close()


@sky.function
def fails_midway() -> Iterator[int]:
    yield 1
    yield 2
    raise KeyError("third")


def test_an_exception_mid_stream_arrives_there_with_its_type(pool: sky.Pool) -> None:
    got: list[int] = []
    with pytest.raises(KeyError, match="third"):
        for x in fails_midway() >> pool:
            got.append(x)
    assert got == [1, 2]


def _idle(pool: sky.Pool) -> bool:
    """Whether every task of the pool ends within 10 s (a stopped generator ends at its yield;
    one stopped before it started never runs)."""
    deadline = time.monotonic() + 10
    while pool.snapshot().running and time.monotonic() < deadline:
        time.sleep(0.05)
    return pool.snapshot().running == 0


def test_a_gather_ended_by_an_error_stops_its_other_streams_at_once(pool: sky.Pool) -> None:
    # The gather's readers were closed (STOP) only when the garbage collector freed them; the
    # error's traceback kept them alive, so with the collector quiet the other generators held
    # their slots for ever.
    import gc

    gc.disable()
    try:
        with pytest.raises(KeyError, match="third") as caught:
            for _ in sky.gather(fails_midway(), counting("gather-error"), stream=True) >> pool:
                pass
        assert _idle(pool), "the other generator still runs after the gather's error"
        assert caught.value is not None  # the error, and its traceback, are still held here
    finally:
        gc.enable()


def test_closing_a_streaming_gather_stops_every_stream(pool: sky.Pool) -> None:
    import gc

    gc.disable()
    try:
        values = sky.gather(counting("gather-a"), counting("gather-b"), stream=True) >> pool
        assert next(values) == 0
        values.close()
        assert _idle(pool)
        unread = sky.gather(counting("gather-c"), stream=True) >> pool
        unread.close()  # before its first value
        assert _idle(pool)
    finally:
        gc.enable()


@sky.function
def quiet_then(seconds: float) -> Iterator[int]:
    time.sleep(seconds)
    yield 0


def test_ctrl_c_in_a_streaming_gather_stops_every_stream(pool: sky.Pool) -> None:
    import gc
    import signal
    import threading

    gc.disable()
    timer = threading.Timer(1.0, signal.pthread_kill, (threading.get_ident(), signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            for _ in sky.gather(quiet_then(2.0), counting("gather-ctrl-c"), stream=True) >> pool:
                pass  # waits for the first stream's value when Ctrl-C comes
        assert _idle(pool)
    finally:
        timer.cancel()
        gc.enable()


@sky.function
def yields_a_lock(before: int) -> Iterator[Any]:
    import threading

    yield from range(before)
    yield threading.Lock()
    yield "never"


@pytest.fixture(scope="module")
def process_pool() -> Iterator[sky.Pool]:
    with sky.Compute(worker=sky.Worker(executor="process"), options=sky.Options(console=False)) as p:
        yield p


@pytest.mark.parametrize("executor", ["pool", "process_pool"])
@pytest.mark.parametrize("before", [1, 2000])
def test_an_unpicklable_value_arrives_after_the_values_yielded_before_it(
        request: pytest.FixtureRequest, executor: str, before: int) -> None:
    # The node pickles what the generator queued since its last frame as one batch: the values
    # ahead of the bad one must still arrive, then the error, as for any exception mid-stream.
    target: sky.Pool = request.getfixturevalue(executor)
    for _ in range(5):  # how the values fall into batches is a race: give it several chances
        got: list[int] = []
        with pytest.raises(sky.SerializationError, match="could not be pickled"):
            for x in yields_a_lock(before) >> target:
                got.append(x)
        assert got == list(range(before))


@sky.function
def fib(n: int) -> Iterator[int]:
    a, b = 0, 1
    for _ in range(n):
        yield a
        a, b = b, a + b


def test_run_async_broadcast_and_gather_take_generators(pool: sky.Pool) -> None:
    assert list(pool.run(fib(7))) == [0, 1, 1, 2, 3, 5, 8]
    future = fib(5) > pool
    assert list(future.result()) == [0, 1, 1, 2, 3]
    assert [list(s) for s in fib(3) @ pool] == [[0, 1, 1], [0, 1, 1]]
    assert sorted(sky.gather(fib(3), fib(4), stream=True) >> pool) == [0, 0, 1, 1, 1, 1, 2]
    assert [list(s) for s in sky.gather(fib(2), fib(3)) >> pool] == [[0, 1], [0, 1, 1]]


@sky.function
def total(items: Iterator[int]) -> int:
    s = 0
    for x in items:
        s += x
    return s


@sky.function
def checksum(rows: Iterator[bytes]) -> tuple[int, int]:
    n = size = 0
    for row in rows:
        n += 1
        size += len(row)
    return n, size


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_a_million_item_input_stream_keeps_the_client_flat(pool: sky.Pool) -> None:
    assert (total(iter(range(10))) >> pool) == 45  # warm up
    before = _rss_kb()
    # 1,000,000 rows of 1 KB: 1 GB if it were ever held at once.
    rows = (bytes([i % 256]) * 1024 for i in range(1_000_000))
    n, size = checksum(rows) >> pool
    grew_mb = (_rss_kb() - before) / 1024
    assert (n, size) == (1_000_000, 1024 * 1_000_000)
    assert grew_mb < 100, f"the client grew by {grew_mb:.0f} MB"


def test_an_iterator_annotated_parameter_streams_any_iterable(pool: sky.Pool) -> None:
    assert (total(range(1000)) >> pool) == sum(range(1000))  # a range, pulled lazily
    assert (total([1, 2, 3]) >> pool) == 6


@sky.function
def doubled(xs: Iterator[int]) -> Iterator[int]:
    for x in xs:
        yield 2 * x


def test_both_directions_at_once(pool: sky.Pool) -> None:
    assert sum(doubled(x for x in range(20_000)) >> pool) == 2 * sum(range(20_000))


def test_an_error_in_the_clients_iterator_reaches_the_task(pool: sky.Pool) -> None:
    def bad() -> Iterator[int]:
        yield 1
        raise ValueError("source broke")

    with pytest.raises(ValueError, match="source broke"):
        total(bad()) >> pool


@sky.function
def slow_generator() -> Iterator[int]:
    for i in range(3):
        time.sleep(0.4)
        yield i


def test_a_slow_generator_streams_each_value_within_its_timeout(pool: sky.Pool) -> None:
    got: list[Any] = []
    for x in slow_generator().with_timeout(5) >> pool:
        got.append(x)
    assert got == [0, 1, 2]
