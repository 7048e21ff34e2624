"""``skyward-joblib.pth``: joblib knows "skyward" in every interpreter of the environment,
also in one that never imports skyward.

A worker of joblib's ``loky`` backend is a fresh interpreter. ``Parallel(backend="skyward")``
there, in a function whose module never imports skyward, got joblib's bare ``ValueError:
Invalid backend: skyward``: joblib has no entry points for backends, and only skyward's import
registers the name (skyward/joblib_name.py). Python runs the ``import`` lines of the ``.pth``
files at the root of site-packages at start-up (pytest-cov and setuptools put hooks there the
same way), so setup.py writes ``pth_text()`` there: a wheel and an editable install both get
it. Its one line runs at every start of every interpreter of the environment, so it does
almost nothing: it imports nothing (``os`` and ``sys`` are loaded before ``.pth`` files are
read) and puts on ``sys.meta_path`` a finder made of one lambda, which finds nothing and lets
every import but one pass by (one string comparison each). The source of ``find_spec`` below
travels in the line as a string, compiled only when ``joblib.parallel`` is first imported:
compiling it at start-up would cost more than all the rest of the line.

When ``joblib.parallel`` is first imported, ``find_spec`` imports ``skyward.joblib_name``
(and so the light ``skyward`` package, found only where it is installed: the site-packages
that holds the ``.pth`` file, or an editable install's checkout, never the working folder
that ``sys.path`` starts with), whose finder registers the name right after
``joblib.parallel`` has run, and hands it the search. The backend's own module loads only when
a ``Parallel`` asks for "skyward". In a worker then, skyward's error says which process it is
and what to do (no pool is there); where a pool is reachable, the call runs on it.

``SKYWARD_NO_JOBLIB_HOOK=1`` (any value but empty or ``0``) turns it off for the processes
that inherit it: the line then adds nothing, and skyward registers the name only where it is
imported (joblib's "Invalid backend: skyward" elsewhere).

Nothing imports this module at run time; setup.py runs it (``runpy``) to get ``pth_text()``.
The line is written when skyward is installed: after a change here, install again (``pip
install -e .``); tests/install/test_joblib_pth.py checks what the builds hold and what the
line does.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

NAME = "skyward-joblib.pth"
OPT_OUT = "SKYWARD_NO_JOBLIB_HOOK"
HOOK = "SkywardJoblibHook"  # the finder's class name (in the line below)

# The line; {source} is find_spec's source. Python 3.11's site runs the .pth files of a venv's
# site-packages twice (from venv(), then from addsitepackages()): the second run finds the
# finder first on sys.meta_path, unless a later .pth file put one before it (two finders then:
# the first one asked does the work, the other lets joblib.parallel pass). Only the first
# finder is looked at: a comprehension would be one more code object to compile at each start.
_LINE = (
    "import os, sys; "
    "os.environ.get({opt_out!r}, '') in ('', '0') "
    "and type(sys.meta_path[0]).__name__ != {hook!r} "
    "and sys.meta_path.insert(0, type({hook!r}, (), {{'__module__': {name!r}, 'done': False, "
    "'where': {where}, "
    "'find_spec': lambda self, name, path=None, target=None, g={{}}: "
    "None if name != 'joblib.parallel' or self.done "
    "else exec({source!r}, g) or g['find_spec'](self, name, path, target)}})())\n"
)


def find_spec(hook: Any, name: str, path: Any = None, target: Any = None) -> Any:
    """The first search for ``joblib.parallel``: skyward's finder, asked now, finds it (and
    will register the name once it has run). ``hook`` is the start-up finder asking."""
    import sys

    hook.done = True  # from now on it lets every import pass
    if "skyward.joblib_name" in sys.modules:
        return None  # skyward is imported: its own finder, ahead of this one, does the work
    try:
        if "skyward" not in sys.modules:
            # skyward from where it is installed, never through sys.path: its first entry is
            # the working folder (python -c, -m) or the script's, where anyone may have put a
            # folder named skyward.
            from importlib.machinery import PathFinder
            from importlib.util import module_from_spec

            found = PathFinder.find_spec("skyward", [hook.where]) if hook.where else None
            if found is None or found.loader is None:
                return None
            module = module_from_spec(found)
            sys.modules["skyward"] = module
            try:
                found.loader.exec_module(module)
            except BaseException:
                del sys.modules["skyward"]
                raise
        # skyward's import puts its finder on sys.meta_path, where the import system, already
        # walking that list for joblib.parallel, would not look: it is asked here.
        from skyward import joblib_name

        finders = [f for f in sys.meta_path if isinstance(f, joblib_name._AfterJoblib)]
        spec = finders[0].find_spec(name, path, target) if finders else None
    except Exception:  # skyward cannot be imported here: joblib must import all the same
        return None
    if spec is not None and hook in sys.meta_path:
        sys.meta_path.remove(hook)  # with a spec found, the import system's walk ends here
    return spec


def pth_text(where: str | Path | None = None) -> str:
    """The ``.pth`` file's text: ``find_spec``'s source, less its docstring, comments and
    annotations (not evaluated there: nothing is imported for them), in the line.

    ``where``: the folder that holds the ``skyward`` package (an editable install's checkout);
    by default the folder of the ``.pth`` file itself, the site-packages a wheel put both in
    (``sitedir``, a local variable of ``site.addpackage``, which runs the line)."""
    place = repr(str(where)) if where is not None else "locals().get('sitedir', '')"
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "find_spec")
    body = func.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        del body[0]
    func.returns = None
    for arg in func.args.args:
        arg.annotation = None
    return _LINE.format(opt_out=OPT_OUT, hook=HOOK, name=NAME, where=place, source=ast.unparse(func))


if __name__ == "__main__":  # python skyward/joblib_pth.py: the line, to read it
    sys.stdout.write(pth_text())
