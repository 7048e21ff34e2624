"""The lane (bootstrap/lane.py): plain tasks from a client on the node's host go straight to
the worker; everything the agent did for them still holds."""

from __future__ import annotations

import os
import threading
import time

import pytest

import skyward as sky
from skyward.bootstrap.lane import ClientLane


@sky.function
def pid() -> int:
    return os.getpid()


@sky.function
def die(code: int) -> None:
    os._exit(code)


@sky.function
def say(text: str) -> str:
    print(text)
    return text


@sky.function
def hold(seconds: float) -> tuple[float, float]:
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


def lanes(pool: sky.Pool) -> list[str | None]:
    return [ch.lane for ch in pool.members.ready()]


def lane_of(pool: sky.Pool) -> str:
    """The first node's lane, once a task has opened it (the agent offers it after the
    node's configuration, so the very first task may still go through the agent)."""
    deadline = time.monotonic() + 5
    while lanes(pool)[0] is None and time.monotonic() < deadline:
        pool.run(pid(), target=0)
    path = lanes(pool)[0]
    assert path is not None
    return path


def test_plain_tasks_take_the_lane_on_local_nodes() -> None:
    with sky.Compute(nodes=2) as pool:
        pids = {pid() >> pool for _ in range(6)}
        assert len(pids) == 2
        deadline = time.monotonic() + 5
        while None in lanes(pool) and time.monotonic() < deadline:
            pid() >> pool
        paths = lanes(pool)
        assert all(p is not None and os.path.exists(p) for p in paths), paths
        assert pool.map(pid, [()] * 0) == []  # an empty map is still fine
    assert not any(os.path.exists(p) for p in paths if p)  # removed with the pool


def test_process_executor_and_one_off_workers_have_no_lane() -> None:
    for worker in (sky.Worker(executor="process", concurrency=2),
                   sky.Worker(executor="process", reuse_processes=False)):
        with sky.Compute(nodes=1, worker=worker) as pool:
            pid() >> pool
            assert lanes(pool) == [None]


def test_a_lane_task_that_kills_its_worker_ends_with_the_agents_error() -> None:
    with sky.Compute(nodes=1) as pool:
        old = lane_of(pool)
        first = pid() >> pool
        with pytest.raises(sky.WorkerDiedError, match="exit code 3"):
            die(3) >> pool
        assert pid() >> pool != first  # a new worker serves
        deadline = time.monotonic() + 5
        while lanes(pool)[0] in (None, old) and time.monotonic() < deadline:
            pid() >> pool  # the replacement's lane opens once the agent offers it
        assert lanes(pool)[0] not in (None, old)


def test_lane_tasks_respect_the_nodes_concurrency() -> None:
    with sky.Compute(nodes=1, worker=sky.Worker(concurrency=2, buffer=2)) as pool:
        lane_of(pool)
        spans = sky.gather(*(hold(0.4) for _ in range(6))) >> pool
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 2, spans


def test_output_of_a_lane_task_reaches_the_client(capfd: pytest.CaptureFixture[str]) -> None:
    with sky.Compute(nodes=1) as pool:
        lane_of(pool)
        assert say("through-the-lane") >> pool == "through-the-lane"
        time.sleep(0.2)
    assert "through-the-lane" in capfd.readouterr().out


def test_a_lane_refuses_a_wrong_token_and_serves_on() -> None:
    with sky.Compute(nodes=1) as pool:
        path = lane_of(pool)
        with pytest.raises((OSError, EOFError)):
            ClientLane(path, "not-the-token", 1, timeout=2)
        assert pid() >> pool > 0


def test_timeouts_and_threads_on_the_lane() -> None:
    with sky.Compute(nodes=1, worker=sky.Worker(concurrency=2)) as pool:
        lane_of(pool)
        with pytest.raises(TimeoutError, match=r"timeout of 0\.5 s"):
            hold(30).with_timeout(0.5) >> pool
        results: list[int] = []

        def hammer() -> None:
            for _ in range(30):
                results.append(pid() >> pool)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 120 and len(set(results)) == 1
