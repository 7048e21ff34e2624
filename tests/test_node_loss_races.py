"""Every task handed to a node's channel ends in exactly one outcome, whatever the
order in which a send, the node's death and a replacement happen; a waiting ``map`` never
hangs.

The race is made deterministic with a writer that kills the node's agent and waits until the
client has seen the loss *between* the task's registration and its send: the send then fails,
after the loss already failed the task."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import within

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


@contextlib.contextmanager
def said() -> Iterator[list[str]]:
    """What the skyward logger says meanwhile (it does not propagate while a pool is open)."""
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("skyward").addHandler(handler)
    try:
        yield lines
    finally:
        logging.getLogger("skyward").removeHandler(handler)


def _lane_open(pool: sky.Pool, rank: int) -> Any:
    """The lane of node ``rank``, once tasks have opened it."""
    ch = pool.members.channels[rank]
    deadline = time.monotonic() + 20
    while ch._lane is None:
        assert time.monotonic() < deadline, "a thread-executor Local node takes plain tasks by its lane"
        pool.dispatcher.submit(ch, _plus_one(1)).result(timeout=20)
    return ch._lane


@sky.function
def _plus_one(x: int) -> int:
    return x + 1


def _add_one(x: int) -> int:
    return x + 1


@pytest.mark.parametrize("path", ["agent", "lane"])
def test_a_map_chunk_whose_node_dies_before_its_send_runs_again_once(path: str) -> None:
    worker = sky.Worker(executor="process" if path == "agent" else "thread")
    with sky.Compute(nodes=2, options=QUIET, worker=worker) as pool:
        assert pool.map(_add_one, range(50)) == list(range(1, 51))  # opens the lanes
        ch = pool.members.channels[1]
        if path == "lane":
            lane = _lane_open(pool, 1)
            lane.writer = DyingWriter(lane.writer, ch, agent_pid(pool, 1), Kind.MAP)
            dying = lane.writer
        else:
            assert ch._lane is None
            ch._writer = dying = DyingWriter(ch._writer, ch, agent_pid(pool, 1), Kind.MAP)
        result = within(90, pool.map, _add_one, range(2000), chunksize=10)
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
        assert within(60, future.result) == 42
        assert dying.fired.is_set()
        time.sleep(1.0)  # a second run, if there were one, would have written by now
        assert len(list(tmp_path.iterdir())) == 1, sorted(p.name for p in tmp_path.iterdir())


class ForgetfulWriter:
    """Drops the first task of ``kind`` from the channel's pending set, without an outcome, and
    sends it: a stand-in for any bug that loses a task's outcome, which the waiting call must
    notice by itself (the second line of defence). Dropped before the send: a quick task's
    result could otherwise come back (and complete the call) before the drop."""

    def __init__(self, real: Any, channel: Any, kind: int) -> None:
        self.real, self.channel, self.kind = real, channel, kind
        self.fired = threading.Event()

    def send_parts(self, kind: int, tid: int, *args: Any, **kwargs: Any) -> Any:
        if kind == self.kind and not self.fired.is_set():
            self.fired.set()
            with self.channel._lock:
                self.channel._pending.pop(tid, None)
        return self.real.send_parts(kind, tid, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_map_notices_a_chunk_whose_outcome_went_missing() -> None:
    with said() as lines, sky.Compute(nodes=2, options=QUIET, worker=sky.Worker(executor="process")) as pool:
        ch = pool.members.channels[0]
        ch._writer = forgetful = ForgetfulWriter(ch._writer, ch, Kind.MAP)
        result = within(60, pool.map, _add_one, range(500), chunksize=10)
        assert forgetful.fired.is_set()
        assert result == list(range(1, 501))
    assert any("result never arrived" in line for line in lines), lines


def test_a_call_notices_that_its_outcome_went_missing(tmp_path: Path) -> None:
    # ttl=4: a heartbeat every second
    with said() as lines, sky.Compute(nodes=2, ttl=4, options=QUIET, worker=sky.Worker(executor="process")) as pool:
        ch = pool.members.channels[0]
        ch._writer = forgetful = ForgetfulWriter(ch._writer, ch, Kind.TASK)
        future = pool.dispatcher.submit(ch, _note(str(tmp_path), 5), retries=3)
        assert within(60, future.result) == 10
        assert forgetful.fired.is_set()
    assert any("result never arrived" in line for line in lines), lines


def test_a_closed_ssh_channel_fails_a_send_as_a_socket_does() -> None:
    """A tunnel whose far end closed answers ``send`` with 0: that must be an OSError, which
    every sender of a channel handles as the node's loss (an EOFError escaped them: it failed a
    map outright, and would have ended the lease's heartbeat thread)."""
    from skyward.bootstrap.remote import _send_all

    class Closed:
        def send(self, data: Any) -> int:
            return 0

    with pytest.raises(OSError):
        _send_all(Closed(), b"x" * 10)  # type: ignore[arg-type]


class EOFWriter(DyingWriter):
    """The node dies during the send, and the writer says so with an EOFError."""

    def send_parts(self, kind: int, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().send_parts(kind, *args, **kwargs)
        except BrokenPipeError:
            raise EOFError("the SSH channel was closed while sending") from None


def test_a_map_survives_a_send_that_fails_with_eof() -> None:
    with sky.Compute(nodes=2, options=QUIET, worker=sky.Worker(executor="process")) as pool:
        ch = pool.members.channels[1]
        ch._writer = dying = EOFWriter(ch._writer, ch, agent_pid(pool, 1), Kind.MAP)
        assert within(90, pool.map, _add_one, range(2000), chunksize=10) == list(range(1, 2001))
        assert dying.fired.is_set()
