"""Task functions for benchmarks/run.py.

They live in an importable module (not in ``__main__``) so that every system pickles them by
reference, the way real code is shipped: ProcessPoolExecutor requires it, and skyward's Local
nodes can import this module because the Local provider passes the client's ``sys.path``
(which holds this folder) to the nodes. Nothing here prints.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where an array is made: the start-up benchmark's
    import numpy as np  # no-op tasks (PPE's) would otherwise pay its import

# Arrays made on a worker, kept so that timing `make` measures the transfer and not the
# random number generator. One per process (a skyward node, a PPE or loky worker).
_CACHE: dict[int, np.ndarray] = {}


def noop() -> None:
    """Does nothing: what a round trip costs."""
    return None


def noop1(x: Any) -> Any:
    """Returns its argument: the per-item cost of a map."""
    return x


def nbytes(arr: np.ndarray) -> int:
    """Receives an array and returns a tiny result: the client -> worker direction."""
    return int(arr.nbytes)


def echo(arr: np.ndarray) -> np.ndarray:
    """Receives an array and sends it back: both directions."""
    return arr


def _array(n: int) -> np.ndarray:
    arr = _CACHE.get(n)
    if arr is None:
        import numpy as np

        arr = np.random.default_rng(n).random(n)  # random floats: nothing for lz4 to find
        _CACHE[n] = arr
    return arr


def prepare(n: int, hold: float = 0.0) -> int:
    """Make (and cache) this worker's array of n float64; ``hold`` keeps the worker busy so
    that concurrent prepare calls land on different workers of an executor."""
    arr = _array(n)
    if hold:
        time.sleep(hold)
    return int(arr.nbytes)


def make(n: int) -> np.ndarray:
    """Returns this worker's cached array of n float64: the worker -> client direction."""
    return _array(n)


def pi_count(task: tuple[int, int]) -> int:
    """Monte Carlo pi in plain Python (CPU-bound, holds the GIL): how many of ``samples``
    random points of the unit square fall inside the quarter circle."""
    seed, samples = task
    rnd = random.Random(seed).random
    inside = 0
    for _ in range(samples):
        x = rnd()
        y = rnd()
        if x * x + y * y <= 1.0:
            inside += 1
    return inside
