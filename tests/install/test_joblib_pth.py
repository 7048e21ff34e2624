"""Every way of installing skyward puts ``skyward-joblib.pth`` at the root of site-packages
(skyward/joblib_pth.py says why, setup.py how).

setuptools' PEP 517 hooks build, from a copy of this checkout, what pip would install: a
wheel, an editable wheel (``pip install -e .``, what CI runs) and an sdist (and a wheel from
it). Each must hold the file at its root with the line ``pth_text()`` makes, and the wheel's
RECORD must list it (so that ``pip uninstall`` removes it). The wheel's line then runs the way
site runs it at start-up, in a fresh interpreter that never imports skyward: joblib knows
"skyward" there and the error is skyward's own. The builds use this venv's setuptools (no
build isolation: nothing is fetched from an index).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import fresh_python_line

from skyward.joblib_pth import NAME, OPT_OUT, pth_text

setuptools = pytest.importorskip("setuptools")
pytest.importorskip("joblib")

ROOT = Path(__file__).resolve().parents[2]
# What a build reads: the package (its symlinked subpackages copied as the folders they are)
# and the project's files.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "skyward", "stacks", "providers", "bootstrap")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if _version(setuptools.__version__) < (69,):
        pytest.skip(
            f"this venv's setuptools is {setuptools.__version__}; pyproject.toml's build "
            f"needs setuptools>=69 (pip install -U setuptools)"
        )
    copy = tmp_path_factory.mktemp("checkout")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source,
                copy / name,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
            )
        else:
            shutil.copy2(source, copy / name)
    return copy


def _build(hook: str, folder: Path, out: Path) -> Path:
    """Run one of setuptools' PEP 517 hooks in ``folder``; the file it made in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    code = f"import sys; from setuptools import build_meta as b; print(b.{hook}(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{hook} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def wheel(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build("build_wheel", checkout, tmp_path_factory.mktemp("wheel"))


def _root_files(wheel: Path) -> dict[str, str]:
    """A wheel's files at its root (those installed at the root of site-packages): their text."""
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n).decode() for n in zf.namelist() if "/" not in n}


def _record(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        return [line.split(",")[0] for line in zf.read(name).decode().splitlines()]


def test_the_wheel_puts_the_hook_at_the_root_of_site_packages(wheel: Path) -> None:
    root = _root_files(wheel)
    assert root == {NAME: pth_text()}, sorted(root)
    assert NAME in _record(wheel)
    assert pth_text().startswith("import ") and pth_text().count("\n") == 1  # what site runs


def test_the_editable_wheel_has_the_hook_beside_its_path(checkout: Path, tmp_path: Path) -> None:
    """``pip install -e .``: setuptools' own .pth is the checkout's path (a type checker reads
    it, tests/install/test_typed_install.py), the hook's is a file of its own."""
    editable = _build("build_editable", checkout, tmp_path)
    root = _root_files(editable)
    paths = [name for name in root if name.startswith("__editable__")]
    assert len(paths) == 1 and [Path(p) for p in root[paths[0]].split()] == [checkout], root
    # its hook finds skyward in the checkout, where the editable install left it
    assert root[NAME] == pth_text(checkout.resolve()) and set(root) == {paths[0], NAME}, sorted(root)
    assert NAME in _record(editable)


def test_a_wheel_built_from_the_sdist_has_the_hook(checkout: Path, tmp_path: Path) -> None:
    sdist = _build("build_sdist", checkout, tmp_path / "sdist")
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
        tf.extractall(tmp_path / "unpacked", filter="data")
    assert {"setup.py", "skyward/joblib_pth.py"} <= names, sorted(names)
    unpacked = next((tmp_path / "unpacked").iterdir())
    wheel = _build("build_wheel", unpacked, tmp_path / "wheel")
    assert _root_files(wheel) == {NAME: pth_text()}


# A fresh interpreter: the start-up hooks this venv installed are taken off sys.meta_path, the
# wheel's .pth is run by site as at start-up (site.addsitedir), then a script that never
# imports skyward asks joblib for the backend. It prints what it got, as JSON.
_FRESH = """\
import json, site, sys
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "SkywardJoblibHook"]
site.addsitedir(sys.argv[1])
hooks = [type(f).__name__ for f in sys.meta_path].count("SkywardJoblibHook")
from joblib import Parallel, delayed
try:
    Parallel(n_jobs=2, backend="skyward")(delayed(abs)(i) for i in range(2))
    got = "ran"
except Exception as exc:
    got = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
print(json.dumps({"hooks": hooks, "got": got, "left": [type(f).__name__ for f in sys.meta_path]}))
"""


@pytest.fixture
def site_dir(wheel: Path, tmp_path: Path) -> Iterator[Path]:
    """A folder holding the wheel's files, as site-packages holds them once it is installed
    (skyward's dependencies come from this venv)."""
    folder = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(folder)
    yield folder


def _fresh(site_dir: Path, **env: str) -> dict[str, object]:
    result: dict[str, object] = json.loads(fresh_python_line(_FRESH, str(site_dir), **env))
    return result


def test_the_wheels_line_makes_joblib_know_skyward_in_a_fresh_interpreter(site_dir: Path) -> None:
    out = _fresh(site_dir)
    assert out["hooks"] == 1, out
    assert str(out["got"]).startswith(
        "skyward.errors.NoActivePoolError: the skyward joblib backend runs on a pool"
    ), out
    assert "SkywardJoblibHook" not in out["left"], out  # it took itself off once it had worked


def test_the_line_does_nothing_when_opted_out(site_dir: Path) -> None:
    out = _fresh(site_dir, **{OPT_OUT: "1"})
    assert out["hooks"] == 0, out
    assert "Invalid backend: skyward" in str(out["got"]), out


def test_the_line_never_imports_a_skyward_planted_in_the_working_folder(site_dir: Path, tmp_path: Path) -> None:
    """``python -c`` (and ``-m``) put the working folder first on sys.path: a ``skyward``
    package someone left there must not be what the hook imports."""
    work = tmp_path / "work"
    (work / "skyward").mkdir(parents=True)
    marker = tmp_path / "planted-ran"
    (work / "skyward" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    done = subprocess.run([sys.executable, "-c", _FRESH + "print(sys.modules['skyward'].__file__)\n",
                           str(site_dir)], cwd=work, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    *_, line, where = done.stdout.strip().splitlines()
    assert not marker.exists(), "the hook imported the skyward package of the working folder"
    assert Path(where).parent.parent == site_dir, where  # the installed one
    assert str(json.loads(line)["got"]).startswith("skyward.errors.NoActivePoolError"), line
