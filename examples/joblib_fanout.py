"""joblib's Parallel running on a pool: n_jobs=-1 means every slot of every node."""

import os
import time

from joblib import Parallel, delayed

import skyward as sky


def work(i: int) -> tuple[int, int]:
    time.sleep(0.05)  # stands for real work
    return i * i, os.getpid()


if __name__ == "__main__":
    with sky.Compute(nodes=2, worker=sky.Worker(concurrency=2), plugins=[sky.plugins.joblib()]) as pool:
        out = Parallel(n_jobs=-1)(delayed(work)(i) for i in range(64))
    squares = [v for v, _ in out]
    print(f"{len(squares)} results in order: {squares == [i * i for i in range(64)]}; "
          f"{len({p for _, p in out})} worker processes, none of them this one ({os.getpid()})")
