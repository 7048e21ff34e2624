"""Where skyward keeps its state on this machine (``SKYWARD_HOME``, default ``~/.skyward``).

The home holds pools' secrets, records, logs and a cache of wheels (those of a private index
too), so it is the user's alone: :func:`private_home` makes it 0700 (and its ``cache/``, by
:func:`cache_root`), and takes group and other access away from one made before that, when it
is ours. Everything under it is then out of other users' reach whatever the umask made it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def skyward_home() -> Path:
    """The home's path; :func:`private_home` makes it (0700) where it does not exist yet."""
    home = Path(os.environ.get("SKYWARD_HOME") or Path.home() / ".skyward").expanduser()
    if str(home) not in _PRIVATE:
        try:
            _private(home)
        except OSError:
            pass  # not writable here: whoever writes under it says so
    return home


def private_home() -> Path:
    """``SKYWARD_HOME``, made 0700 if missing and closed to other users if it is not (raises
    ``OSError`` when it cannot be made)."""
    home = Path(os.environ.get("SKYWARD_HOME") or Path.home() / ".skyward").expanduser()
    _private(home)
    return home


def cache_root() -> Path:
    """``SKYWARD_HOME/cache``, 0700 like the home (wheels of a private index are cached there)."""
    cache = private_home() / "cache"
    _private(cache)
    return cache


_PRIVATE: set[str] = set()  # the folders made private in this process (one stat each, once)


def _private(folder: Path) -> None:
    key = str(folder)
    if key in _PRIVATE:
        return
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
    st = os.stat(folder)
    if stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == os.geteuid():
        os.chmod(folder, stat.S_IMODE(st.st_mode) & 0o700)  # a home made before this, or by the umask
    _PRIVATE.add(key)
