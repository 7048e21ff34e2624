"""Slots, executors, timeouts and dying workers on real nodes."""

from __future__ import annotations

import itertools
import os
import time

import pytest

import skyward as sky


@sky.function
def window(seconds: float) -> tuple[float, float]:
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


@sky.function
def pid() -> int:
    return os.getpid()


@sky.function
def die(code: int) -> None:
    os._exit(code)


@sky.function
def sleepy(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


@sky.function
def spin(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "spun"


def test_concurrency_four_runs_four_tasks_at_once() -> None:
    with sky.Compute(nodes=1, worker=sky.Worker(concurrency=4)) as pool:
        spans = pool.map(window, [0.6] * 4, chunksize=1)
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans


def test_default_runs_one_task_at_a_time_per_node() -> None:
    with sky.Compute(nodes=1) as pool:
        spans = sky.gather(window(0.3), window(0.3)) >> pool
    (_, e1), (s2, _) = sorted(spans)
    assert s2 >= e1 - 0.01


def test_process_executor_uses_separate_processes() -> None:
    opts = sky.Options(worker=sky.Worker(concurrency=2, executor="process"))
    with sky.Compute(nodes=1, options=opts) as pool:
        spans = pool.map(window, [0.5, 0.5], chunksize=1)
        pids = set(pool.map(lambda _: os.getpid(), range(20), chunksize=1))
        infos = pool.map(lambda _: sky.instance_info().worker, range(20), chunksize=1)
    assert max(s for s, _ in spans) < min(e for _, e in spans)
    assert len(pids) == 2
    assert set(infos) <= {0, 1}


def test_process_executor_without_reuse_gets_fresh_processes() -> None:
    worker = sky.Worker(executor="process", reuse_processes=False)
    with sky.Compute(nodes=1, worker=worker) as pool:
        pids = [pid() >> pool for _ in range(3)]
    assert len(set(pids)) == 3


def test_worker_that_exits_is_reported_and_replaced(pool: sky.Pool) -> None:
    with pytest.raises(sky.WorkerDiedError, match="exit code 3"):
        pool.run(die(3), target=0)
    assert pool.run(pid(), target=0) > 0  # the node keeps serving
    assert pool.current_nodes() == 2


@sky.function
def terminated() -> None:
    """SIGTERM to this worker alone, as `kill <pid>` does."""
    import signal

    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)


@sky.function
def processes() -> tuple[int, int]:
    return os.getpid(), int(os.environ["SKYWARD_AGENT_PID"])


def test_a_worker_stopped_by_a_sigterm_from_outside_says_so_and_is_replaced() -> None:
    with sky.Compute(nodes=1) as pool:
        with pytest.raises(sky.WorkerDiedError, match="was stopped by a SIGTERM") as raised:
            terminated() >> pool
        assert "scheduler" in str(raised.value) and "crash" not in str(raised.value), raised.value
        assert pid() >> pool > 0  # the node keeps serving


def test_a_worker_stopped_with_its_agent_ends_as_a_lost_node_not_a_crash() -> None:
    # What scancel does to a Slurm job's processes. The worker's SIGTERM lands first: the agent
    # waits a moment for its own before it calls the worker crashed. With the node stopping, the
    # client sees the node lost, and its task moves to the node that replaces it.
    import signal

    with sky.Compute(nodes=1) as pool:
        worker, agent = processes() >> pool
        running = sleepy(1) > pool
        time.sleep(0.5)
        os.kill(worker, signal.SIGTERM)
        time.sleep(0.3)
        os.kill(agent, signal.SIGTERM)
        assert running.result(timeout=60) == "done"  # not WorkerDiedError
        assert (processes() >> pool)[1] != agent


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_timeout_raises_and_node_stays_usable(executor: str) -> None:
    with sky.Compute(nodes=1, worker=sky.Worker(executor=executor)) as pool:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="timeout of 1 s"):
            sleepy(30).with_timeout(1) >> pool
        assert time.monotonic() - start < 1 + 2
        assert sleepy(0) >> pool == "done"


def test_timeout_interrupts_python_code() -> None:
    with sky.Compute(nodes=1) as pool:
        with pytest.raises(sky.TaskTimeoutError):
            spin(30).with_timeout(0.5) >> pool
        # the spinning thread was interrupted, so the same slot serves the next call at once
        start = time.monotonic()
        assert spin(0) >> pool == "spun"
        assert time.monotonic() - start < 1


def test_function_level_timeout_and_pool_default() -> None:
    @sky.function(timeout=0.5)
    def capped() -> None:
        time.sleep(10)

    with sky.Compute(nodes=1, options=sky.Options(default_compute_timeout=0.5)) as pool:
        with pytest.raises(TimeoutError):
            capped() >> pool
        with pytest.raises(TimeoutError):
            sleepy(10) >> pool


def test_buffer_prefetches_without_adding_concurrency() -> None:
    with sky.Compute(nodes=1, worker=sky.Worker(concurrency=1, buffer=2)) as pool:
        spans = sorted(pool.map(window, [0.2] * 3, chunksize=1))
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.01


def test_lost_node_fails_its_pinned_tasks_and_the_pool_goes_on() -> None:
    import signal

    with sky.Compute(nodes=2) as pool:
        victim = pool.run(sky.function(os.getppid)(), target=1)
        running = pool.run_async(sleepy(30), target=1)
        time.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(sky.NodeLostError, match="node 1"):
            running.result(timeout=10)  # pinned to the node: not moved elsewhere
        assert [pid() >> pool for _ in range(3)]  # the other node serves meanwhile
        deadline = time.monotonic() + 30
        while pool.current_nodes() != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.current_nodes() == 2  # a replacement took its place (tests/test_healing.py)
        assert pool.run(sky.function(os.getppid)(), target=1) != victim


def test_a_task_raising_timeout_itself_is_an_ordinary_error(pool: sky.Pool) -> None:
    @sky.function
    def raises_timeout() -> None:
        raise sky.TaskTimeoutError("raised by the task, not by the watchdog")

    with pytest.raises(sky.TaskTimeoutError, match="raised by the task"):
        raises_timeout() >> pool


def test_workers_exit_when_their_agent_is_killed() -> None:
    import signal

    from conftest import wait_gone

    with sky.Compute(nodes=1) as pool:
        agent, worker = (sky.function(os.getppid)() >> pool), (pid() >> pool)
        pool.run_async(sleepy(60))
        time.sleep(0.2)
        os.kill(agent, signal.SIGKILL)
        assert wait_gone([worker], 5) == []


def test_a_worker_whose_agent_died_before_it_started_exits() -> None:
    # The worker's parent check used to read the parent pid when its watchdog thread started: a
    # worker whose agent was already gone had init as parent from the start and lived forever.
    import json
    import socket
    import subprocess
    import sys

    from skyward.bootstrap.frames import FrameWriter, Kind

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs: the agent, dead before the worker looked
    ours, theirs = socket.socketpair()
    env = dict(os.environ, SKYWARD_WORKER_FD=str(theirs.fileno()), SKYWARD_AGENT_PID=str(gone.pid))
    worker = subprocess.Popen([sys.executable, "-m", "skyward.bootstrap.worker"], pass_fds=[theirs.fileno()],
                              env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    theirs.close()
    try:
        FrameWriter(ours).send_parts(Kind.CONFIGURE, 0, 0, json.dumps({"topology": {"node": 0}}).encode())
        assert worker.wait(timeout=30) != 0  # it noticed and stopped itself
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        ours.close()


def test_a_stop_that_comes_before_the_stream_is_registered_still_stops_it() -> None:
    # A STOP was applied only to streams already registered: one read before the TASK frame
    # (the agent routes a task, then writes it, and the client's STOP can pass in between)
    # or while the task was still loading was dropped, and the generator then filled its
    # window and held its slot for ever.
    import json
    import queue
    import socket
    import subprocess
    import sys
    import threading
    from collections.abc import Iterator

    from skyward.bootstrap import serialize
    from skyward.bootstrap.frames import FLAG_STREAM_OUT, Frame, FrameReader, FrameWriter, Kind

    def endless() -> Iterator[int]:
        n = 0
        while True:
            n += 1
            yield n

    def slow_to_start() -> Iterator[int]:
        time.sleep(1.0)  # the STOP is read meanwhile (the watchdog reads for a busy slot)
        return endless()

    ours, theirs = socket.socketpair()
    env = dict(os.environ, SKYWARD_WORKER_FD=str(theirs.fileno()), SKYWARD_AGENT_PID=str(os.getpid()),
               SKYWARD_WORKER_THREADS="1")
    worker = subprocess.Popen([sys.executable, "-m", "skyward.bootstrap.worker"], pass_fds=[theirs.fileno()],
                              env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    theirs.close()
    frames: queue.SimpleQueue[Frame] = queue.SimpleQueue()

    def read() -> None:
        reader = FrameReader(ours)
        try:
            while True:
                frames.put(reader.read())
        except (EOFError, OSError):
            pass

    def task(tid: int, fn: object) -> None:
        flags, body, buffers = serialize.dumps((fn, (), {}, None))
        writer.send_parts(Kind.TASK, tid, flags | FLAG_STREAM_OUT, body, buffers)

    def result_of(tid: int) -> Frame:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                frame = frames.get(timeout=0.2)
            except queue.Empty:
                continue
            if frame.kind == Kind.RESULT and frame.task_id == tid:
                return frame
        raise AssertionError(f"task {tid} still runs 10 s after its STOP: the STOP was lost")

    writer = FrameWriter(ours)
    threading.Thread(target=read, daemon=True).start()
    try:
        writer.send_parts(Kind.CONFIGURE, 0, 0, json.dumps({"topology": {"node": 0}}).encode())
        writer.send_parts(Kind.STOP, 1, 0, b"")  # before its TASK frame
        task(1, endless)
        result_of(1)
        task(2, slow_to_start)
        time.sleep(0.3)
        writer.send_parts(Kind.STOP, 2, 0, b"")  # while it loads, before its stream exists
        result_of(2)
        task(3, endless)  # the slot is free again, and a STOP for an ended task hurts nobody
        writer.send_parts(Kind.STOP, 3, 0, b"")
        result_of(3)
    finally:
        worker.kill()
        worker.wait()
        ours.close()
