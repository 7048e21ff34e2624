"""Every script in examples/ runs as it stands on sky.Local() (SSH and cloud ones fall back to
Local or to a local S3 server when no hosts or credentials are given), as a new user would run it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))
NEEDS = {"torch_ddp.py": "torch", "sklearn_grid_search.py": "sklearn", "joblib_fanout.py": "joblib",
         "storage_volumes.py": "moto"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script: Path, tmp_path: Path) -> None:
    needed = NEEDS.get(script.name)
    if needed and importlib.util.find_spec(needed) is None:
        pytest.skip(f"{script.name} needs {needed}, which is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("SKYWARD_HOSTS", "SKYWARD_BUCKET")}
    env["SKYWARD_HOME"] = str(tmp_path / "home")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150,
                          cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{script.name} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"{script.name} printed nothing"
