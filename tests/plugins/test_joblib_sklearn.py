"""The "skyward" joblib backend on a real 2-node Local pool: in the pool block and nested."""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

import pytest

import skyward as sky

joblib = pytest.importorskip("joblib")
from joblib import Parallel, delayed  # noqa: E402

QUIET = sky.Options(console="silent")


def slow_square(x: int) -> tuple[int, int]:
    time.sleep(0.02)
    return os.getpid(), x * x


@pytest.fixture(scope="module")
def sk_pool():
    with sky.Compute(nodes=2, plugins=[sky.plugins.sklearn()], options=QUIET) as p:
        yield p


def test_parallel_in_the_pool_block_runs_on_the_workers(sk_pool) -> None:
    out = Parallel(n_jobs=-1)(delayed(slow_square)(i) for i in range(40))
    assert [v for _, v in out] == [i * i for i in range(40)]  # order preserved
    pids = {p for p, _ in out}
    assert os.getpid() not in pids and len(pids) >= 2
    from joblib.parallel import get_active_backend

    backend, _n_jobs = get_active_backend()
    assert type(backend).__name__ == "SkywardBackend"
    assert backend.effective_n_jobs(-1) == 2  # 2 nodes x 1 slot


def test_an_error_aborts_and_the_pool_keeps_working(sk_pool) -> None:
    def fail_at(i):
        if i == 3:
            raise KeyError("three")
        time.sleep(0.01)
        return i

    with pytest.raises(KeyError, match="three"):
        Parallel(n_jobs=-1)(delayed(fail_at)(i) for i in range(30))
    assert Parallel(n_jobs=-1)(delayed(abs)(-i) for i in range(5)) == list(range(5))


def _data():
    from sklearn.datasets import load_iris

    return load_iris(return_X_y=True)


def test_searches_match_a_local_run(sk_pool) -> None:
    from sklearn.model_selection import GridSearchCV, RandomizedSearchCV, cross_val_score
    from sklearn.svm import SVC

    X, y = _data()
    grid = {"C": [0.1, 1, 10], "gamma": ["scale", 0.1]}
    remote = GridSearchCV(SVC(), grid, cv=3, n_jobs=-1).fit(X, y)
    rand = RandomizedSearchCV(SVC(), grid, n_iter=4, cv=3, n_jobs=-1, random_state=0).fit(X, y)
    scores = cross_val_score(SVC(), X, y, cv=5, n_jobs=-1)
    with joblib.parallel_config(backend="sequential"):
        local = GridSearchCV(SVC(), grid, cv=3).fit(X, y)
        local_rand = RandomizedSearchCV(SVC(), grid, n_iter=4, cv=3, random_state=0).fit(X, y)
        local_scores = cross_val_score(SVC(), X, y, cv=5)
    assert remote.best_params_ == local.best_params_
    assert list(remote.cv_results_["mean_test_score"]) == list(local.cv_results_["mean_test_score"])
    assert rand.best_params_ == local_rand.best_params_ and rand.best_score_ == local_rand.best_score_
    assert list(scores) == list(local_scores)


@sky.function
def search_on_a_node():
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    X, y = _data()
    grid = GridSearchCV(SVC(), {"C": [0.1, 1, 10], "gamma": ["scale", 0.1]}, cv=3, n_jobs=-1).fit(X, y)
    fit_pids = Parallel(n_jobs=-1)(delayed(slow_square)(i) for i in range(20))
    return grid.best_params_, grid.best_score_, {p for p, _ in fit_pids}, os.getpid()


def test_grid_search_nested_in_a_task_fans_out_over_the_pool(sk_pool) -> None:
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    params, score, pids, _parent = search_on_a_node() >> sk_pool
    X, y = _data()
    with joblib.parallel_config(backend="sequential"):
        local = GridSearchCV(SVC(), {"C": [0.1, 1, 10], "gamma": ["scale", 0.1]}, cv=3).fit(X, y)
    assert params == local.best_params_ and score == local.best_score_
    assert len(pids) == 2 and os.getpid() not in pids  # both nodes, through the client


def test_nested_dispatch_does_not_deadlock_when_every_slot_waits(sk_pool) -> None:
    # Both nodes' only slot runs a task that waits for nested batches: the slots are lent.
    results = (search_on_a_node() & search_on_a_node()) >> sk_pool
    assert len(results) == 2


def test_warning_filters_that_nodes_cannot_import_are_left_out(sk_pool, tmp_path: Path) -> None:
    from sklearn.model_selection import cross_val_score
    from sklearn.svm import SVC

    # A warning category from a module only this process can import (the nodes' path was
    # fixed when the pool started): scikit-learn pickles warnings.filters with every batch.
    (tmp_path / "only_here.py").write_text("class LocalWarning(UserWarning):\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import only_here

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=only_here.LocalWarning)
            before = list(warnings.filters)
            X, y = _data()
            scores = cross_val_score(SVC(), X, y, cv=3, n_jobs=-1)
            assert len(scores) == 3
            assert list(warnings.filters) == before  # the caller's filters are untouched
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("only_here", None)


def test_backend_outside_a_pool_says_what_to_do() -> None:
    import contextvars

    from skyward.plugins.backend import SkywardBackend

    # A fresh context: no pool block is active there (the module's pool is, in this one).
    with pytest.raises(sky.NoActivePoolError, match=r"plugins=\[sky\.plugins\.joblib"):
        contextvars.Context().run(SkywardBackend().effective_n_jobs, -1)


def test_images_get_the_packages() -> None:
    from skyward.plugins.compose import prepare

    class FakeCluster:
        spec = None

    spec = sky.Spec(plugins=[sky.plugins.sklearn(version="1.5.2"), sky.plugins.joblib()])
    image, ops = prepare(spec, FakeCluster())  # type: ignore[arg-type]
    assert image.pip == ("scikit-learn==1.5.2", "joblib") and ops == ()
