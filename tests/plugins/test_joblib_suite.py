"""joblib's own backend tests, from the installed wheel, on the "skyward" backend.

``joblib/test/test_parallel.py`` ships in joblib's wheel. Its module is run here with its
backend lists (``PROCESS_BACKENDS``, ``PARALLEL_BACKENDS``, ``ALL_VALID_BACKENDS``,
``RETURN_GENERATOR_BACKENDS``) set to ``["skyward"]``, so that pytest collects its tests as
this module's; every test parametrized over a backend is kept with "skyward" as its only
backend, the others (tests of loky or of joblib's own machinery) are left out. They run
inside a 2-node Local pool opened without the plugin: ``backend="skyward"`` is found by
name, the pool through the ``with`` block (or, from the tests' own threads, as the one pool
open). ``EXCLUDED`` lists the tests that cannot apply to a remote backend, with the reason.
A test parametrized over two backends keeps only the pairs of ours: ``test_nested_loop`` with
another (process) backend outside (``[back_compat_backend-skyward]``, ``[loky-skyward]``) runs
skyward in that backend's fresh worker process. joblib knows the name there (an install puts
``skyward-joblib.pth`` in site-packages), but no pool is reachable from that process, so the
pair cannot pass: test_joblib_nested_workers.py runs joblib's test itself in a fresh
interpreter and checks that the error is skyward's, naming the worker and what to do.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import pytest

import skyward as sky

pytest.importorskip("joblib")

_SPEC = importlib.util.find_spec("joblib.test.test_parallel")
if _SPEC is None or _SPEC.origin is None:  # a joblib built without its tests
    pytest.skip("joblib's wheel has no joblib/test/test_parallel.py", allow_module_level=True)
SOURCE = Path(_SPEC.origin)

LISTS = ("PROCESS_BACKENDS", "PARALLEL_BACKENDS", "ALL_VALID_BACKENDS", "RETURN_GENERATOR_BACKENDS")
OURS = "skyward"

# test name (without parameters) -> why it cannot apply to a remote backend
_NO_SCRIPT = (
    "runs its Parallel in a script of its own, in a fresh interpreter that opens no pool: "
    'joblib knows "skyward" there (skyward-joblib.pth), but the remote backend has no pool'
)
_MANAGER = (
    "passes multiprocessing Manager proxies to the tasks: they connect back to a manager "
    "process with this process's authkey, which nodes do not have (AuthenticationError)"
)
_MEMMAP = (
    "asserts that arrays reach the tasks as np.memmap views of a folder on this machine "
    "(joblib's auto-memmapping for local worker processes); a remote backend ships the data"
)
EXCLUDED: dict[str, str] = {
    "test_error_capture": (
        "inspects the local worker pool of loky/multiprocessing (get_workers(backend)) and expects "
        "a KeyboardInterrupt raised in a task to interrupt the caller; a remote task's "
        "KeyboardInterrupt comes back as a RuntimeError (it interrupts its node, not the client)"
    ),
    "test_dispatch_multiprocessing": _MANAGER,
    "test_initializer_context": _MANAGER,
    "test_initializer_parallel": _MANAGER,
    "test_auto_memmap_on_arrays_from_generator": _MEMMAP,
    "test_memmapping_leaks": _MEMMAP,
    "test_parallel_with_interactively_defined_functions": _NO_SCRIPT,
    "test_parallel_with_unpicklable_functions_in_args": _NO_SCRIPT,
}


def _rewritten() -> str:
    """The test module's source with the backend lists set to ours, right after the last
    top-level statement that makes them (before the first test is defined)."""
    text = SOURCE.read_text()
    tree = ast.parse(text)
    last = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            break
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if names & set(LISTS):
            last = node
    if last is None:
        raise RuntimeError(f"{SOURCE} no longer defines {', '.join(LISTS)}: update this module")
    lines = text.splitlines(keepends=True)
    end = last.end_lineno or last.lineno
    override = (
        f"PROCESS_BACKENDS = [{OURS!r}]\nPARALLEL_BACKENDS = [{OURS!r}]\n"
        f"ALL_VALID_BACKENDS = [{OURS!r}]\nRETURN_GENERATOR_BACKENDS = {{{OURS!r}: None}}\n"
    )
    return "".join(lines[:end]) + override + "".join(lines[end:])


def _only_ours(fn: Any) -> bool:
    """Keep a test's backend parametrizations to ours; False when it has none of ours (a test
    of another backend, or of joblib itself)."""
    marks = list(getattr(fn, "pytestmark", []))
    kept, ours = [], False
    for mark in marks:
        if mark.name == "parametrize" and "backend" in str(mark.args[0]) and "," not in str(mark.args[0]):
            values = [v for v in mark.args[1] if v == OURS]
            if not values:
                return False
            ours = True
            mark = pytest.mark.parametrize(mark.args[0], values, **mark.kwargs).mark
        kept.append(mark)
    fn.pytestmark = kept
    return ours


from skyward.plugins.backend import register as _register  # noqa: E402

_register()  # BACKENDS (which some tests parametrize over) holds ours before the module runs
_namespace: dict[str, Any] = {"__name__": __name__, "__file__": str(SOURCE)}
exec(compile(_rewritten(), str(SOURCE), "exec"), _namespace)
for _name, _value in _namespace.items():
    if _name.startswith("test_") and callable(_value):
        if not _only_ours(_value):
            continue
        if _name in EXCLUDED:
            _value = pytest.mark.skip(reason=EXCLUDED[_name])(_value)
    elif _name.startswith("test_") or _name == "pytestmark":
        continue
    globals().setdefault(_name, _value)


@pytest.fixture(scope="module", autouse=True)
def skyward_pool():
    with sky.Compute(nodes=2, options=sky.Options(console="silent")) as pool:
        yield pool
