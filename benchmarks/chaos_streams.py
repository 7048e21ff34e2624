"""Streams under node loss: streaming gathers, generators stopped early and broadcasts while agents die.

    .venv/bin/python benchmarks/chaos_streams.py [--runs 3] [--seconds 60] [--nodes 4] [--every 3]

Each run opens a Local pool (``Worker(concurrency=2)``, ``retry_on_interruption=10``) and, for
``--seconds``, runs three loops at once while one agent is SIGKILLed every ``--every`` seconds:

* a streaming gather of four generators (``sky.gather(..., stream=True)``), each of whose values is
  checked; a stream may end with the loss of its node (streams are not retried), never with a
  wrong, missing or doubled value before that;
* a generator task closed right after its first value (``it = ticker() >> pool; next(it);
  it.close()``), and one closed before any;
* ``@`` broadcasts, every answer checked.

Then, with the killing stopped, the pool must be back at its size with no task running within 30 s
(a stopped stream that kept its slot shows here), and every loop must have finished rounds. A run
with a wrong value, a hang (no loop progressed for 60 s) or a leaked slot fails.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator

import skyward as sky
from skyward.errors import NodeLostError, WorkerDiedError

LOSS = (NodeLostError, WorkerDiedError)


@sky.function
def counted(start: int, n: int) -> Iterator[int]:
    for i in range(start, start + n):
        time.sleep(0.002)
        yield i


@sky.function
def ticker() -> Iterator[int]:
    i = 0
    while True:
        time.sleep(0.01)
        yield i
        i += 1


@sky.function
def square(x: int) -> int:
    return x * x


def agent_pids(pool: sky.Pool) -> list[int]:
    return [n["pid"] for n in pool.cluster.describe()["nodes"]]


def one_run(seconds: float, nodes: int, every: float) -> dict[str, int]:
    counts = {"gathers": 0, "streams_lost": 0, "stopped_early": 0, "broadcasts": 0, "kills": 0, "wrong": 0}
    stop = threading.Event()
    progress = [time.monotonic()]
    errors: list[str] = []

    def gathers(pool: sky.Pool) -> None:
        while not stop.is_set():
            streams = [counted(k * 1000, 100) for k in range(4)]
            try:
                got = list(sky.gather(*streams, stream=True) >> pool)
            except LOSS:
                counts["streams_lost"] += 1
                continue
            for k in range(4):
                mine = [v for v in got if k * 1000 <= v < k * 1000 + 1000]
                if mine != list(range(k * 1000, k * 1000 + 100)):
                    counts["wrong"] += 1
                    errors.append(f"stream {k}: {mine[:5]}... ({len(mine)} values)")
            counts["gathers"] += 1
            progress[0] = time.monotonic()

    def early(pool: sky.Pool) -> None:
        while not stop.is_set():
            try:
                it = ticker() >> pool
                if next(it) != 0:
                    counts["wrong"] += 1
                it.close()
                (ticker() >> pool).close()
            except LOSS:
                continue
            counts["stopped_early"] += 1
            progress[0] = time.monotonic()

    def broadcasts(pool: sky.Pool) -> None:
        x = 0
        while not stop.is_set():
            x += 1
            try:
                got = square(x) @ pool
            except LOSS:
                continue
            if any(v != x * x for v in got):
                counts["wrong"] += 1
                errors.append(f"broadcast {x}: {got}")
            counts["broadcasts"] += 1
            progress[0] = time.monotonic()

    options = sky.Options(console=False, logging=False, retry_on_interruption=10)
    with sky.Compute(nodes=nodes, worker=sky.Worker(concurrency=2), options=options) as pool:
        loops = [threading.Thread(target=f, args=(pool,), daemon=True) for f in (gathers, early, broadcasts)]
        for t in loops:
            t.start()
        began = time.monotonic()
        rng = random.Random(0)
        while time.monotonic() - began < seconds:
            time.sleep(every)
            pids = agent_pids(pool)
            if pids:
                try:
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    counts["kills"] += 1
                except ProcessLookupError:
                    pass
            if time.monotonic() - progress[0] > 60:
                raise SystemExit("hang: no loop progressed for 60 s")
        stop.set()
        for t in loops:
            t.join(120)
            if t.is_alive():
                raise SystemExit(f"hang: {t.name} did not finish its round")
        deadline = time.monotonic() + 30
        while True:
            snap = pool.snapshot()
            if pool.current_nodes() == nodes and snap.running == 0:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"leak: {snap.running} task(s) still running 30 s after the work ended "
                                 f"({pool.current_nodes()} of {nodes} nodes ready)")
            time.sleep(0.2)
    if errors:
        print("\n".join(errors[:10]), file=sys.stderr)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--every", type=float, default=3)
    args = parser.parse_args()
    bad = 0
    for run in range(1, args.runs + 1):
        counts = one_run(args.seconds, args.nodes, args.every)
        bad += counts["wrong"]
        print(f"run {run}: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    if bad:
        raise SystemExit(f"{bad} wrong value(s)")


if __name__ == "__main__":
    main()
