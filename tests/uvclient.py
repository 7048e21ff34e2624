"""A client environment the way uv users make one: ``uv venv`` (no pip in it) and
``uv pip install -e <checkout>``. Built from this machine's package sources (the index settings
pip has here, handed to uv by its environment, as a user's uv.toml would), so it works offline
wherever the suite's own venv could be installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from skyward.records import resolver

ROOT = Path(__file__).resolve().parents[1]


def machine_sources() -> dict[str, str]:
    """uv settings naming the package sources this machine's pip is configured with (asked of the
    suite's own pip, which this venv has: the code under test is not asked)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          timeout=60)
    conf = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        conf[key.split(".", 1)[-1].strip()] = value.strip().strip("'\"")
    out = {}
    index = os.environ.get("PIP_INDEX_URL") or conf.get("index-url")
    extra = " ".join([*os.environ.get("PIP_EXTRA_INDEX_URL", "").split(), *conf.get("extra-index-url", "").split()])
    links = [*os.environ.get("PIP_FIND_LINKS", "").split(), *conf.get("find-links", "").split()]
    if index:
        out["UV_INDEX_URL"] = index
    if extra:
        out["UV_EXTRA_INDEX_URL"] = extra
    if links:
        out["UV_FIND_LINKS"] = ",".join(dict.fromkeys(links))
    return out


def clean_env(**extra: str) -> dict[str, str]:
    """This environment less what points at the suite's venv (a user's shell would not have it)."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTEST_CURRENT_TEST"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def make(folder: Path) -> Path:
    """``uv venv`` in ``folder`` and the checkout installed into it with ``uv pip install -e``; the
    venv's python (asserted to have no pip)."""
    uv = resolver.uv_binary()
    venv = folder / ".venv"
    env = clean_env(**machine_sources(), UV_NO_PROGRESS="1")
    # sys.executable is the suite's venv: uv builds on its base interpreter, as `uv venv` would.
    made = subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = subprocess.run([uv, "pip", "install", "--quiet", "--python", str(python), "-e", str(ROOT)],
                               env=env, capture_output=True, text=True, timeout=300, cwd=folder)
    assert installed.returncode == 0, f"uv pip install -e failed:\n{installed.stderr[-3000:]}"
    no_pip = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('pip'))"],
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert no_pip.stdout.strip() == "None", f"the uv venv has pip: {no_pip.stdout}{no_pip.stderr}"
    return python
