"""``Parallel(backend="skyward")`` inside a worker of a process-based joblib backend:
joblib's own ``test_nested_loop[back_compat_backend-skyward]``. A loky worker is a fresh
interpreter: it holds no pool (a pool is used from the process that opened it and from tasks
on its nodes), so the call fails, with an error that says what works instead. That holds also
where the worker never imported skyward: ``skyward-joblib.pth`` (skyward/joblib_pth.py), which
an install puts in site-packages, makes joblib know the name in every interpreter (before it,
joblib's own ``ValueError: Invalid backend: skyward``). The fresh interpreters below are
started from this venv as they are: the hook is the one its install put there.
"""

from __future__ import annotations

import pytest
from helpers import fresh_python_line

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


# Scripts that never import skyward, each in a fresh interpreter of this venv: its output's
# last line is what the Parallel call raised.
_PLAIN = """\
import sys
from joblib import Parallel, delayed
try:
    Parallel(n_jobs=2, backend="skyward")(delayed(abs)(-i) for i in range(3))
except Exception as exc:
    print(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
"""
# joblib's own test, as its suite runs it with every pair of backends: the outer one runs the
# inner Parallel in its worker processes.
_NESTED = """\
from joblib.test.test_parallel import test_nested_loop
try:
    test_nested_loop("back_compat_backend", "skyward")
except Exception as exc:
    print(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
"""
_STALE = (
    'joblib does not know "skyward" in a fresh interpreter of this venv: was it installed '
    "before skyward-joblib.pth existed? `pip install -e .` again"
)


def _fresh(script: str, **env: str) -> str:
    return fresh_python_line(script, **env)


def test_a_fresh_interpreter_that_never_imports_skyward_gets_skywards_error() -> None:
    got = _fresh(_PLAIN)
    assert "Invalid backend" not in got, f"{_STALE}\n{got}"
    assert got.startswith(
        "skyward.errors.NoActivePoolError: the skyward joblib backend runs on a pool"
    ), got
    assert "Open the pool around the Parallel call" in got, got


def test_joblibs_nested_loop_in_a_loky_worker_that_never_imported_skyward() -> None:
    got = _fresh(_NESTED)
    assert "Invalid backend" not in got, f"{_STALE}\n{got}"
    assert got.startswith(
        'skyward.errors.NoActivePoolError: Parallel(backend="skyward") ran in process Loky'
    ), got
    assert (
        "a process another one started for its work" in got and "sky.Compute(name=NAME)" in got
    ), got


def test_the_hook_is_off_with_skyward_no_joblib_hook() -> None:
    got = _fresh(_PLAIN, SKYWARD_NO_JOBLIB_HOOK="1")
    assert got.startswith("builtins.ValueError: Invalid backend: skyward"), got
