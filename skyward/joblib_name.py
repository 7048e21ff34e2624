"""joblib knows the backend name "skyward" wherever skyward is imported.

``Parallel(backend="skyward")`` must work without the joblib plugin: on a node, inside a
task of a pool opened without it, and in the program's own threads. ``Parallel`` looks the
name up in joblib's table of backends (only ``parallel_config`` would ask
``EXTERNAL_BACKENDS``), so the backend is registered as soon as joblib is there, without
importing joblib here: if it is not imported yet, a finder on ``sys.meta_path`` registers
it right after ``joblib.parallel`` has loaded. A program that never imports joblib pays
nothing but that finder.

What is registered first is a factory that imports the backend's module
(skyward/plugins/backend.py) when a ``Parallel`` asks for "skyward"; that module then
registers its class in its place. A program that imports joblib (scikit-learn does) and
never uses the backend does not load it. This matters because of ``skyward-joblib.pth``
(skyward/joblib_pth.py): in every interpreter of an environment where skyward is installed,
the first import of ``joblib.parallel`` imports this module (and so the ``skyward`` package),
so that a fresh interpreter (a worker of joblib's loky backend) knows the name too.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # (not from typing: node processes import this; see skyward/__init__)
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

NAME = "skyward"
_MODULE = "joblib.parallel"


def _backend(**kwargs: Any) -> Any:
    """joblib's factory for "skyward" until the backend's module is imported (which
    registers its class instead): the backend, made as joblib asks."""
    from skyward.plugins.backend import SkywardBackend

    return SkywardBackend(**kwargs)


def _offer(module: ModuleType) -> None:
    try:
        if NAME not in module.BACKENDS:  # the class itself, once skyward.plugins.backend ran
            module.register_parallel_backend(NAME, _backend)
    except Exception:  # an unexpected joblib: importing it must not fail because of us
        return


class _AfterJoblib:
    """A meta-path finder that finds nothing itself: it lets the others find
    ``joblib.parallel`` and makes its loader offer the name once the module has run. The
    start-up hook of ``skyward-joblib.pth`` asks it directly (skyward/joblib_pth.py)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: ModuleType) -> None:
            run(module)
            _offer(module)
            if self in sys.meta_path:  # its work is done (not while finders are being asked)
                sys.meta_path.remove(self)

        loader.exec_module = exec_module  # this spec's own loader (one per module found)
        return spec


def install() -> None:
    """Offer the name now if joblib is imported, else when it is (idempotent)."""
    module = sys.modules.get(_MODULE)
    if module is not None:
        _offer(module)
    elif not any(isinstance(f, _AfterJoblib) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterJoblib())


install()
