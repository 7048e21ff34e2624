"""Node loss soak: a pool whose nodes keep dying must finish its work or fail, never hang.

    .venv/bin/python benchmarks/soak.py [--runs 20] [--seconds 150] [--nodes 4] [--every 3]
                                        [--json PATH]

Each run is a process of its own: a ``--nodes`` Local pool with ``retry_on_interruption=10``
runs ``pool.map`` of 20,000 items in a loop (every result checked) while another thread sends
``>>`` calls in a loop (every answer checked), and one agent is SIGKILLed every ``--every``
seconds, for ``--seconds``. A run that makes no progress (no map round and no call finished)
for 60 s is a hang: its threads' stacks are printed and it is killed. The table counts, per
run, map rounds, items, calls, kills, errors and hangs; the bar is zero hangs and
zero wrong results in 20 runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STALL = 60.0  # seconds without progress that make a run a hang


def one_run(seconds: float, nodes: int, every: float, seed: int) -> dict[str, Any]:
    import faulthandler

    import skyward as sky

    @sky.function
    def triple(x: int) -> int:
        return x * 3

    options = dataclasses.replace(sky.Options(console=False), retry_on_interruption=10)
    counts = {"rounds": 0, "items": 0, "calls": 0, "kills": 0, "errors": 0, "wrong": 0}
    progress = [time.monotonic()]
    stop = threading.Event()
    errors: list[str] = []

    def note_error(exc: BaseException) -> None:
        counts["errors"] += 1
        if len(errors) < 5:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])

    with sky.Compute(nodes=nodes, options=options) as pool:
        def pids() -> list[int]:
            by_index = {n["index"]: n["pid"] for n in pool.cluster.describe()["nodes"]}
            return [by_index[ch.node] for ch in pool.members.channels
                    if ch.lost is None and ch.node in by_index]

        def killer() -> None:
            rng = random.Random(seed)
            while not stop.wait(every):
                live = pids()
                if live:
                    try:
                        os.kill(rng.choice(live), signal.SIGKILL)
                        counts["kills"] += 1
                    except ProcessLookupError:
                        pass

        def caller() -> None:
            i = 0
            while not stop.is_set():
                try:
                    if triple(i) >> pool != i * 3:
                        counts["wrong"] += 1
                    counts["calls"] += 1
                except Exception as exc:  # counted: a call may fail, never hang
                    note_error(exc)
                progress[0] = time.monotonic()
                i += 1

        def watchdog() -> None:
            while not stop.wait(1.0):
                if time.monotonic() - progress[0] > STALL:
                    print(f"HANG: no progress for {STALL:.0f} s; stacks follow", file=sys.stderr, flush=True)
                    faulthandler.dump_traceback(all_threads=True)
                    os._exit(3)

        threads = [threading.Thread(target=t, daemon=True) for t in (killer, caller, watchdog)]
        for t in threads:
            t.start()
        end = time.monotonic() + seconds
        items = list(range(20_000))
        expected = [x + 1 for x in items]
        while time.monotonic() < end:
            try:
                if pool.map(lambda x: x + 1, items) != expected:
                    counts["wrong"] += 1
                counts["rounds"] += 1
                counts["items"] += len(items)
            except Exception as exc:  # counted
                note_error(exc)
            progress[0] = time.monotonic()
        stop.set()
        for t in threads[:2]:
            t.join(STALL)
    return {**counts, "hung": 0, "error_samples": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--every", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a run, in its own process
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args.seconds, args.nodes, args.every, args.one)))
        return

    from rich.console import Console
    from rich.table import Table

    rows = []
    for run in range(args.runs):
        started = time.monotonic()
        cmd = [sys.executable, __file__, "--one", str(run), "--seconds", str(args.seconds),
               "--nodes", str(args.nodes), "--every", str(args.every)]
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=args.seconds + 10 * STALL)
        took = time.monotonic() - started
        if proc.returncode == 0:
            row = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            row = {"rounds": 0, "items": 0, "calls": 0, "kills": 0, "errors": 0, "wrong": 0,
                   "hung": int(proc.returncode == 3), "error_samples": [proc.stderr[-2000:]]}
        row["seconds"] = round(took, 1)
        rows.append(row)
        print(f"run {run}: {row}", file=sys.stderr, flush=True)

    table = Table(title=f"node loss soak: {args.nodes} Local nodes, a SIGKILL every {args.every:g} s, "
                        f"{args.seconds:g} s a run")
    for col in ("run", "seconds", "map rounds", "items", "calls", "kills", "errors", "wrong", "hung"):
        table.add_column(col, justify="right")
    for i, r in enumerate(rows):
        table.add_row(str(i), f"{r['seconds']:.0f}", str(r["rounds"]), f"{r['items']:,}", str(r["calls"]),
                      str(r["kills"]), str(r["errors"]), str(r["wrong"]), str(r["hung"]))
    total = {k: sum(r[k] for r in rows) for k in ("rounds", "items", "calls", "kills", "errors", "wrong", "hung")}
    table.add_row("all", "", str(total["rounds"]), f"{total['items']:,}", str(total["calls"]),
                  str(total["kills"]), str(total["errors"]), str(total["wrong"]), str(total["hung"]))
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "total": total}, indent=2))
    if total["hung"] or total["wrong"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
