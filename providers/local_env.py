"""The Local provider's environment: the client's own interpreter, plus an overlay for
requirements it does not already satisfy, built once with uv and cached by content."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from skyward.errors import ConfigError, ProviderError
from skyward.paths import skyward_home


def unsatisfied(requirements: tuple[str, ...]) -> list[str]:
    """The requirements this interpreter does not already meet."""
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


def uv_binary() -> str:
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except Exception:
        found = shutil.which("uv")
        if found:
            return found
    raise ProviderError(
        "uv is needed to install Image(pip=[...]) packages for Local nodes and was not found. "
        "Install it with `pip install uv` (it is a dependency of skyward, so reinstalling skyward also works)."
    )


def overlay(requirements: list[str], extra_indexes: list[str]) -> Path:
    """A directory holding ``requirements`` installed for this interpreter (cached)."""
    key = "\n".join([sys.version, *sorted(requirements), *extra_indexes])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = skyward_home() / "cache" / "local-overlays"
    root.mkdir(parents=True, exist_ok=True)
    target = root / digest
    with open(root / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two pools building the same overlay: one builds
        if (target / ".complete").exists():
            return target
        building = root / f"{digest}.tmp"
        shutil.rmtree(building, ignore_errors=True)
        cmd = [uv_binary(), "pip", "install", "--quiet", "--compile-bytecode",
               "--python", sys.executable, "--target", str(building)]
        for url in extra_indexes:
            cmd += ["--extra-index-url", url]
        proc = subprocess.run([*cmd, *requirements], capture_output=True, text=True)
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
