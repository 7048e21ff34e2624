"""What a running `skyward dashboard` costs a program's pool: dispatch with and without it.

One 2-node Local pool; blocks of sequential no-op `>>` calls and of a 20,000-item map, timed
alternately with the dashboard stopped (the pool's hook only looks for it once a second) and
running (the hook has registered the pool and posts its events: TaskStarted/TaskCompleted per
call). The dashboard runs as `skyward dashboard` in a subprocess, started and stopped between
blocks, in a rotating order so that load drift on the machine is shared by both.

    .venv/bin/python benchmarks/dashboard.py [--reps 6] [--calls 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import skyward as sky
from skyward.dashboard import hook


@sky.function
def noop(x: int) -> int:
    return x


def start_dashboard() -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "skyward", "dashboard", "--port", "0", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    json.loads(proc.stdout.readline())
    return proc


def wait(condition: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    os.environ["SKYWARD_HOME"] = tempfile.mkdtemp(prefix="skyward-bench-")
    calls: dict[str, list[float]] = {"without": [], "with": []}
    maps: dict[str, list[float]] = {"without": [], "with": []}
    with sky.Compute(nodes=2, options=sky.Options(console="silent", logging=False)) as pool:
        for i in range(200):
            noop(i) >> pool
        for rep in range(args.reps):
            for mode in (("without", "with") if rep % 2 == 0 else ("with", "without")):
                server = start_dashboard() if mode == "with" else None
                try:
                    if server is not None:  # registered and forwarding
                        wait(lambda: hook._link is not None and pool.id in hook._link.subscribed)
                    else:
                        wait(lambda: hook._link is None)
                    t = time.perf_counter()
                    for i in range(args.calls):
                        noop(i) >> pool
                    calls[mode].append((time.perf_counter() - t) / args.calls * 1e3)
                    t = time.perf_counter()
                    pool.map(noop, range(20_000))
                    maps[mode].append(time.perf_counter() - t)
                finally:
                    if server is not None:
                        server.terminate()
                        server.wait(10)
                        assert server.stdout is not None
                        server.stdout.close()
    print(f"load average at end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {args.reps} reps")
    for mode in ("without", "with"):
        c, m = calls[mode], maps[mode]
        print(f"{mode:>7} dashboard: >> median {statistics.median(c):.3f} ms/call (min {min(c):.3f}, "
              f"max {max(c):.3f}); map of 20,000 median {statistics.median(m) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
