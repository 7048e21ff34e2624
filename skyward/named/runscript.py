"""``skyward run NAME script.py [-- ARGS]`` and ``@sky.main``: a script run with a named pool
active, so ``f(x) >> sky`` works with no ``with`` block.

The script runs in this process as ``__main__`` (``sys.argv`` is ``[script, *ARGS]``, its
folder first on ``sys.path``), inside ``with sky.Compute(name=NAME)``: a running pool is
attached to and left running; a pool that does not run is started from skyward.toml for the
run and destroyed afterwards. After the script's top level has run, the one function marked
``@sky.main`` (if any) is called, in the same thread, with the pool active. The exit code is
the script's: ``sys.exit(n)``, 1 for an uncaught exception, an int that the main function
returns, else 0.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

from ..errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

# The functions marked @sky.main while `skyward run` runs a script; None otherwise.
_marked: list[Callable[..., Any]] | None = None


@overload
def main(fn: F) -> F: ...
@overload
def main(fn: None = None) -> Callable[[F], F]: ...
def main(fn: Any = None) -> Any:
    """Mark a script's entry point: ``skyward run NAME script.py`` calls it with pool NAME
    active, after the script's top level ran. ``@sky.main`` and ``@sky.main()`` both work;
    the function is returned unchanged (run as ``python script.py``, nothing calls it)."""

    def mark(f: F) -> F:
        if not callable(f):
            raise ConfigError(f"@sky.main marks a function; got {type(f).__name__} {f!r}.")
        if _marked is not None:
            _marked.append(f)
        return f

    return mark if fn is None else mark(fn)


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"), as the interpreter does
    return 1


def run_script(name: str, script: Path, argv: Sequence[str] = (), options: Any = None) -> int:
    """Run ``script`` with named pool ``name`` active; returns the script's exit code."""
    global _marked
    from ..core.compute import Compute
    from .pools import check_name

    check_name(name)
    if not script.is_file():
        raise ConfigError(f"script {str(script)!r} is not a file; give the path of a Python script.")
    path = script.resolve()
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(path.parent))
    _marked = []
    code = 0
    try:
        with Compute(name=name, options=options):
            failed = _guarded(lambda: runpy.run_path(str(path), run_name="__main__") and None)
            if failed is not None:
                code = failed
            else:
                entry = _entry(_marked, script)
                if entry is not None:
                    outcome: list[Any] = []
                    code = _guarded(lambda: outcome.append(entry())) or 0
                    result = outcome[0] if outcome else None
                    if code == 0 and isinstance(result, int) and not isinstance(result, bool):
                        code = result
    finally:
        _marked = None
        sys.argv, sys.path[:] = saved_argv, saved_path
    return code


def _guarded(step: Callable[[], Any]) -> int | None:
    """Run one step of the script: None when it ended normally, else its exit code."""
    try:
        step()
    except SystemExit as exc:
        return _exit_code(exc)
    except KeyboardInterrupt:
        raise
    except Exception:
        _print_traceback()
        return 1
    return None


def _entry(marked: list[Callable[..., Any]], script: Path) -> Callable[..., Any] | None:
    if len(marked) > 1:
        names = ", ".join(getattr(f, "__name__", repr(f)) for f in marked)
        raise ConfigError(f"{script} marks {len(marked)} functions with @sky.main ({names}): a script has "
                          f"one entry point; keep the mark on one of them.")
    return marked[0] if marked else None


def _print_traceback() -> None:
    """The script's traceback, without this module's frames (as if Python had run it)."""
    kind, exc, tb = sys.exc_info()
    here = os.path.abspath(__file__)
    runpy_file = os.path.abspath(runpy.__file__)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in (here, runpy_file):
        tb = tb.tb_next
    traceback.print_exception(kind, exc, tb)


# -- the command ---------------------------------------------------------------------------
def add_run(command: Callable[[str], argparse.ArgumentParser]) -> None:
    p = command("run")  # its help: _MODULE_COMMANDS of named/cli.py
    p.add_argument("name", help="the pool ([pools.NAME] in skyward.toml, or one `skyward up` started)")
    p.add_argument("script", type=Path, help="the Python script to run")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments for the script (after --)")
    p.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    return run_script(args.name, args.script, list(args.cmd))
