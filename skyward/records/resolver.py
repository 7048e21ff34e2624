"""uv on this machine and what it resolves: the making of a pool's lock (skyward.records.pkglock
is the lock itself, as the record keeps it).

uv is found beside this interpreter, as the ``uv`` package or on PATH; ``resolve`` runs ``uv pip
compile --generate-hashes`` for the nodes' Python and platform, with the package sources this
machine's uv and pip are configured with (skyward.records.pkgsources) plus ``Image.pip_indexes``.
The URLs reach uv (and pip) through their environment, never their command line: an index URL's
``user:token@`` is a secret, and ``ps`` shows argv to every user. Also here: what this
interpreter and this machine have installed already (a Local node runs this interpreter).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import ProviderError
from .pkglock import Package, canonical, parse


# -- uv on this machine -----------------------------------------------------------------------
def uv_binary(what: str = "resolves the packages of every pool") -> str:
    """The uv skyward runs; an error saying what needed it (``what``) and how to get it."""
    # The uv package's binary sits with this interpreter's scripts: found without importing
    # uv._find_uv (which loads sysconfig: 3 ms of every Local pool's start).
    beside = os.path.join(os.path.dirname(sys.executable), "uv")
    if sys.prefix != sys.base_prefix and os.access(beside, os.X_OK):
        return beside
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except Exception:
        found = shutil.which("uv")
        if found:
            return found
    raise ProviderError(missing_uv(what))


def missing_uv(what: str) -> str:
    """The error for a client without uv: where it was looked for and how to install it, for an
    environment with pip and for one without."""
    return (
        f"uv {what} and was not found: not beside this Python ({sys.executable}), not as the `uv` "
        f"package, not on PATH. It is a dependency of skyward: install it into this environment with "
        f"`{sys.executable} -m pip install uv`, or, where it has no pip, install uv on its own with "
        f"`curl -LsSf https://astral.sh/uv/install.sh | sh` (skyward finds it on PATH)."
    )


@functools.cache
def uv_version() -> str:
    """``uv --version`` of the uv skyward uses, asked once per uv binary (kept beside the
    cache: every pool's lock names its resolver, and a process start costs tens of ms)."""
    try:
        binary = uv_binary()
        st = os.stat(binary)
    except (OSError, ProviderError):
        return "uv"
    # (zlib: loaded already, where hashlib's OpenSSL import would cost a Local pool's start 3 ms)
    key = f"{zlib.crc32(binary.encode()):08x}-{st.st_size}-{st.st_mtime_ns}"
    from ..paths import cache_root

    try:
        cached = cache_root() / f"uv-version-{key}"  # (0700, as the home)
        return cached.read_text().strip() or "uv"
    except OSError:
        pass
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "uv"
    version = out.strip() or "uv"
    with contextlib.suppress(OSError):
        cached = cache_root() / f"uv-version-{key}"
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(version)
        tmp.replace(cached)
    return version


@dataclass(frozen=True, slots=True)
class Sources:
    """Where uv finds packages: ``args`` for its command line (nothing secret there) and ``env``,
    the settings that name URLs (``UV_INDEX_URL``, ``UV_EXTRA_INDEX_URL``, ``UV_FIND_LINKS``), for
    its environment. An index URL may carry ``user:token@``, and every local user can read every
    process's command line (``ps``); only the owner can read its environment."""

    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def environ(self, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """``base`` (default: this process's environment) with these settings and ``extra``."""
        return {**(os.environ if base is None else base), **dict(self.env), **extra}


def _joined(*lists: Iterable[str], sep: str = " ") -> str:
    return sep.join(dict.fromkeys(u for urls in lists for u in urls if u))


def extra_index_env(indexes: Sequence[str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``UV_EXTRA_INDEX_URL`` naming ``indexes`` first, then those ``base`` (default: this
    process's environment) already names: extra indexes for uv by environment, not argv."""
    env = os.environ if base is None else base
    joined = _joined(indexes, env.get("UV_EXTRA_INDEX_URL", "").split())
    return {"UV_EXTRA_INDEX_URL": joined} if joined else {}


def pip_index_env(indexes: Sequence[str]) -> dict[str, str]:
    """pip's settings for a pip this process runs (the wheelhouse): every source uv and pip are
    configured with here, plus ``indexes`` -- what the lock was resolved from, so pip finds every
    wheel of it, uv's settings included (pip reads none of them). uv's default index replaces
    pip's, which becomes an extra one. pip's environment wins over its config files, so the
    configured sources are repeated in it."""
    from . import pkgsources

    where = pkgsources.combined(indexes)
    out = {"PIP_EXTRA_INDEX_URL": " ".join(where.extra), "PIP_FIND_LINKS": " ".join(where.find_links)}
    if where.default:
        out["PIP_INDEX_URL"] = where.default
    return {k: v for k, v in out.items() if v}


def sources(indexes: Sequence[str] = ()) -> Sources:
    """The package sources pip is configured with here (read from its settings: no pip needed),
    plus the pool's own indexes, as uv settings. uv reads its own settings itself (environment,
    uv.toml, pyproject ``[tool.uv]``); a default index there wins over pip's, which is then one
    more extra index."""
    # (imported on first use: a Local pool with nothing to install never reads the settings)
    from . import pkgsources

    uv, pip = pkgsources.uv_settings(), pkgsources.pip_settings()
    out: dict[str, str] = {}
    if pip.default and not uv.default:
        out["UV_INDEX_URL"] = pip.default
    displaced = [pip.default] if pip.default and uv.default and pip.default != uv.default else []
    # The user's own UV_* are kept (extra_index_env repeats them: ours replace theirs).
    out.update(extra_index_env([*indexes, *pip.extra, *displaced]))
    links = _joined(pip.find_links, re.split(r"[,\s]+", os.environ.get("UV_FIND_LINKS", "")), sep=",")
    if links:
        out["UV_FIND_LINKS"] = links
    # Like pip: the best version anywhere.
    return Sources(("--index-strategy", "unsafe-best-match"), tuple(out.items()))


def node_platform(architecture: str | None) -> str:
    """uv's --python-platform for Linux nodes of this architecture (default: this machine's)."""
    import platform

    arch = (architecture or platform.machine()).lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)
    return f"{arch}-manylinux_2_28"


def _compile(requirements: Sequence[str], options: list[str], where: Sources,
             what: str) -> subprocess.CompletedProcess[str]:
    cmd = [uv_binary(), "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate", *options, *where.args]
    try:
        return subprocess.run(cmd, input="\n".join(requirements) + "\n", capture_output=True, text=True,
                              timeout=600, env=where.environ(UV_NO_PROGRESS="1"))
    except subprocess.TimeoutExpired:
        raise ProviderError(f"resolving {what} with uv took more than 600 s; is the package index reachable?") from None


def _target(python: str, platform: str | None) -> list[str]:
    if platform is None:  # this interpreter, this machine
        return ["--python", python] if os.sep in python else ["--python-version", python]
    return ["--python-version", python, "--python-platform", platform]


def resolve(requirements: Sequence[str], *, python: str, platform: str | None = None,
            indexes: Sequence[str] = ()) -> tuple[Package, ...]:
    """Resolve ``requirements`` once, with hashes, for ``python`` (a version such as "3.12", or an
    interpreter's path) on ``platform`` (uv's --python-platform; None: this machine)."""
    found, said = attempt(requirements, python=python, platform=platform, indexes=indexes)
    if found is None:
        code, _, tail = said.partition("\n")
        raise ProviderError(
            f"could not resolve the pool's packages {list(requirements)} for Python {python}"
            f"{f' on {platform}' if platform else ''} ({code}); every pool "
            f"resolves them once on this machine, so its package index must be reachable from here. "
            f"Check the requirement names and versions. uv said:\n{tail}"
        )
    return found


def attempt(requirements: Sequence[str], *, python: str, platform: str | None = None, indexes: Sequence[str] = (),
            constraints: Sequence[Package] = ()) -> tuple[tuple[Package, ...] | None, str]:
    """``resolve``, saying instead of raising: (the packages, "") or (None, "uv exit code N" and,
    on the lines after, the end of what uv said). ``constraints``: versions the resolution must
    keep (a running pool's packages)."""
    if not requirements:
        return (), ""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="skyward-lock-") as folder:
        options = ["--generate-hashes", *_target(python, platform)]
        if constraints:
            path = os.path.join(folder, "constraints.txt")
            with open(path, "w") as f:
                f.write("".join(f"{p.name}=={p.version}\n" for p in constraints))
            options += ["--constraint", path]
        proc = _compile(requirements, options, sources(indexes), "the pool's packages")
    if proc.returncode != 0:
        return None, "\n".join([f"uv exit code {proc.returncode}", *proc.stderr.strip().splitlines()[-15:]])
    return parse(proc.stdout), ""


def unavailable(packages: Sequence[Package], *, python: str, platform: str | None = None,
                indexes: Sequence[str] = ()) -> list[str]:
    """Which of these exact versions the package sources no longer offer (yanked, removed, or
    never there), checked without installing: [] when all can be had."""
    if not packages:
        return []
    reqs = [f"{p.name}=={p.version}" for p in packages]
    proc = _compile(reqs, ["--no-deps", *_target(python, platform)], sources(indexes), "the recorded packages")
    if proc.returncode == 0:
        return []
    named = re.findall(r"no (?:matching )?versions? of ([A-Za-z0-9._-]+)==([^\s,]+?)(?:\s|,|$)", proc.stderr)
    if named:
        return [f"{canonical(n)}=={v.rstrip('.')} is not available from the package index any more "
                f"(yanked or removed)" for n, v in dict.fromkeys(named)]
    return ["the package index could not provide the recorded versions: "
            + " ".join(proc.stderr.strip().splitlines()[-3:])]


# -- what this interpreter already has (Local nodes run it) ------------------------------------
def installed(requirements: Iterable[str]) -> tuple[Package, ...]:
    """The installed distributions these requirements use here, with their dependency closure
    (versions only: the installer recorded no hashes)."""
    requirements = list(requirements)
    if not requirements:
        return ()
    import importlib.metadata as md

    from packaging.requirements import InvalidRequirement, Requirement

    todo: list[tuple[str, frozenset[str]]] = []
    for r in requirements:
        try:
            req = Requirement(r)
        except InvalidRequirement:
            continue
        todo.append((req.name, frozenset(req.extras)))
    seen: dict[str, Package] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (canonical(name), extras) in done:
            continue
        done.add((canonical(name), extras))
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[canonical(name)] = Package(canonical(dist.metadata["Name"] or name), dist.version)
        for text_ in dist.requires or ():
            try:
                dep = Requirement(text_)
            except InvalidRequirement:
                continue
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if dep.marker is None or any(dep.marker.evaluate(e) for e in envs):
                todo.append((dep.name, frozenset(dep.extras)))
    return tuple(sorted(seen.values(), key=lambda p: p.name))


def installed_version(name: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None




def apt_versions(packages: Sequence[str]) -> dict[str, str]:
    """Installed versions of these Debian packages on this machine ({} without dpkg)."""
    names = [p.split("=", 1)[0] for p in packages]
    if not names or shutil.which("dpkg-query") is None:
        return {}
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\n", *names],
                          capture_output=True, text=True)
    return dict(line.split("\t", 1) for line in proc.stdout.splitlines() if "\t" in line)
