"""What the client ships to remote nodes: its own skyward as a wheel, the uv binary, and (in
wheelhouse mode) wheels for every package the nodes install.

Everything is cached under ``SKYWARD_HOME/cache`` by content, so a second pool reuses it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import subprocess
import sys
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from skyward.errors import ProviderError
from skyward.paths import skyward_home

log = logging.getLogger("skyward.bootstrap")

# What the agent and the runtime helpers (instance_info is a pydantic model) need on a node.
AGENT_PACKAGES = ("cloudpickle", "lz4", "pydantic")


@dataclass(frozen=True, slots=True)
class SkywardWheel:
    path: Path
    digest: str  # content hash of the package files: changes whenever the code does


def cache_dir(*parts: str) -> Path:
    path = skyward_home().joinpath("cache", *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def uv_binary() -> Path:
    """The uv executable the client was installed with (the `uv` wheel is a dependency)."""
    from uv import find_uv_bin

    return Path(find_uv_bin())


def uv_version() -> str:
    """The uv release the client runs (index-mode nodes fetch the same one)."""
    return importlib.metadata.version("uv")


def uv_binary_gz() -> Path:
    """uv, gzipped once per uv version (38 MB -> 17 MB to upload to every new node)."""
    import gzip
    import shutil

    src = uv_binary()
    digest = hashlib.sha256(f"{src}:{src.stat().st_size}:{src.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_dir("uv", digest) / "uv.gz"
    if not out.exists():
        # A name of this process's own: two programs packing uv at once each write theirs.
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(src, "rb") as f, gzip.open(tmp, "wb", compresslevel=6) as g:
            shutil.copyfileobj(f, g, 1 << 20)
        tmp.replace(out)
    return out


def agent_requirements() -> tuple[str, ...]:
    """The agent's dependencies pinned to the client's versions (one pickle format end to end)."""
    return tuple(f"{name}=={importlib.metadata.version(name)}" for name in AGENT_PACKAGES)


@functools.cache
def skyward_wheel() -> SkywardWheel:
    """A wheel of the skyward the client is running right now (editable install or not), so a
    node always runs exactly the client's code. Built from the package files, no build backend;
    once per process (the code a process runs does not change when the files do)."""
    spec = importlib.util.find_spec("skyward")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    files: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(root, followlinks=True):  # stacks/ providers/ bootstrap/
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = Path(folder, name)
            files.append(("skyward/" + path.relative_to(root).as_posix(), path))
    h = hashlib.sha256("\n".join(agent_requirements()).encode())
    for arc, path in files:
        h.update(arc.encode() + b"\0" + path.read_bytes() + b"\0")
    digest = h.hexdigest()[:16]
    version = _version()
    out = cache_dir("wheels", "skyward", digest) / f"skyward-{version}-py3-none-any.whl"
    if not out.exists():
        _write_wheel(out, version, files)
    return SkywardWheel(out, digest)


def _version() -> str:
    try:
        return importlib.metadata.version("skyward")
    except importlib.metadata.PackageNotFoundError:
        from skyward.version import __version__

        return __version__


def _write_wheel(out: Path, version: str, files: list[tuple[str, Path]]) -> None:
    dist = f"skyward-{version}.dist-info"
    meta = {
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: skyward\nVersion: {version}\n"
            # Pinned to the client's versions: installing the wheel brings exactly those.
            + "".join(f"Requires-Dist: {r}\n" for r in agent_requirements())
        ).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: skyward\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    # A name of this process's own: two programs building the same wheel at once each write
    # theirs, and the second rename replaces the first with the same bytes.
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for arc, path in files:
            data = path.read_bytes()
            zf.writestr(arc, data)
            record.append(_record_line(arc, data))
        for arc, data in meta.items():
            zf.writestr(arc, data)
            record.append(_record_line(arc, data))
        record.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    tmp.replace(out)


def _record_line(arc: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


def wheels_for(requirements: tuple[str, ...], python: str) -> list[Path]:
    """Wheels for ``requirements`` and their dependencies, for nodes with no package index.

    Built with the client's pip for the client's platform (nodes are expected to share it) and
    cached by the requirement set. The client needs its index for this, the nodes never do.
    """
    if not requirements:
        return []
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python != here:
        raise ProviderError(
            f"wheelhouse mode builds wheels with this interpreter (Python {here}), and the nodes "
            f"want Python {python}: use Image(python='auto') or {here}, or install='index' so the "
            f"nodes fetch packages themselves."
        )
    digest = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]
    folder = cache_dir("wheelhouse", f"py{here}-{digest}")
    done = folder / ".complete"
    if not done.exists():
        log.info("building the wheelhouse for %s", ", ".join(requirements))
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
             "--wheel-dir", str(folder), *requirements],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise ProviderError(
                f"could not build wheels for {list(requirements)} on this machine (pip wheel exit "
                f"code {proc.returncode}); the nodes install from these wheels. Check the "
                f"requirement names and versions. pip said:\n{tail}"
            )
        done.touch()
    return sorted(p for p in folder.glob("*.whl"))


def wheels_for_lock(lock_text: str, python: str, indexes: tuple[str, ...] = ()) -> list[Path]:
    """Wheels of exactly the packages of a pool's lock (``skyward.records.pkglock.text``), nothing resolved:
    ``pip wheel --no-deps``, hashes checked when the lock has them. Cached by the lock."""
    if not lock_text.strip():
        return []
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python != here:
        raise ProviderError(
            f"wheelhouse mode builds wheels with this interpreter (Python {here}), and the nodes "
            f"want Python {python}: use Image(python='auto') or {here}, or install='index' so the "
            f"nodes fetch packages themselves."
        )
    digest = hashlib.sha256("\n".join([lock_text, *indexes]).encode()).hexdigest()[:16]
    folder = cache_dir("wheelhouse", f"py{here}-lock-{digest}")
    done = folder / ".complete"
    if not done.exists():
        requirements = folder / "lock.txt"
        requirements.write_text(lock_text)
        hashed = "--hash=" in lock_text and all(
            ln.endswith("\\") for ln in lock_text.splitlines() if ln.strip() and not ln.startswith(" "))
        log.info("building the wheelhouse for the pool's lock (%d packages)", lock_text.count("=="))
        from skyward.records import pkglock
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
             *(["--require-hashes"] if hashed else []),
             "--wheel-dir", str(folder), "-r", str(requirements)],
            # The pool's indexes by pip's environment, never its argv: they may hold user:token@.
            capture_output=True, text=True, env={**os.environ, **pkglock.pip_index_env(indexes)},
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise ProviderError(
                f"could not get the wheels of the pool's lock on this machine (pip wheel exit code "
                f"{proc.returncode}); the nodes install from these wheels. A version the lock names "
                f"may have been removed from the index. pip said:\n{tail}"
            )
        done.touch()
    return sorted(p for p in folder.glob("*.whl"))
