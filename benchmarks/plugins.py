"""Plugin benchmarks: the "skyward" joblib backend against loky, 2 workers each.

    .venv/bin/python benchmarks/plugins.py [--reps N]

* ``grid``: GridSearchCV(SVC) on digits, 32 candidates x 5 folds (160 fits), n_jobs=-1 on a
  2-node Local pool (sklearn plugin) vs joblib's loky with n_jobs=2; repetitions
  interleaved (one of each in turn) so that load drifting on the machine affects both.
* ``tiny``: 2,000 joblib calls of a function that does nothing: wall time / 2,000 is the
  per-task overhead (joblib batches the calls automatically on both backends).
* ``abort``: a GridSearchCV(SVC) with one failing candidate (C=-1, which SVC refuses) and
  error_score="raise", timed to its error, then a clean search (16 candidates x 5 folds)
  timed on its own: the fits of the aborted search that were already sent must not hold
  the slots the clean search needs.

``--only abort`` (or grid, tiny) runs one of them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import joblib
from joblib import Parallel, delayed
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from sklearn.svm import SVC

import skyward as sky

GRID = {"C": [0.1, 1, 10, 100], "gamma": ["scale", "auto", 0.01, 0.001], "kernel": ["rbf", "poly"]}


def noop(i: int) -> int:
    return i


def n_jobs() -> int:
    """-1 (every slot of the pool) on skyward, 2 processes on loky."""
    backend = joblib.parallel.get_active_backend()[0]
    return -1 if type(backend).__name__ == "SkywardBackend" else 2


def grid_search(X, y) -> float:
    t = time.perf_counter()
    GridSearchCV(SVC(), GRID, cv=5, n_jobs=n_jobs()).fit(X, y)
    return time.perf_counter() - t


ABORT_GRID = {"C": [1, 10, -1, 100], "gamma": ["scale", "auto", 0.01, 0.001]}
CLEAN_GRID = {"C": [1, 10, 100, 1000], "gamma": ["scale", "auto", 0.01, 0.001]}


def aborted_then_clean(X, y) -> tuple[float, float]:
    """(seconds to the failing search's error, seconds of the clean search after it)."""
    t = time.perf_counter()
    try:
        GridSearchCV(SVC(), ABORT_GRID, cv=5, n_jobs=n_jobs(), error_score="raise").fit(X, y)
    except ValueError:
        pass
    else:
        raise AssertionError("the search with C=-1 did not fail")
    failed = time.perf_counter() - t
    t = time.perf_counter()
    GridSearchCV(SVC(), CLEAN_GRID, cv=5, n_jobs=n_jobs()).fit(X, y)
    return failed, time.perf_counter() - t


def tiny() -> float:
    t = time.perf_counter()
    Parallel(n_jobs=n_jobs())(delayed(noop)(i) for i in range(2000))
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", choices=["grid", "tiny", "abort"])
    args = parser.parse_args()
    reps, only = args.reps, args.only
    X, y = load_digits(return_X_y=True)

    def one(prefix: str) -> None:
        if only in (None, "grid"):
            times[f"{prefix}-grid"].append(grid_search(X, y))
        if only in (None, "tiny"):
            times[f"{prefix}-tiny"].append(tiny())
        if only in (None, "abort"):
            failed, clean = aborted_then_clean(X, y)
            times[f"{prefix}-failed"].append(failed)
            times[f"{prefix}-clean"].append(clean)

    times: dict[str, list[float]] = {f"{p}-{k}": [] for p in ("sky", "loky")
                                     for k in ("grid", "tiny", "failed", "clean")}
    with sky.Compute(nodes=2, plugins=[sky.plugins.sklearn()], options=sky.Options(console="silent")):
        sky_backend = joblib.parallel.get_active_backend()
        grid_search(X, y), tiny()  # warm up (imports on the nodes)
        with joblib.parallel_config(backend="loky"):
            grid_search(X, y), tiny()
        for rep in range(reps):
            order = ["sky", "loky"] if rep % 2 == 0 else ["loky", "sky"]
            for name in order:
                if name == "sky":
                    assert joblib.parallel.get_active_backend()[0] is sky_backend[0]
                    one("sky")
                else:
                    with joblib.parallel_config(backend="loky"):
                        one("loky")
    med = {k: statistics.median(v) for k, v in times.items() if v}
    if "sky-grid" in med:
        print(f"GridSearchCV(SVC) digits 32x5: skyward {med['sky-grid']:.2f} s, loky {med['loky-grid']:.2f} s, "
              f"ratio {med['sky-grid'] / med['loky-grid']:.2f} (target <= 1.10)")
    if "sky-tiny" in med:
        print(f"2000 tiny joblib tasks: skyward {med['sky-tiny'] * 1e3:.0f} ms "
              f"({med['sky-tiny'] / 2000 * 1e6:.0f} us/task), "
              f"loky {med['loky-tiny'] * 1e3:.0f} ms ({med['loky-tiny'] / 2000 * 1e6:.0f} us/task)")
    if "sky-failed" in med:
        print(f"GridSearchCV with a failing candidate, error_score='raise': error after skyward "
              f"{med['sky-failed']:.2f} s, loky {med['loky-failed']:.2f} s; the clean 16x5 search after it: "
              f"skyward {med['sky-clean']:.2f} s, loky {med['loky-clean']:.2f} s")


if __name__ == "__main__":
    main()
