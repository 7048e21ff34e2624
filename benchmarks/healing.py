"""Pools that heal: how long a lost node takes to be replaced, and what one loss costs a map.

    .venv/bin/python benchmarks/healing.py [--reps 5] [--no-ssh] [--json PATH]

* **replace, Local**: a 3-node sky.Local() pool; the agent of rank 1 is SIGKILLed and the clock
  runs until a task pinned to rank 1 returns from the replacement (death -> taking tasks).
  Target: <= 1 s.
* **replace, warm SSH**: the same on 3 sshd test hosts (tests/sshhosts.py; needs root for
  network namespaces, else loopback hosts): the agent process is killed on its host, which
  stays up, so the replacement restarts the agent in the pool's folder there. Target: <= 3 s.
* **map with one kill**: a 20,000-item map (each item ~1 ms of sleep) on 3 Local nodes, timed
  alone and with rank 1's agent SIGKILLed 40% of the way through; reps interleaved. The
  figure is the median slowdown (with kill / without).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import skyward as sky  # noqa: E402
from skyward.errors import NodeLostError  # noqa: E402

QUIET = sky.Options(console=False)
agent_pid = sky.function(os.getppid)


@sky.function
def item(x: int) -> int:
    time.sleep(0.001)
    return x + 1


def until_rank_answers(pool: sky.Pool, rank: int, old_pid: int) -> int:
    """Dispatch to ``rank`` until its (new) agent answers; the new agent's pid."""
    while True:
        try:
            pid = pool.run(agent_pid(), target=rank)
        except NodeLostError:  # sent to the dying node before its loss was noticed
            continue
        if pid != old_pid:
            return pid


def replace_times(pool: sky.Pool, reps: int, kill: Any) -> list[float]:
    times = []
    for _ in range(reps):
        pid = pool.run(agent_pid(), target=1)
        t0 = time.perf_counter()
        kill(pid)
        until_rank_answers(pool, 1, pid)
        times.append(time.perf_counter() - t0)
        time.sleep(0.5)  # let the pool settle (the old node's cleanup) before the next kill
    return times


def local_replace(reps: int) -> list[float]:
    with sky.Compute(nodes=3, options=QUIET) as pool:
        return replace_times(pool, reps, lambda pid: os.kill(pid, signal.SIGKILL))


def ssh_replace(reps: int) -> list[float]:
    import subprocess

    from sshhosts import SSHHosts

    with SSHHosts(3) as hosts:
        provider = sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                                  for h in hosts])
        with sky.Compute(provider=provider, nodes=3, options=QUIET) as pool:
            argv = hosts[1].ssh_argv("/dev/null", strict="no")

            def kill(pid: int) -> None:
                subprocess.run([*argv, f"kill -9 {pid}"], check=True, capture_output=True, timeout=30)

            return replace_times(pool, reps, kill)


def map_slowdown(reps: int) -> dict[str, Any]:
    items = range(20_000)
    plain: list[float] = []
    killed: list[float] = []
    with sky.Compute(nodes=3, options=QUIET) as pool:
        pool.map(item, range(3000))  # warm up
        for _ in range(reps):
            t0 = time.perf_counter()
            assert pool.map(item, items) == [x + 1 for x in items]
            plain.append(time.perf_counter() - t0)
            expected = plain[-1]
            pid = pool.run(agent_pid(), target=1)
            timer = threading.Timer(0.4 * expected, os.kill, (pid, signal.SIGKILL))
            t0 = time.perf_counter()
            timer.start()
            assert pool.map(item, items) == [x + 1 for x in items]
            killed.append(time.perf_counter() - t0)
            timer.join()
            until_rank_answers(pool, 1, pid)  # the next rep starts with 3 nodes again
    ratios = [k / p for k, p in zip(killed, plain, strict=True)]
    return {"plain_s": plain, "one_kill_s": killed, "slowdown_median": statistics.median(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-ssh", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    out: dict[str, Any] = {"load": os.getloadavg(), "cpus": os.cpu_count()}

    local = local_replace(args.reps)
    out["replace_local_s"] = local
    print(f"replace, Local:      median {statistics.median(local):.2f} s, max {max(local):.2f} s "
          f"(target <= 1 s: {'PASS' if statistics.median(local) <= 1 else 'MISS'})")
    if not args.no_ssh:
        try:
            warm = ssh_replace(args.reps)
        except Exception as exc:  # no sshd / no namespaces here
            print(f"replace, warm SSH:   skipped ({exc})")
        else:
            out["replace_warm_ssh_s"] = warm
            print(f"replace, warm SSH:   median {statistics.median(warm):.2f} s, max {max(warm):.2f} s "
                  f"(target <= 3 s: {'PASS' if statistics.median(warm) <= 3 else 'MISS'})")
    slow = map_slowdown(max(1, args.reps // 2))
    out["map"] = slow
    print(f"map 20,000 items:    {statistics.median(slow['plain_s']):.2f} s alone, "
          f"{statistics.median(slow['one_kill_s']):.2f} s with one kill "
          f"(median slowdown x{slow['slowdown_median']:.2f})")
    print(f"load average at start: {out['load'][0]:.2f} on {out['cpus']} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
