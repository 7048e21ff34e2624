"""The Local provider's environment: the client's own interpreter, plus an overlay for
requirements it does not already satisfy, built once with uv and cached by content."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from skyward.errors import ConfigError, ProviderError
from skyward.paths import cache_root
from skyward.records import resolver
from skyward.records.pkglock import Package


def unsatisfied(requirements: tuple[str, ...]) -> list[str]:
    """The requirements this interpreter does not already meet."""
    if not requirements:
        return []
    import importlib.metadata  # on first use: it imports email, zipfile... (tens of ms)

    from packaging.requirements import InvalidRequirement, Requirement

    missing = []
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise ConfigError(
                f"Image(pip=[{text!r}]) is not a valid requirement ({exc}); use pip syntax "
                f"such as 'numpy', 'numpy>=1.26' or 'torch==2.4.*'."
            ) from exc
        if req.url or (req.marker is not None and not req.marker.evaluate()):
            if req.url:
                missing.append(text)
            continue
        try:
            version = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.append(text)
    return missing


def locked(requirements: tuple[str, ...], indexes: list[str],
           pin: tuple[Package, ...] | None) -> tuple[tuple[Package, ...], tuple[Package, ...]]:
    """(what the nodes use for ``requirements``, what must be installed for them).

    Requirements this interpreter meets are what it has installed (and their dependencies); the
    others are resolved once by uv for it and installed exactly as resolved. Reproducing
    (``pin``): the recorded packages, installing those whose version differs from the one here.
    """
    if pin is not None:
        return pin, tuple(p for p in pin if resolver.installed_version(p.name) != p.version)
    missing = unsatisfied(requirements)
    have = resolver.installed([r for r in requirements if r not in missing])
    resolved = resolver.resolve(missing, python=sys.executable, indexes=indexes) if missing else ()
    new = {p.name for p in resolved}
    return tuple(sorted([*(p for p in have if p.name not in new), *resolved], key=lambda p: p.name)), resolved


def overlay(requirements: list[str], extra_indexes: list[str], *, exact: bool = False) -> Path:
    """A directory holding ``requirements`` installed for this interpreter (cached). ``exact``:
    they are a lock (``name==version``, maybe with hashes): installed as they are, no resolution."""
    key = "\n".join([sys.version, *sorted(requirements), *extra_indexes, str(exact)])
    import hashlib

    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = cache_root() / "local-overlays"  # (cache/ is 0700: a private index's packages land here)
    root.mkdir(parents=True, exist_ok=True)
    target = root / digest
    with open(root / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two pools building the same overlay: one builds
        if (target / ".complete").exists():
            return target
        building = root / f"{digest}.tmp"
        shutil.rmtree(building, ignore_errors=True)
        cmd = [resolver.uv_binary("installs Image(pip=[...]) packages for Local nodes"), "pip", "install", "--quiet", "--compile-bytecode",
               "--python", sys.executable, "--target", str(building)]
        # The index URLs go in uv's environment, never its argv: they may hold user:token@.
        if exact:
            building.mkdir(parents=True)
            (building / ".lock.txt").write_text("\n".join(requirements) + "\n")
            hashed = all("--hash=" in r for r in requirements)
            where = resolver.sources(extra_indexes)
            cmd += ["--no-deps", *(["--require-hashes"] if hashed else []), *where.args,
                    "-r", str(building / ".lock.txt")]
            env = where.environ()
            requirements = []
        else:
            env = {**os.environ, **resolver.extra_index_env(extra_indexes)}
        proc = subprocess.run([*cmd, *requirements], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            shutil.rmtree(building, ignore_errors=True)
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise ProviderError(
                f"installing {requirements} for the Local nodes failed (uv exit code "
                f"{proc.returncode}):\n{tail}\nCheck the requirement names and versions in Image(pip=...)."
            )
        (building / ".complete").touch()
        shutil.rmtree(target, ignore_errors=True)
        os.replace(building, target)
    return target
