"""map's automatic chunks: guided until the nodes say how long a chunk took, then sized by it."""

from __future__ import annotations

import math
import time

import pytest

import skyward as sky
from skyward.core.batches import CHUNK_COST, TAIL_MAX, _Chunker
from skyward.observe import events as ev


def plan(chunker: _Chunker, timed_after: int = 0, per_item: float = 0.0) -> list[tuple[int, bool]]:
    """Every chunk's (size, tail) in order; after ``timed_after`` chunks, one of 100 items is
    reported to have taken ``per_item`` seconds each."""
    out = []
    while chunker.left:
        start, end, tail = chunker.next()
        out.append((end - start, tail))
        if per_item and len(out) == timed_after:
            chunker.timed(100, per_item * 100)
    return out


def test_untimed_chunks_are_guided_down_to_a_sixteenth_of_a_slots_share() -> None:
    chunks = plan(_Chunker(100_000, 2))
    sizes = [size for size, _ in chunks]
    assert sum(sizes) == 100_000 and len(chunks) == 16
    assert sizes[0] == 100_000 // 6 and sizes == sorted(sizes, reverse=True)
    assert min(sizes[:-1]) == 100_000 // 32 and [t for _, t in chunks].count(True) == 6
    assert not any(tail for _, tail in chunks[:10])
    assert max(size for size, _ in plan(_Chunker(10_000_000, 2))[-3:]) == TAIL_MAX


def test_cheap_items_make_few_large_chunks_once_timed() -> None:
    """40 ns per item on 16 slots: the floor becomes 16 x CHUNK_COST of calls, capped at half a
    slot's share of the whole; the chunks made before the first time came stay as they were."""
    untimed = plan(_Chunker(1_000_000, 16))
    timed = plan(_Chunker(1_000_000, 16), timed_after=16, per_item=40e-9)
    assert sum(size for size, _ in timed) == 1_000_000
    assert len(untimed) == 128 and len(timed) < 45
    assert timed[:16] == untimed[:16]
    assert max(size for size, _ in timed) == 1_000_000 // 32  # the cap: half a slot's share
    assert 16 * CHUNK_COST / 40e-9 > 1_000_000 // 32


def test_slow_items_keep_the_untimed_floor() -> None:
    """When a chunk's calls are slow, the client's cost per chunk does not matter: the tail
    stays as small as before, to even out the end."""
    assert plan(_Chunker(3000, 2), timed_after=2, per_item=1e-3) == plan(_Chunker(3000, 2))


def test_the_time_per_item_is_that_of_every_chunk_timed() -> None:
    """A chunk slowed down once (a busy machine) does not undo what the others showed."""
    chunker = _Chunker(100_000, 2)
    chunker.timed(3000, 3000 * 10e-9)
    chunker.timed(1000, 1000 * 50e-9)  # 5x slower, once
    expected = math.ceil(2 * CHUNK_COST / ((3000 * 10e-9 + 1000 * 50e-9) / 4000))  # 20 ns an item
    assert chunker.least < expected == chunker.floor() < chunker.most
    chunker.timed(0, 1.0)  # nothing to learn from it
    assert chunker.floor() == expected
    fast = _Chunker(1000, 2)
    fast.timed(10, 0.0)  # too fast for the clock: as large as chunks get
    assert fast.floor() == fast.most == 250


def test_a_fixed_chunksize_is_kept_and_every_chunk_is_the_tails() -> None:
    chunker = _Chunker(25, 4, chunksize=10)
    chunker.timed(10, 1e-9)
    assert plan(chunker) == [(10, True), (10, True), (5, True)]


@sky.function
def double(x: int) -> int:
    return 2 * x


@sky.function
def slow(x: int) -> int:
    time.sleep(0.002)
    return x


def chunk_sizes(pool: sky.Pool, fn: sky.RemoteFunction, items: list[int]) -> list[int]:
    seen: list[sky.Event] = []
    unsubscribe = pool.subscribe(seen.append)
    try:
        assert pool.map(fn, items) == [fn.fn(x) for x in items]
        ev.bus.flush()
    finally:
        unsubscribe()
    return [e.items for e in seen if isinstance(e, sky.TaskStarted)]


@pytest.fixture(scope="module")
def pool():
    with sky.Compute(nodes=8, options=sky.Options(console="silent")) as pool:
        yield pool


def test_nodes_time_each_chunk_and_cheap_items_travel_in_fewer_chunks(pool: sky.Pool) -> None:
    """The nodes report each chunk's time (a node that did not would leave the untimed plan:
    its tail of 200,000 / (8 x 16) = 1,563 items a chunk), and the chunks made after the first
    report are larger than that floor (8 x CHUNK_COST = 0.8 ms of calls: ~8,000 items here)."""
    items = list(range(200_000))
    sizes = chunk_sizes(pool, double, items)
    assert sum(sizes) == len(items)
    untimed = [size for size, _ in plan(_Chunker(len(items), 8))]
    assert len(sizes) < len(untimed)
    assert min(sizes[:-1]) > untimed[-2]


def test_slow_items_still_end_in_small_chunks(pool: sky.Pool) -> None:
    items = list(range(400))
    sizes = chunk_sizes(pool, slow, items)
    assert sum(sizes) == len(items)
    assert sizes[-2] == math.ceil(400 / (8 * 16))  # the untimed floor: 2 ms calls cost more than a chunk


def test_results_join_in_input_order_as_they_come_and_each_chunk_list_goes() -> None:
    """map's output is joined while chunks are on their way: a chunk joins once every chunk
    before it has, its own list is then dropped, and the last join completes the output."""
    from types import SimpleNamespace

    from skyward.core.batches import _JOINED, _Chunker, _MapRun

    run = _MapRun(SimpleNamespace(members=None), SimpleNamespace(retry_on_interruption=0),  # type: ignore[arg-type]
                  str, "str", None, list(range(5)), _Chunker(5, 1, 2), 1, None)
    run.results = [None, [3, 4], None]
    assert run.join() == [] and run.joined == 0  # chunk 1 waits for chunk 0
    first = [1, 2]
    run.results[0] = first
    out = run.join()
    assert out == [1, 2, 3, 4] and out is first and run.joined == 2
    assert run.results[0] is _JOINED and run.results[1] is _JOINED
    run.results[2] = [5]
    assert run.join() == [1, 2, 3, 4, 5] and run.joined == 3
    assert run.join() == [1, 2, 3, 4, 5]  # once more changes nothing

    failed = _MapRun(SimpleNamespace(members=None), SimpleNamespace(retry_on_interruption=0),  # type: ignore[arg-type]
                     str, "str", None, [1], _Chunker(1, 1), 1, None)
    failed.results = [[1]]
    failed.first_error = (0, ValueError("x"))
    assert failed.join() == [] and failed.results == [[1]]  # nothing is joined after an error
