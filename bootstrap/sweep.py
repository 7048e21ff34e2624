"""Folders of pools and agents whose processes are all gone: who owns one, and the sweep.

A pool's folders (a Local pool's ``skyward-<id>-*`` in the temp folder and in ``/dev/shm``, an
agent's ``/dev/shm/skyward-node-*``) are removed by their owners when they close, and by the
agents' lease watchdog when the client dies. When every process of a pool is killed outright
(the OOM killer, SIGKILL), nobody is left to do either. So each owner holds a shared ``flock``
on the folder's lock file (:data:`LOCK`) for as long as it lives (the kernel drops it with the
process, however it ends), and :func:`sweep` removes the folders whose lock nobody holds.

The lock is the whole test, not the folder's age and not a pid (which another process may
have taken since, or which means nothing in another pid namespace sharing ``/dev/shm``). A
folder without a lock file (one made by an older version, or one being made right now) is
left alone unless ``unowned`` says otherwise. Only the user's own folders are looked at, never
a link. Standard library only: it runs on the nodes, at every agent's start.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Callable
from pathlib import Path

LOCK = ".owner.lock"
# A folder holding this file is never swept: a named pool's, which lives in the registry with no
# process at all while it sleeps at zero nodes, and which `skyward down` removes.
KEPT = ".kept"

_held: list[int] = []  # this process's locks: kept open (and so held) until it ends


def hold(folder: str | os.PathLike[str]) -> int | None:
    """Hold ``folder``'s lock until :func:`release` or this process's end (made here when the
    folder has none: under another name first, locked, then renamed, so no sweep ever finds it
    unheld). The lock's descriptor, or None where the folder is not there or cannot be locked."""
    path = os.path.join(folder, LOCK)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        tmp = os.path.join(folder, f"{LOCK}.{os.getpid()}.{os.urandom(4).hex()}")
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.rename(tmp, path)
        _held.append(fd)
        return fd
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # a sweep is removing it: its owners are gone
        os.close(fd)
        return None
    _held.append(fd)
    return fd


def release(fd: int | None) -> None:
    """Let go of a lock :func:`hold` took (its folder was removed, or is another's now)."""
    if fd is not None and fd in _held:
        _held.remove(fd)
        os.close(fd)


def sweep(root: str | os.PathLike[str], pattern: str,
          unowned: Callable[[Path], bool] | None = None) -> list[Path]:
    """Remove the folders under ``root`` matching ``pattern`` that are this user's and whose
    owners are all gone: their lock file is held by nobody, or (a folder without one)
    ``unowned(folder)`` says so. Returns what was removed. Cheap: one directory listing, and
    a stat and a lock attempt per match."""
    me = os.geteuid()
    removed: list[Path] = []
    try:
        found = list(Path(root).glob(pattern))
    except OSError:
        return removed
    for folder in found:
        try:
            st = folder.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
                continue
        except OSError:
            continue
        if os.path.lexists(folder / KEPT):
            continue
        try:
            fd = os.open(folder / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if unowned is not None and unowned(folder):
                import shutil  # (here: with bz2 and lzma, it costs every agent's start 5 ms)

                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: some owner lives
            continue
        try:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)  # under the lock: nobody takes it meanwhile
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


SHM = "/dev/shm"


def local_pools(workdir: str | None = None, shm: str | os.PathLike[str] = SHM) -> list[Path]:
    """Remove the folders of Local pools whose processes are all gone (``skyward-<id>-*`` in the
    temp folder, or ``workdir``, and in shared memory ``shm``): those whose lock nobody holds.
    (Here rather than in the Local provider, so that `skyward ls` sweeps without loading it.)"""
    import tempfile

    tmp = tempfile.gettempdir()
    removed = sweep(tmp, "skyward-*-*")
    if workdir is not None and os.path.abspath(workdir) != os.path.abspath(tmp):
        removed += sweep(workdir, "skyward-*-*")
    if os.path.isdir(shm):
        removed += sweep(shm, "skyward-*-*")
    return removed


def pid_namespace() -> str:
    """This process's pid namespace (its inode number), or "0" where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid").rpartition("[")[2].rstrip("]") or "0"
    except OSError:
        return "0"


def sweep_nodes() -> list[Path]:
    """The shared-memory folders of agents that are gone (``/dev/shm/skyward-node-*``): those
    whose lock nobody holds, of any pid namespace, and those an older agent made without a
    lock whose pid is gone from this namespace (``skyward-node-<pid>-<ns>-*``: another
    namespace's pids mean nothing here)."""
    from .procs import alive

    ns = pid_namespace()

    def unowned(folder: Path) -> bool:
        parts = folder.name.split("-")
        try:
            pid = int(parts[2])
        except (IndexError, ValueError):
            return False
        return len(parts) > 4 and parts[3] == ns and pid != os.getpid() and not alive(pid)

    if not os.access(SHM, os.W_OK):
        return []
    return sweep(SHM, "skyward-node-*", unowned)
