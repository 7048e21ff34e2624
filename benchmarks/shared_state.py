"""Collections and streaming throughput on a 2-node Local pool, with Ray doing the same work
side by side in the same run when Ray is installed (an actor counter; a generator task with
``num_returns="streaming"``).

    .venv/bin/python benchmarks/shared_state.py [--quick]

Measured inside tasks (the time a task spends on the operations), so pool start-up and
dispatch are not counted. Targets: strong counter >= 2x Ray's actor counter, eventual >= 200,000
increments/s, streaming >= 100,000 items/s.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from concurrent.futures import Future

import skyward as sky


@sky.function
def incr(name: str, n: int, consistency: str) -> float:
    c = sky.counter(name, consistency=consistency)  # type: ignore[arg-type]
    start = time.perf_counter()
    for _ in range(n):
        c.increment()
    if consistency == "eventual":
        _ = c.value  # the batches have landed: a read sends this process's writes first
    return time.perf_counter() - start


@sky.function
def queue_round_trips(name: str, n: int) -> float:
    q = sky.queue(name)
    start = time.perf_counter()
    for i in range(n):
        q.put(i)
        q.get()
    return time.perf_counter() - start


@sky.function
def numbers(n: int) -> Iterator[int]:
    yield from range(n)


@sky.function
def consume(xs: Iterator[int]) -> int:
    count = 0
    for _ in xs:
        count += 1
    return count


def _rate(ops: int, futures: list[Future[float]]) -> float:
    """ops per second when the tasks ran at once: total ops over the longest task's time."""
    return ops / max(f.result() for f in futures)


def skyward_figures(n: int, items: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with sky.Compute(nodes=2, worker=sky.Worker(concurrency=4), options=sky.Options(console=False)) as pool:
        incr("warm", 100, "strong") >> pool
        for consistency in ("strong", "eventual"):
            one = n if consistency == "strong" else n * 10
            out[f"counter {consistency}, 1 task"] = one / (incr(f"c1-{consistency}", one, consistency) >> pool)
            futures = [incr(f"c8-{consistency}", one // 8, consistency) > pool for _ in range(8)]
            out[f"counter {consistency}, 8 tasks"] = _rate(one // 8 * 8, futures)
            assert sky.counter(f"c8-{consistency}").value == one // 8 * 8
        out["queue put+get, 1 task"] = n / (queue_round_trips("q", n) >> pool)
        start = time.perf_counter()
        got = sum(1 for _ in numbers(items) >> pool)
        out["stream out (node -> client)"] = got / (time.perf_counter() - start)
        start = time.perf_counter()
        got = consume(iter(range(items))) >> pool
        out["stream in (client -> node)"] = got / (time.perf_counter() - start)
    return out


def ray_figures(n: int, items: int) -> dict[str, float] | None:
    try:
        import ray
    except ImportError:
        return None
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote
        class Counter:
            def __init__(self) -> None:
                self.value = 0

            def incr(self, k: int = 1) -> int:
                self.value += k
                return self.value

        @ray.remote
        def incr_task(counter: object, k: int) -> float:
            start = time.perf_counter()
            for _ in range(k):
                ray.get(counter.incr.remote())  # type: ignore[attr-defined]
            return time.perf_counter() - start

        @ray.remote(num_returns="streaming")
        def gen(k: int) -> Iterator[int]:
            for i in range(k):  # noqa: UP028  (Ray drives it with send(): a range iterator has none)
                yield i

        out: dict[str, float] = {}
        c = Counter.remote()  # type: ignore[attr-defined]
        ray.get(incr_task.remote(c, 100))
        out["counter strong, 1 task"] = n / ray.get(incr_task.remote(c, n))
        times = ray.get([incr_task.remote(c, n // 8) for _ in range(8)])
        out["counter strong, 8 tasks"] = n // 8 * 8 / max(times)
        start = time.perf_counter()
        got = sum(1 for ref in gen.remote(items // 10) for _ in [ray.get(ref)])
        out["stream out (node -> client)"] = got / (time.perf_counter() - start)
        return out
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, items = (2_000, 100_000) if args.quick else (10_000, 1_000_000)
    ours = skyward_figures(n, items)
    theirs = ray_figures(n, items)
    targets = {"counter strong, 1 task": ">= 2x Ray", "counter eventual, 1 task": ">= 200,000/s",
               "counter eventual, 8 tasks": ">= 200,000/s", "stream out (node -> client)": ">= 100,000/s",
               "stream in (client -> node)": ">= 100,000/s"}
    print(f"{'benchmark':34} {'skyward ops/s':>14} {'ray ops/s':>12}  target")
    for key, value in ours.items():
        ray_value = (theirs or {}).get(key)
        ray_text = f"{ray_value:12,.0f}" if ray_value else f"{'—' if theirs else 'not installed':>12}"
        print(f"{key:34} {value:14,.0f} {ray_text}  {targets.get(key, '')}")
    print(json.dumps({"skyward": ours, "ray": theirs}))


if __name__ == "__main__":
    main()
