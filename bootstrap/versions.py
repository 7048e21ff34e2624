"""Which package versions a Python environment has, and which differ between two of them.

The agent reports its node's in WELCOME; the client compares them with its own when a node
joins. A pickled value made of a package (a numpy array, a pandas frame) is rebuilt by that
package on the other side, so a different version there may fail to unpickle it, or worse,
rebuild it differently: better said at start than found at the first result.

Read from the ``*.dist-info`` folder names on ``sys.path`` (the first one wins, as for imports):
well under a millisecond, where ``importlib.metadata`` takes a few hundred. Standard library
only (the agent imports it).
"""

from __future__ import annotations

import os
import re
import sys

# Tools that are never part of a pickled value, and skyward itself (the client ships its own).
IGNORED = frozenset({"pip", "setuptools", "wheel", "uv", "skyward", "distribute"})
_cached: dict[str, str] | None = None


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    """{normalized name: version} of this environment (computed once per process)."""
    global _cached
    if _cached is None:
        found: dict[str, str] = {}
        for entry in sys.path:
            try:
                folder = os.scandir(entry or ".")
            except OSError:
                continue
            with folder:
                for item in folder:
                    if item.name.endswith(".dist-info"):
                        name, _, version = item.name[: -len(".dist-info")].partition("-")
                        if name and version:
                            found.setdefault(normalize(name), version)
        _cached = found
    return _cached


def differences(here: dict[str, str], there: dict[str, str]) -> list[tuple[str, str, str]]:
    """(name, version here, version there) for the packages both sides have, at other versions."""
    return sorted((name, v, there[name]) for name, v in here.items()
                  if name in there and there[name] != v and name not in IGNORED)
