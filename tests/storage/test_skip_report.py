"""Where FUSE cannot mount, the volume tests skip and the run's output says why (no -rs needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_output_says_why_the_fuse_tests_were_skipped(tmp_path: Path) -> None:
    # No fusermount on PATH: the same skip as a machine without FUSE.
    env = {**os.environ, "PATH": str(tmp_path), "SKYWARD_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/storage/test_volume_local.py"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "storage tests skipped" in out.stdout, out.stdout[-3000:]
    assert "FUSE mount tests skipped: fusermount is not installed" in out.stdout, out.stdout[-3000:]
