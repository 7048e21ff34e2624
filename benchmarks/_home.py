"""A SKYWARD_HOME of its own for a benchmark run (its records, trails and logs stay apart from
the user's), removed when the run ends; a SKYWARD_HOME already set is used as it is."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def scratch_home() -> None:
    if os.environ.get("SKYWARD_HOME"):
        return
    home = tempfile.mkdtemp(prefix="skyward-bench-home-")
    os.environ["SKYWARD_HOME"] = home
    atexit.register(shutil.rmtree, home, True)
