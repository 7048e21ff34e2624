"""Quickstart: a 2-node pool on this machine doing real work.

    python examples/quickstart.py

Runs on sky.Local() (the default provider): each node is an agent process here, so there
is nothing to set up. Swap in provider=sky.SSH(...) or a cloud provider to run elsewhere.
"""

from __future__ import annotations

import random
import time

import skyward as sky


@sky.function
def hello() -> str:
    info = sky.instance_info()
    role = "head" if info.is_head else "worker"
    print(f"rank {info.node} of {info.total_nodes} ({role}) on {info.hostname}")
    return f"node {info.node}/{info.total_nodes} ({role})"


@sky.function
def count_inside(seed: int, samples: int = 250_000) -> int:
    """How many random points of the unit square fall inside the quarter circle."""
    rng = random.Random(seed)
    inside = 0
    for _ in range(samples):
        x, y = rng.random(), rng.random()
        inside += x * x + y * y <= 1.0
    return inside


def main() -> None:
    batches, per_batch = 16, 250_000  # per_batch: count_inside's default
    with sky.Compute(nodes=2) as pool:
        # @ runs on every node: each one reports its rank.
        for line in hello() @ pool:
            print("broadcast:", line)

        # map spreads the batches over both nodes and returns the counts in order.
        start = time.perf_counter()
        counts = pool.map(count_inside, range(batches))
        elapsed = time.perf_counter() - start
        pi = 4 * sum(counts) / (batches * per_batch)
        print(f"pi ~= {pi:.5f} from {batches * per_batch:,} samples on 2 nodes in {elapsed:.2f} s")

        # >> runs one call on one node; & runs calls in parallel.
        a, b = (count_inside(1, samples=10_000) & count_inside(2, samples=10_000)) >> pool
        print(f"two parallel batches: {a} and {b} of 10,000 points inside")


if __name__ == "__main__":
    main()
