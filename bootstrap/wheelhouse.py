"""What the client ships to remote nodes: its own skyward as a wheel, the uv binary, and (in
wheelhouse mode) wheels for every package the nodes install.

Everything is cached under ``SKYWARD_HOME/cache`` by content, so a second pool reuses it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyward.errors import ProviderError
from skyward.paths import cache_root

log = logging.getLogger("skyward.bootstrap")

# What the agent and the runtime helpers (instance_info is a pydantic model) need on a node.
AGENT_PACKAGES = ("cloudpickle", "lz4", "pydantic")


@dataclass(frozen=True, slots=True)
class SkywardWheel:
    path: Path
    digest: str  # content hash of the package files: changes whenever the code does
    sha256: str = ""  # of the wheel file (the nodes' lock checks it)


def cache_dir(*parts: str) -> Path:
    path = cache_root().joinpath(*parts)  # 0700: a private index's wheels are cached here too
    path.mkdir(parents=True, exist_ok=True)
    return path


def installed_version(name: str) -> str:
    """The version of distribution ``name`` installed here, as ``importlib.metadata.version``
    finds it (the first on ``sys.path``), read from its ``.dist-info`` folder's name where it
    has one (versions.py: well under a millisecond for all of them); only a distribution
    without one is looked up through ``importlib.metadata``, which parses its METADATA with
    the email package (5-8 ms a lookup, four of them on every SSH pool's start). Raises
    importlib.metadata.PackageNotFoundError when it is not installed."""
    from . import versions

    found = versions.installed().get(versions.normalize(name))
    if found is not None:
        return found
    import importlib.metadata

    return importlib.metadata.version(name)


def uv_binary() -> Path:
    """The uv executable the client was installed with (the `uv` wheel is a dependency)."""
    from uv import find_uv_bin

    return Path(find_uv_bin())


def uv_version() -> str:
    """The uv release the client runs (index-mode nodes fetch the same one)."""
    return installed_version("uv")


def uv_binary_gz() -> Path:
    """uv, gzipped once per uv version (38 MB -> 17 MB to upload to every new node)."""
    import gzip

    return _packed_uv("uv.gz", lambda tmp: gzip.open(tmp, "wb", compresslevel=6))


def uv_binary_lz4() -> Path:
    """uv as an lz4 frame, once per uv version (38 MB -> 19 MB; 0.8 s), for nodes that have the lz4
    command: it unpacks in 0.03 s of CPU where gunzip takes 0.25 s (a fresh node's largest
    step on a small machine)."""
    import lz4.frame

    return _packed_uv("uv.lz4", lambda tmp: lz4.frame.open(tmp, "wb", compression_level=6))


def _packed_uv(name: str, writer: Callable[[Path], Any]) -> Path:
    import shutil

    src = uv_binary()
    digest = hashlib.sha256(f"{src}:{src.stat().st_size}:{src.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_dir("uv", digest) / name
    if not out.exists():
        # A name of this process's own: two programs packing uv at once each write theirs.
        tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(src, "rb") as f, writer(tmp) as g:
            shutil.copyfileobj(f, g, 1 << 20)
        tmp.replace(out)
    return out


@functools.cache
def agent_requirements() -> tuple[str, ...]:
    """The agent's dependencies pinned to the client's versions (one pickle format end to end);
    once per process, as skyward_wheel: the modules it imported are those versions (and reading
    four packages' metadata is 10 ms of every pool's start)."""
    return tuple(f"{name}=={installed_version(name)}" for name in AGENT_PACKAGES)


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
    return SkywardWheel(out, digest, hashlib.sha256(out.read_bytes()).hexdigest())


def _version() -> str:
    try:
        return installed_version("skyward")
    except ImportError:  # (PackageNotFoundError)
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
    with zipfile.ZipFile(tmp, "w") as zf:
        for arc, path in files:
            data = path.read_bytes()
            _add(zf, arc, data)
            record.append(_record_line(arc, data))
        for arc, data in meta.items():
            _add(zf, arc, data)
            record.append(_record_line(arc, data))
        record.append(f"{dist}/RECORD,,")
        _add(zf, f"{dist}/RECORD", ("\n".join(record) + "\n").encode())
    tmp.replace(out)


def _add(zf: zipfile.ZipFile, arc: str, data: bytes) -> None:
    """One entry with no time of its own (1980-01-01, zip's earliest) and fixed permissions:
    the same files make the same wheel, byte for byte, whenever and wherever it is built. (A
    node that has a wheel of that name and size keeps it; the lock then checks its sha256.)"""
    info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=1)


def _record_line(arc: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


# -- pip, for the wheels of a lock -----------------------------------------------------------------
# uv resolves and installs, but has no command that fetches wheels (``pip wheel``/``pip download``):
# pip does that part. Many environments have no pip (uv, Poetry, pdm and conda make them without
# it), and skyward never installs into the user's environment behind their back: it runs a pip of
# its own, kept in its cache, with this same interpreter (so its platform tags) and environment
# (so plugins such as keyring are still found).
_BUNDLED_PIP = (
    # CPython's ensurepip carries a pip wheel; Debian moves it here.
    "ensurepip/_bundled",
    "/usr/share/python-wheels",
)


def pip_command() -> tuple[list[str], dict[str, str]]:
    """How to run pip for this interpreter: (argv prefix, environment additions). The
    environment's own pip where it has one, else skyward's (``isolated_pip``)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"], {}
    folder = isolated_pip()
    path = os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])
    return [sys.executable, "-m", "pip"], {"PYTHONPATH": path}


def _bundled_pip_wheel(places: tuple[str, ...]) -> Path | None:
    """The newest pip wheel in the first of ``places`` that has one (relative ones: beside
    this interpreter's ensurepip, whose wheel is made for it), or None."""
    from packaging.version import InvalidVersion, Version

    def version(wheel: Path) -> Version:
        try:
            return Version(wheel.name.split("-")[1])
        except (IndexError, InvalidVersion):
            return Version("0")

    ensurepip = importlib.util.find_spec("ensurepip")
    for place in places:
        folder = Path(place)
        if not folder.is_absolute():
            if ensurepip is None or not ensurepip.origin:
                continue
            folder = Path(ensurepip.origin).parent / folder.relative_to("ensurepip")
        wheels = sorted(folder.glob("pip-*-py3-none-any.whl"), key=version)
        if wheels:
            return wheels[-1]
    return None


def isolated_pip(bundled: tuple[str, ...] = _BUNDLED_PIP) -> Path:
    """A folder holding pip for this interpreter, in skyward's cache (never in the user's
    environment): the pip wheel bundled with the interpreter, unpacked, or else pip fetched from
    the package index with uv. ``bundled``: where to look for that wheel."""
    wheel = _bundled_pip_wheel(bundled)
    if wheel is not None:
        folder = cache_dir("tools") / wheel.name.removesuffix(".whl")
        if not (folder / "pip" / "__main__.py").exists():
            tmp = folder.with_name(f".{folder.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(tmp)
            _rename_into_place(tmp, folder)
        return folder
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    folder = cache_dir("tools") / f"pip-from-index-py{here}"
    if (folder / "pip" / "__main__.py").exists():
        return folder
    from skyward.records import resolver

    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    where = resolver.sources()
    try:
        proc = subprocess.run(
            [resolver.uv_binary(), "pip", "install", "--quiet", "--python", sys.executable, "--target", str(tmp),
             *where.args, "pip"],
            capture_output=True, text=True, timeout=300, env=where.environ(UV_NO_PROGRESS="1"))
        failed = proc.returncode != 0
        said = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    except subprocess.TimeoutExpired:
        failed, said = True, ["(no answer from the package index in 300 s)"]
    if failed:
        import shutil

        from skyward.observe.secrets import mask_url

        shutil.rmtree(tmp, ignore_errors=True)
        raise ProviderError(
            f"the nodes' wheels are fetched with pip, and this environment ({sys.prefix}) has none; "
            f"skyward runs a pip of its own there, but found no pip wheel bundled with this Python and "
            f"could not get pip from the package index with uv:\n  " + "\n  ".join(mask_url(line) for line in said)
            + f"\nInstall pip into this environment (`uv pip install --python {sys.executable} pip`, or "
            f"`{sys.executable} -m ensurepip`), or let the nodes fetch their packages themselves "
            f"(sky.SSH(install='index'), the clouds' default)."
        )
    _rename_into_place(tmp, folder)
    return folder


def _rename_into_place(tmp: Path, folder: Path) -> None:
    """``tmp`` becomes ``folder``; when another program put one there first, theirs is kept."""
    import shutil

    try:
        tmp.replace(folder)
    except OSError:  # there already (a directory is not replaced): the same files
        shutil.rmtree(tmp, ignore_errors=True)


def wheels_for_lock(lock_text: str, python: str, indexes: tuple[str, ...] = ()) -> list[Path]:
    """Wheels of exactly the packages of a pool's lock (``skyward.records.pkglock.text``), nothing resolved:
    ``pip wheel --no-deps`` (this environment's pip, or skyward's own: ``pip_command``), hashes
    checked when the lock has them, from the package sources the lock was resolved from
    (``resolver.pip_index_env``). Cached by the lock."""
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
        from skyward.records import resolver

        pip, pip_env = pip_command()
        proc = subprocess.run(
            [*pip, "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
             *(["--require-hashes"] if hashed else []),
             "--wheel-dir", str(folder), "-r", str(requirements)],
            # The indexes by pip's environment, never its argv: they may hold user:token@.
            capture_output=True, text=True, env={**os.environ, **pip_env, **resolver.pip_index_env(indexes)},
        )
        if proc.returncode != 0:
            from skyward.observe.secrets import mask_url

            tail = mask_url("\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:]))
            raise ProviderError(
                f"could not get the wheels of the pool's lock on this machine (pip wheel exit code "
                f"{proc.returncode}); the nodes install from these wheels. A version the lock names "
                f"may have been removed from the index. pip said:\n{tail}"
            )
        done.touch()
    return sorted(p for p in folder.glob("*.whl"))
