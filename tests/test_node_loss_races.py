"""Issue 50: every task handed to a node's channel ends in exactly one outcome, whatever the
order in which a send, the node's death and a replacement happen; a waiting ``map`` never
hangs.

The race is made deterministic with a writer that kills the node's agent and waits until the
client has seen the loss *between* the task's registration and its send: the send then fails,
after the loss already failed the task."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import skyward as sky
from skyward.bootstrap.frames import Kind

pytestmark = pytest.mark.timeout(240)
QUIET = dataclasses.replace(sky.Options(console=False), retry_on_interruption=3)


def agent_pid(pool: sky.Pool, rank: int) -> int:
    by_index = {n["index"]: n["pid"] for n in pool.cluster.describe()["nodes"]}
    return by_index[pool.members.channels[rank].node]


class DyingWriter:
    """A frame writer whose node dies between a task's registration and its send: the first
    frame of ``kind`` kills the agent, waits until the channel has marked the node lost (its
    reader saw the connection close), then fails as a send to a dead peer does."""

    def __init__(self, real: Any, channel: Any, pid: int, kind: int) -> None:
        self.real, self.channel, self.pid, self.kind = real, channel, pid, kind
        self.fired = threading.Event()

    def send_parts(self, kind: int, *args: Any, **kwargs: Any) -> Any:
        if kind == self.kind and not self.fired.is_set():
            self.fired.set()
            os.kill(self.pid, signal.SIGKILL)
            deadline = time.monotonic() + 20
            while self.channel.lost is None:
                assert time.monotonic() < deadline, "the channel never saw its node die"
                time.sleep(0.01)
            raise BrokenPipeError(32, "Broken pipe")
        return self.real.send_parts(kind, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _within(seconds: float, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args)`` in a thread; fail (not hang the suite) if it has not returned in time."""
    ex = ThreadPoolExecutor(1)
    future = ex.submit(fn, *args, **kwargs)
    try:
        return future.result(timeout=seconds)
    except TimeoutError:
        pytest.fail(f"no outcome after {seconds} s: the call waits for a task nobody will answer")
    finally:
        ex.shutdown(wait=False)  # a hung call's thread is left behind, not waited for


def _add_one(x: int) -> int:
    return x + 1


@pytest.mark.parametrize("path", ["agent", "lane"])
def test_a_map_chunk_whose_node_dies_before_its_send_runs_again_once(path: str) -> None:
    worker = sky.Worker(executor="process" if path == "agent" else "thread")
    with sky.Compute(nodes=2, options=QUIET, worker=worker) as pool:
        assert pool.map(_add_one, range(50)) == list(range(1, 51))  # opens the lanes
        ch = pool.members.channels[1]
        if path == "lane":
            lane = ch._lane
            assert lane is not None, "a thread-executor Local node takes map chunks by its lane"
            lane.writer = DyingWriter(lane.writer, ch, agent_pid(pool, 1), Kind.MAP)
            dying = lane.writer
        else:
            assert ch._lane is None
            ch._writer = dying = DyingWriter(ch._writer, ch, agent_pid(pool, 1), Kind.MAP)
        result = _within(90, pool.map, _add_one, range(2000), chunksize=10)
        assert dying.fired.is_set(), "the race was not reached"
        assert result == list(range(1, 2001))


@sky.function
def _note(folder: str, x: int) -> int:
    with open(os.path.join(folder, f"{x}-{os.getpid()}-{time.monotonic_ns()}"), "w"):
        pass
    return x * 2


def test_a_call_whose_node_dies_before_its_send_runs_once_elsewhere(tmp_path: Path) -> None:
    with sky.Compute(nodes=2, options=QUIET, worker=sky.Worker(executor="process")) as pool:
        assert _note(str(tmp_path), 0) @ pool == [0, 0]
        for f in tmp_path.iterdir():
            f.unlink()
        ch = pool.members.channels[1]
        ch._writer = dying = DyingWriter(ch._writer, ch, agent_pid(pool, 1), Kind.TASK)
        future = pool.dispatcher.submit(ch, _note(str(tmp_path), 21), retries=3)
        assert _within(60, future.result) == 42
        assert dying.fired.is_set()
        time.sleep(1.0)  # a second run, if there were one, would have written by now
        assert len(list(tmp_path.iterdir())) == 1, sorted(p.name for p in tmp_path.iterdir())
