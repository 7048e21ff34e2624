"""joblib and scikit-learn: ``Parallel(n_jobs=-1)`` runs on the pool.

Both plugins install their packages on the nodes, make ``"skyward"`` joblib's backend for
the pool's ``with`` block (in the user's thread: joblib's setting is thread-local), and make
it the backend inside every task too, so that a ``GridSearchCV`` running in a
``@sky.function`` fans its fits out over the whole pool through the client. The backend
itself is ``skyward.plugins.backend.SkywardBackend``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from .plugin import Plugin


def _add_pip(image: Any, *packages: str) -> Any:
    names = {p.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower() for p in image.pip}
    extra = tuple(p for p in packages if p.split("=")[0].lower() not in names)
    return replace(image, pip=(*image.pip, *extra))


@contextlib.contextmanager
def _client_backend(pool: Any, cluster: Any) -> Iterator[None]:
    from joblib import parallel_config

    from .backend import register

    register()
    with parallel_config(backend="skyward", pool=pool):
        yield


def _in_tasks(fn: Callable[..., Any]) -> Callable[..., Any]:
    """On a node: joblib inside the task dispatches to the pool (nested, via the client)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        from joblib import parallel_config

        from .backend import register

        register()
        with parallel_config(backend="skyward"):
            return fn(*args, **kwargs)

    return run


def joblib(*, version: str | None = None) -> Plugin:
    """Distribute joblib: installs ``joblib`` (``version`` pins it) and makes
    ``Parallel(n_jobs=-1)`` use every slot of the pool, in the pool block and inside tasks."""
    requirement = f"joblib=={version}" if version else "joblib"
    return (
        Plugin.create("joblib")
        .with_image_transform(lambda image, cluster: _add_pip(image, requirement))
        .with_around_client(_client_backend)
        .with_decorator(_in_tasks)
    )


def sklearn(*, version: str | None = None) -> Plugin:
    """scikit-learn on the pool: installs ``scikit-learn`` (``version`` pins it) and joblib, and
    distributes everything that takes ``n_jobs`` (GridSearchCV, cross_val_score, ...)."""
    requirement = f"scikit-learn=={version}" if version else "scikit-learn"
    return (
        Plugin.create("sklearn")
        .with_image_transform(lambda image, cluster: _add_pip(image, requirement, "joblib"))
        .with_around_client(_client_backend)
        .with_decorator(_in_tasks)
    )
