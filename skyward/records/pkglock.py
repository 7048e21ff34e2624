"""A pool's lock, as its record keeps it: the exact Python packages its nodes install.

Every pool resolves ``Image.pip`` (after plugin transforms) -- plus, on remote nodes, the agent's
own dependencies -- once, on the client (skyward.records.resolver, with uv), for the nodes' Python
and platform. The nodes then install exactly that list with ``--no-deps`` (and
``--require-hashes`` when every line has a hash): what the record says is what the nodes have.
Reproducing a pool hands the recorded list back (``pinned``) and nothing is resolved at all.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ProviderError
from ..version import __version__

# Reproducing a pool: the packages of its record, installed as they are (see pinned()).
_PINNED: contextvars.ContextVar[tuple[Package, ...] | None] = contextvars.ContextVar(
    "skyward_pinned_packages", default=None)


@dataclass(frozen=True, slots=True)
class Package:
    """One locked distribution: canonical name, exact version, the hashes uv gave ("sha256:...")."""

    name: str
    version: str
    hashes: tuple[str, ...] = ()

    def line(self, hashes: bool = True) -> str:
        text = f"{self.name}=={self.version}"
        if hashes and self.hashes:
            text += "".join(f" \\\n    --hash={h}" for h in self.hashes)
        return text

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "hashes": list(self.hashes)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Package:
        return cls(canonical(data["name"]), str(data["version"]), tuple(data.get("hashes") or ()))


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def text(packages: Iterable[Package]) -> str:
    """A requirements file installing exactly ``packages`` (with their hashes when all have one)."""
    packages = sorted(packages, key=lambda p: p.name)
    hashes = bool(packages) and all(p.hashes for p in packages)
    return "".join(p.line(hashes) + "\n" for p in packages)


def all_hashed(packages: Sequence[Package]) -> bool:
    return bool(packages) and all(p.hashes for p in packages)


def digest(packages: Iterable[Package]) -> str:
    import hashlib  # (here: OpenSSL's import is 3 ms of a Local pool's way to its nodes)

    return hashlib.sha256(text(packages).encode()).hexdigest()[:16]


def parse(requirements: str) -> tuple[Package, ...]:
    """The packages of a ``uv pip compile`` output (``name==version`` lines, ``--hash`` options)."""
    joined = re.sub(r"\\\n", " ", requirements)
    out = []
    for raw in joined.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if not m:
            raise ProviderError(f"cannot read the resolved requirement {line!r} (expected name==version)")
        out.append(Package(canonical(m[1]), m[2], tuple(re.findall(r"--hash=(\S+)", line))))
    return tuple(out)


# -- reproducing: the recorded packages, handed to whichever provider builds the nodes ----------
@contextlib.contextmanager
def pinned(packages: Sequence[Package] | None) -> Iterator[None]:
    """Clusters made inside this block install ``packages`` as they are, resolving nothing."""
    token = _PINNED.set(tuple(packages) if packages is not None else None)
    try:
        yield
    finally:
        _PINNED.reset(token)


def current_pin() -> tuple[Package, ...] | None:
    """The packages of the pool being reproduced (None: resolve as usual). Clusters read it when
    they are made, in the thread that opens the pool."""
    return _PINNED.get()


def describe(packages: Sequence[Package], *, python: str, platform: str | None, indexes: Sequence[str],
             resolver: str, apt: dict[str, str] | None = None, pinned_from: bool = False, **extra: Any) -> dict[str, Any]:
    """The lock as the pool's record keeps it; ``resolver``: what made it (``uv --version``)."""
    return {
        "python": python,
        "platform": platform or f"{sys.platform}-{os.uname().machine}",
        "packages": [p.to_json() for p in sorted(packages, key=lambda p: p.name)],
        "apt": dict(sorted((apt or {}).items())),
        "skyward": __version__,
        "resolver": resolver,
        "indexes": list(indexes),
        "pinned": pinned_from,
        **extra,
    }
