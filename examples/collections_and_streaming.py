"""Distributed collections and streaming on a 2-node Local pool.

    .venv/bin/python examples/collections_and_streaming.py
"""

from collections.abc import Iterator

import skyward as sky


@sky.function
def work(item: int) -> int | None:
    seen, done = sky.set("seen"), sky.counter("done")
    if item in seen:
        return None
    seen.add(item)
    with sky.lock("report"):  # one task at a time in here, on every node
        sky.dict("last")["item"] = item
    done.increment()
    return item * item


@sky.function
def squares(numbers: Iterator[int]) -> Iterator[int]:
    for n in numbers:  # pulled from the client lazily
        yield n * n  # reaches the client as it is produced


if __name__ == "__main__":
    with sky.Compute(nodes=2, worker=sky.Worker(concurrency=4)) as pool:
        results = pool.map(work, [1, 2, 3, 2, 1, 4])
        print("results:", results, "counted:", sky.counter("done").value)
        for value in squares(iter(range(1_000_000))) >> pool:
            if value > 100:
                break  # stops the generator on the node
            print("streamed", value)
