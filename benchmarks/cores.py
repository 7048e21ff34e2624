"""A many-core machine: ``map`` over an N-node Local pool beside ``multiprocessing.Pool(N)``,
and how soon a large Local pool is ready.

    .venv/bin/python benchmarks/cores.py [--nodes N] [--items 1000000,100000] [--reps 15]
                                         [--ready 64] [--ready-reps 3] [--json PATH]

N defaults to this machine's cores (the issue's case is 16 nodes on 16 cores). For each item
count both systems map ``noop1`` (returns its argument) over ``list(range(items))``, checked
once, then timed in interleaved repetitions (the order alternating). Each row gives the median
and p90 throughput, and the CPU seconds per map of the client process (every thread of it:
on N cores the client's thread work is what the map waits for) and of the whole machine
(``/proc/stat``, every process, idle excluded; only meaningful on an otherwise quiet machine).

``--ready M`` (0: skip) then opens a pool of M Local nodes ``--ready-reps`` times: the time until
``sky.Compute`` has entered (every node ready), until a no-op has run on every node (``@``), and
until the pool is closed; beside ``multiprocessing.Pool(M)`` opened, mapping a no-op over M items
(one per worker, chunksize 1) and closed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _work  # noqa: E402
from _home import scratch_home  # noqa: E402

scratch_home()

import skyward as sky  # noqa: E402

sky_noop1 = sky.function(_work.noop1)
# os.getpid: a call that imports nothing on the node (_work would import numpy there).
sky_getpid = sky.function(os.getpid)
TICK = os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds every process of the machine has spent so far (all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / TICK


def measure(fn: Callable[[], Any]) -> tuple[float, float, float]:
    busy, cpu, start = machine_busy(), time.process_time(), time.perf_counter()
    fn()
    wall = time.perf_counter() - start
    return wall, time.process_time() - cpu, machine_busy() - busy


def p90(values: list[float]) -> float:
    data = sorted(values)
    return data[min(len(data) - 1, round(0.9 * (len(data) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--items", default="1000000,100000")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--ready", type=int, default=64, help="nodes of the large pool (0: skip)")
    parser.add_argument("--ready-reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    n, sizes = args.nodes, [int(x) for x in args.items.split(",")]
    print(f"cores: {n} nodes/workers on {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"load {os.getloadavg()[0]:.1f}, {args.reps} interleaved reps", flush=True)
    rows: list[dict[str, Any]] = []
    # multiprocessing.Pool first: with fork it forks its workers before skyward's threads exist.
    with multiprocessing.Pool(n) as mp_pool, sky.Compute(
            nodes=n, options=sky.Options(console="silent", logging=False)) as pool:
        for size in sizes:
            items = list(range(size))
            fns = {"skyward": lambda items=items: pool.map(sky_noop1, items),
                   "mp.Pool": lambda items=items: mp_pool.map(_work.noop1, items)}
            for name, fn in fns.items():
                if fn() != items:
                    raise AssertionError(f"{name} returned wrong results")
            got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in fns}
            for rep in range(args.reps):
                for name in (list(fns) if rep % 2 == 0 else list(fns)[::-1]):
                    got[name].append(measure(fns[name]))
            for name, m in got.items():
                walls = [w for w, _, _ in m]
                row = {"items": size, "system": name, "nodes": n,
                       "median_items_s": size / statistics.median(walls),
                       "p90_items_s": size / p90(walls), "median_s": statistics.median(walls),
                       "client_cpu_s": statistics.median(c for _, c, _ in m),
                       "machine_cpu_s": statistics.median(b for _, _, b in m)}
                rows.append(row)
                print(f"{size:>9,} items  {name:<8} {row['median_items_s'] / 1e6:6.2f} M items/s "
                      f"(p90 {row['p90_items_s'] / 1e6:5.2f} M, {row['median_s'] * 1e3:6.1f} ms)  "
                      f"client CPU {row['client_cpu_s'] * 1e3:6.1f} ms  machine CPU "
                      f"{row['machine_cpu_s'] * 1e3:6.1f} ms", flush=True)
            sk, mp = (next(r for r in rows[-2:] if r["system"] == s) for s in ("skyward", "mp.Pool"))
            print(f"{'':>16}skyward / mp.Pool: {sk['median_items_s'] / mp['median_items_s']:.2f}", flush=True)
    if args.ready:
        rows += ready(args.ready, args.ready_reps)
    if args.json:
        args.json.write_text(json.dumps({"cores": os.cpu_count(), "rows": rows}, indent=2))


def ready(m: int, reps: int) -> list[dict[str, Any]]:
    print(f"\n{m} Local nodes: enter (all ready), first call on every node (os.getpid), closed; "
          f"beside multiprocessing.Pool({m}): open, map over {m} items, closed", flush=True)
    sky_t: list[tuple[float, float, float]] = []
    mp_t: list[tuple[float, float, float]] = []
    for _ in range(reps):
        start = time.perf_counter()
        with sky.Compute(nodes=m, options=sky.Options(console="silent", logging=False)) as pool:
            entered = time.perf_counter()
            if len(set(sky_getpid() @ pool)) != m:
                raise AssertionError("a broadcast missed a node")
            first = time.perf_counter()
        sky_t.append((entered - start, first - start, time.perf_counter() - start))
        start = time.perf_counter()
        with multiprocessing.Pool(m) as mp_pool:
            entered = time.perf_counter()
            mp_pool.map(_work.noop1, range(m), chunksize=1)
            first = time.perf_counter()
        mp_t.append((entered - start, first - start, time.perf_counter() - start))
    rows = []
    for name, got in (("skyward", sky_t), ("mp.Pool", mp_t)):
        med = [statistics.median(x[i] for x in got) for i in range(3)]
        rows.append({"ready_nodes": m, "system": name, "enter_s": med[0], "first_s": med[1], "closed_s": med[2]})
        print(f"{name:<8} enter {med[0]:6.3f} s  first result on all {med[1]:6.3f} s  closed {med[2]:6.3f} s "
              f"(medians of {reps})", flush=True)
    return rows


if __name__ == "__main__":
    main()
