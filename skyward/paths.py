"""Where skyward keeps its state on this machine (``SKYWARD_HOME``, default ``~/.skyward``)."""

from __future__ import annotations

import os
from pathlib import Path


def skyward_home() -> Path:
    return Path(os.environ.get("SKYWARD_HOME") or Path.home() / ".skyward").expanduser()
