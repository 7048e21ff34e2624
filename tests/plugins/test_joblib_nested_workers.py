"""``Parallel(backend="skyward")`` inside a worker of a process-based joblib backend (issue 48):
joblib's own ``test_nested_loop[back_compat_backend-skyward]``. A loky worker is a fresh
interpreter: it holds no pool (a pool is used from the process that opened it and from tasks
on its nodes), so the call fails, with an error that says what works instead. Where the worker
never imported skyward, joblib (which has no entry points for backends) cannot know the name:
its own ``ValueError``, the limit the joblib guide describes."""

from __future__ import annotations

import pytest

import skyward as sky

joblib = pytest.importorskip("joblib")
from joblib import Parallel, delayed  # noqa: E402

QUIET = sky.Options(console="silent")


def square(x: int) -> int:
    return x * x


def inner_on_skyward() -> list[int]:
    # Runs in a loky worker, which imports this module (and so skyward) to unpickle it.
    return Parallel(n_jobs=2, backend="skyward")(delayed(square)(i) for i in range(2))


def test_skyward_inside_a_loky_worker_says_what_works_instead() -> None:
    with sky.Compute(nodes=1, options=QUIET), pytest.raises(sky.NoActivePoolError) as caught:
        Parallel(n_jobs=2, backend="loky")(delayed(inner_on_skyward)() for _ in range(2))
    text = str(caught.value)
    assert "LokyProcess" in text and "a process another one started for its work" in text, text
    assert "outer backend" in text and "sky.Compute(name=NAME)" in text, text


def test_a_worker_that_never_imported_skyward_gets_joblibs_own_error() -> None:
    from joblib.test.test_parallel import nested_loop  # its module imports no skyward

    with pytest.raises(ValueError, match="Invalid backend: skyward"):
        Parallel(n_jobs=2, backend="loky")(delayed(nested_loop)("skyward") for _ in range(2))
