"""The README's editable install is typed: a user's type checker sees skyward's annotations.

``pip install -e .`` makes setuptools choose between two shapes of editable install: a plain
path in a ``.pth`` file, or, when ``package-dir`` maps packages onto other folders (as it did
for stacks/, providers/ and bootstrap/), an import hook (a finder module in site-packages).
Python runs the hook; mypy and pyright only read the paths, so with the hook they cannot find
``skyward`` at all ("Cannot find implementation or library stub") and every operator result
in the user's code is ``Any``.

These tests do what a user does: a fresh venv made with the README's command, a script of
theirs using the operators, and the type checkers of this venv run on it against that venv
(``--python-executable`` / ``--pythonpath``), each asked to ``reveal_type`` the results.
pyright comes from PyPI with its JavaScript bundled and, through ``pyright[nodejs]``, a Node.js
of its own (the dev extra); its test skips only where it is not installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The venv's install builds skyward in an isolated environment: pip fetches setuptools from the index.
pytestmark = pytest.mark.network

ROOT = Path(__file__).resolve().parents[2]

USER_SCRIPT = '''\
import skyward as sky


@sky.function
def greet(n: int) -> str:
    return f"hello {n}"


with sky.Compute(nodes=2) as pool:
'''

# (expression, what mypy reveals, what pyright reveals): full matches. mypy's text has
# "builtins." removed (mypy 1 writes builtins.str, mypy 2 str); module paths are left open so
# that moving a class to another module of skyward keeps the test true.
MOD = r"skyward(\.\w+)*\."
EXPECTED: list[tuple[str, str, str]] = [
    ("pool", MOD + r"Pool", r"Pool"),
    ("greet", MOD + r"RemoteFunction\[\[n: int\], str\]", r"RemoteFunction\[\(n: int\), str\]"),
    ("greet(1)", MOD + r"PendingFunction\[str\]", r"PendingFunction\[str\]"),
    ("greet(1) >> pool", r"str", r"str"),
    ("greet(1) @ pool", r"list\[str\]", r"list\[str\]"),
    ("greet(1) > pool", r"concurrent\.futures(\.\w+)*\.Future\[str\]", r"Future\[str\]"),
    ("pool.map(greet, range(3))", r"list\[str\]", r"list\[str\]"),
    ("sky.gather(greet(1), greet(2))", MOD + r"PendingFunctionGroup", r"PendingFunctionGroup"),
    ("sky.gather(greet(1), greet(2)) >> pool",
     r"tuple\[Any, \.\.\.\] \| typing\.Iterator\[Any\]|Union\[tuple\[Any, \.\.\.\], typing\.Iterator\[Any\]\]",
     r"tuple\[Any, \.\.\.\] \| Iterator\[Any\]"),
]


def _env() -> dict[str, str]:
    """This environment less what would point a tool at this checkout or this venv."""
    drop = {"PYTHONPATH", "MYPYPATH", "VIRTUAL_ENV", "PYRIGHT_PYTHON_FORCE_VERSION"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYRIGHT_PYTHON_IGNORE_WARNINGS"] = "1"
    return env


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def user_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a venv made with the README's `python3 -m venv .venv && .venv/bin/pip install -e .`."""
    venv = tmp_path_factory.mktemp("user") / ".venv"
    # sys.executable is this suite's venv: `-m venv` builds on its base interpreter, not on it.
    made = _run([sys.executable, "-m", "venv", str(venv)], ROOT, 120)
    assert made.returncode == 0, made.stderr
    pip = _run([str(venv / "bin" / "pip"), "install", "-q", "-e", str(ROOT)], ROOT, 300)
    assert pip.returncode == 0, f"pip install -e failed:\n{pip.stdout[-3000:]}\n{pip.stderr[-3000:]}"
    return venv / "bin" / "python"


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[Path, dict[int, str]]]:
    """A user's project: app.py with one reveal_type per expression; (folder, line -> expression)."""
    lines = USER_SCRIPT.splitlines()
    where: dict[int, str] = {}
    for expr, _, _ in EXPECTED:
        lines.append(f"    reveal_type({expr})")
        where[len(lines)] = expr  # 1-based line number
    (tmp_path / "app.py").write_text("\n".join(lines) + "\n")
    yield tmp_path, where


def test_the_editable_install_is_a_path_that_type_checkers_read(user_python: Path) -> None:
    site = Path(_run([str(user_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     ROOT, 60).stdout.strip())
    hooks = sorted(p.name for p in site.glob("__editable__*finder.py"))
    assert not hooks, (f"setuptools installed an import hook for the editable install ({hooks}), which "
                       "mypy and pyright do not follow: pyproject.toml must not map packages onto other folders")
    pth = [line for p in site.glob("__editable__*.pth") for line in p.read_text().splitlines()]
    assert [Path(line).resolve() for line in pth] == [ROOT], pth
    # The subpackages that live at the top of the repo import as skyward's, from this checkout.
    code = ("import json, skyward, skyward.stacks, skyward.providers, skyward.bootstrap as b; "
            "print(json.dumps([m.__file__ for m in (skyward, skyward.stacks, skyward.providers, b)]))")
    out = _run([str(user_python), "-c", code], ROOT, 60)
    assert out.returncode == 0, out.stderr
    package = ROOT / "skyward"
    assert [Path(f) for f in json.loads(out.stdout)] == [
        package / "__init__.py", *(package / sub / "__init__.py" for sub in ("stacks", "providers", "bootstrap"))]


def test_the_editable_install_has_the_joblib_hook(user_python: Path) -> None:
    """Beside the path, ``pip install -e .`` puts skyward-joblib.pth in site-packages (setup.py;
    tests/install/test_joblib_pth.py checks the wheels and what the line does), naming the
    checkout as where skyward is (never found through sys.path and the working folder)."""
    from skyward.joblib_pth import NAME, pth_text

    site = Path(_run([str(user_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     ROOT, 60).stdout.strip())
    assert (site / NAME).is_file(), sorted(p.name for p in site.glob("*.pth"))
    assert (site / NAME).read_text() == pth_text(ROOT.resolve())


def test_mypy_sees_the_operators_result_types(user_python: Path, project: tuple[Path, dict[int, str]]) -> None:
    pytest.importorskip("mypy", reason="mypy is not installed in the test venv (the dev extra has it)")
    folder, where = project
    (folder / "mypy.ini").write_text("[mypy]\n")  # a user's default settings, not this repo's
    out = _run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", str(folder / ".mypy_cache"),
                "--python-executable", str(user_python), "app.py"], folder, 120)
    report = out.stdout + out.stderr
    assert out.returncode == 0 and " error: " not in report, f"mypy in a user's project:\n{report}"
    revealed: dict[str, str] = {}
    for m in re.finditer(r'^app\.py:(\d+): note: Revealed type is "(.*)"$', out.stdout, re.M):
        revealed[where[int(m[1])]] = m[2].replace("builtins.", "")
    wrong = [f"{expr}: {revealed.get(expr)!r}, expected /{want}/" for expr, want, _ in EXPECTED
             if not re.fullmatch(want, revealed.get(expr, ""))]
    assert not wrong, "mypy revealed:\n" + "\n".join(wrong) + f"\n\nfull output:\n{report}"


def test_pyright_sees_the_operators_result_types(user_python: Path, project: tuple[Path, dict[int, str]]) -> None:
    pytest.importorskip("pyright", reason="pyright is not installed in the test venv (the dev extra has it)")
    folder, where = project
    out = _run([sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", str(user_python), "app.py"],
               folder, 120)
    try:
        diagnostics = json.loads(out.stdout)["generalDiagnostics"]
    except (ValueError, KeyError):
        pytest.fail(f"pyright did not report (exit {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    errors = [d for d in diagnostics if d["severity"] == "error"]
    assert not errors, "pyright in a user's project:\n" + "\n".join(
        f"app.py:{d['range']['start']['line'] + 1}: {d['message']}" for d in errors)
    revealed: dict[str, str] = {}
    for d in diagnostics:
        m = re.fullmatch(r'Type of "(.*)" is "(.*)"', d["message"], re.S)
        line = d["range"]["start"]["line"] + 1
        if m and line in where:
            revealed[where[line]] = m[2]
    wrong = [f"{expr}: {revealed.get(expr)!r}, expected /{want}/" for expr, _, want in EXPECTED
             if not re.fullmatch(want, revealed.get(expr, ""))]
    assert not wrong, "pyright revealed:\n" + "\n".join(wrong)
