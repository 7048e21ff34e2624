"""Every pool's record: who opened it, when, from where, what it was asked for, what it got.

A record is written once, when a pool's nodes are ready, as ``SKYWARD_HOME/records/<id>.json``
(0600), and its SHA-256 goes into the audit trail (``audit._pools.jsonl``, hash chained), so a
record that was edited afterwards is refused. The one change it takes later is an amendment
(``amend``: packages ``skyward install`` added to the running pool), whose new hash goes into
the trail the same way. It holds:

* ``who``/``created``/``origin``: user@host, time, the script, its arguments (secret ones
  masked: ``secrets.mask_argv``), the working directory, and the git commit and dirty flag when
  the script runs inside a git repository;
* ``spec``/``worker``: what the pool was asked for, as plain JSON; ``rebuild`` holds the same
  objects pickled (providers, plugins and volumes included) for ``reproduce``;
* ``offer``/``hourly_cost``/``nodes``: what was chosen and its price per node-hour;
* ``lock``: what the nodes installed exactly (skyward.records.pkglock) -- packages with versions and
  hashes, apt versions, the Python version the nodes run, skyward's version, and for clouds
  the image id, instance type, region and zone;
* ``installs``: what ``skyward install`` added to the running pool, when and by whom (its
  packages are in ``lock`` too).

``reproduce`` turns a record back into a spec with all of that pinned and says what cannot be
the same before anything is created; ``diff`` compares two records.

No secret is kept, in the JSON or in the pickle. Image.env values whose name or type says they
are secret (or that hold a URL with credentials) and ``sky.Storage`` keys given as strings are
kept as a fingerprint only (``hmac:`` + 16 hex digits of an HMAC under the key of this
``SKYWARD_HOME``: two pools' keys can be told apart, and without the key no guess can be checked);
package-index URLs lose their credentials (``https://***@host/simple``). The pickle leaves the
env values out, gets each Storage key as a ``FromEnv`` of the variable a reproduction reads it
from, and each index URL without its userinfo; ``reproduction`` asks this environment for all of
them again and says what it could not find. ``shown`` is a record as the CLI and the dashboard
print it (a record written before this masked nothing: shown masked, its pickle withheld).
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bootstrap.digest import sha256
from ..errors import RecordError
from ..observe.secrets import (
    MASK,
    fingerprint,
    fingerprint_matches,
    has_credentials,
    is_fingerprint,
    mask_argv,
    mask_url,
    scrub,
)
from ..paths import skyward_home
from ..version import __version__
from . import audit

if TYPE_CHECKING:
    from ..core.pool import Pool
    from ..spec import Spec, Worker

FORMAT = 1
# The record being reproduced by the pool opened now (its id): the new record names it.
_SOURCE: contextvars.ContextVar[str | None] = contextvars.ContextVar("skyward_reproduces", default=None)


def records_dir() -> Path:
    path = skyward_home() / "records"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def digest(record: dict[str, Any]) -> str:
    """The SHA-256 of a record's canonical JSON: what the trail keeps."""
    return sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# -- where a pool came from ----------------------------------------------------------------------
def origin() -> dict[str, Any]:
    """The script, its arguments, the working directory and the git state around the script."""
    argv = list(sys.argv)
    script = argv[0] if argv else ""
    path = Path(script).resolve() if script and Path(script).is_file() else None
    cwd = os.getcwd()
    return {
        "script": str(path) if path else (script or None),
        "argv": mask_argv(argv[1:]),
        "cwd": cwd,
        "python": sys.executable,
        "git": _git(path.parent if path else Path(cwd)),
    }


def _git(folder: Path) -> dict[str, Any] | None:
    """The repository around ``folder``: its root, commit, branch and whether tracked files
    changed. Where it is a plain repository (a ``.git`` folder, HEAD on a branch that has a
    commit, or detached), the root, commit and branch are read from its files and only ``git
    status`` runs git; no ``.git`` above ``folder`` means no git process at all. (Each git
    process costs a pool's start several ms of the CPU its nodes start on.)"""
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    read = _read_repo(folder)
    if read is None:
        return None
    if read is _ASK_GIT:  # a worktree, a submodule, GIT_DIR, an unborn branch: git knows
        root = git("rev-parse", "--show-toplevel")
        if root is None:
            return None
        commit, branch = git("rev-parse", "HEAD"), git("rev-parse", "--abbrev-ref", "HEAD")
    else:
        root, commit, branch = read
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"root": root, "commit": commit, "branch": branch, "dirty": bool(status) if status is not None else None}


_ASK_GIT = ("", "", "")


def _read_repo(folder: Path) -> tuple[str, str, str] | None:
    """(root, commit, branch) from the files of the repository around ``folder``; None when
    there is none; ``_ASK_GIT`` when it is not a plain one (git is asked instead)."""
    if any(name in os.environ for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_CEILING_DIRECTORIES")):
        return _ASK_GIT
    try:
        here = folder.resolve()
    except OSError:
        return _ASK_GIT
    for root in (here, *here.parents):
        dot = root / ".git"
        if not os.path.lexists(dot):
            continue
        if not dot.is_dir():
            return _ASK_GIT
        try:
            head = (dot / "HEAD").read_text().strip()
        except OSError:
            return _ASK_GIT
        if not head.startswith("ref: "):  # detached: HEAD is the commit
            return (str(root), head, "HEAD") if _is_sha(head) else _ASK_GIT
        ref = head[5:].strip()
        commit = _ref(dot, ref)
        if commit is None or not ref.startswith("refs/heads/"):
            return _ASK_GIT
        return str(root), commit, ref.removeprefix("refs/heads/")
    return None


def _ref(dot: Path, ref: str) -> str | None:
    """The commit ``ref`` names: its loose file, or its line of packed-refs."""
    try:
        value = (dot / ref).read_text().strip()
        return value if _is_sha(value) else None
    except OSError:
        pass
    try:
        packed = (dot / "packed-refs").read_text()
    except OSError:
        return None
    for line in packed.splitlines():
        sha, _, name = line.partition(" ")
        if name == ref and _is_sha(sha):
            return sha
    return None


def _is_sha(value: str) -> bool:
    return len(value) in (40, 64) and all(c in "0123456789abcdef" for c in value)


# -- the spec as plain data ----------------------------------------------------------------------
def _plain(value: Any) -> Any:
    view = getattr(value, "record_view", None)  # a sky.Storage: its keys as fingerprints
    if callable(view) and not isinstance(value, type):
        return view()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"type": type(value).__name__}
        for f in dataclasses.fields(value):
            if not f.init or f.name.startswith("_") or not f.compare:
                continue  # derived or operational (a provider's workspace)
            out[f.name] = _plain(getattr(value, f.name))
        return out
    if isinstance(value, str | int | float | bool | type(None)):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if callable(value):
        return getattr(value, "__qualname__", repr(value))
    return repr(value)


def _secret(name: str, value: str) -> bool:
    from ..observe.secrets import Secret, is_secret_name

    return isinstance(value, Secret) or is_secret_name(name) or has_credentials(value)


def masked(value: str) -> str:
    return fingerprint(value)


def spec_view(spec: Spec, worker: Worker) -> dict[str, Any]:
    """What the pool was asked for, as JSON: secret env values and Storage keys as a
    fingerprint only, index URLs without their credentials, and no registered secret anywhere."""
    image = spec.image
    view = _plain(spec)
    view.pop("type", None)
    view["accelerator"] = None if spec.accelerator is None else str(spec.accelerator)
    view["image"]["env"] = {k: masked(v) if _secret(k, v) else v for k, v in image.env.items()}
    view["image"]["metrics"] = repr(image.metrics)
    view["provider"] = {"kind": getattr(spec.provider, "kind", "?"), **_plain(spec.provider)}
    view["worker"] = _plain(worker)
    scrubbed: dict[str, Any] = scrub(view)  # index URLs; a registered secret in any other field
    return scrubbed


# What a reproduction pins on the spec itself (the lock says the same): a reproduced pool's
# record shows the source's values there, so that `diff SOURCE COPY` shows real differences only.
_PINNED_FIELDS = (("image", "python"), ("image", "apt"), ("region",), ("provider", "ami"), ("provider", "image"),
                  ("provider", "instance_type"), ("provider", "region"), ("provider", "zone"))


def _as_asked(view: dict[str, Any], source: str | None) -> dict[str, Any]:
    if source is None or not exists(source):
        return view
    asked = read(source).get("spec") or {}
    for path in _PINNED_FIELDS:
        here, there = view, asked
        for key in path[:-1]:
            here, there = here.get(key) or {}, there.get(key) or {}
        if path[-1] in there and path[-1] in here:
            here[path[-1]] = there[path[-1]]
    return view


def _rebuild_blob(spec: Spec, worker: Worker) -> str:
    """The spec and worker pickled, without a secret: no secret env value, Storage keys as the
    variables a reproduction reads them from, index URLs without their credentials."""
    import cloudpickle

    return base64.b64encode(cloudpickle.dumps((_without_secrets(spec), worker))).decode()


def _rebuild_groups_blob(specs: dict[str, Spec]) -> str:
    """Each group's spec pickled (a pool of several groups), without a secret, as _rebuild_blob."""
    import cloudpickle

    return base64.b64encode(cloudpickle.dumps({name: _without_secrets(s) for name, s in specs.items()})).decode()


def _without_secrets(spec: Spec) -> Spec:
    image = spec.image
    changes: dict[str, Any] = {}
    env = {k: v for k, v in image.env.items() if not _secret(k, v)}
    if env != dict(image.env):
        changes["env"] = env
    if any(has_credentials(ix.url) for ix in image.pip_indexes):
        changes["pip_indexes"] = tuple(dataclasses.replace(ix, url=_bare_url(ix.url)) if has_credentials(ix.url)
                                       else ix for ix in image.pip_indexes)
    if changes:
        spec = dataclasses.replace(spec, image=dataclasses.replace(image, **changes))
    volumes = tuple(_unkeyed(v) for v in spec.volumes)
    if volumes != tuple(spec.volumes):
        spec = dataclasses.replace(spec, volumes=volumes)
    return spec


def _unkeyed(volume: Any) -> Any:
    storage = getattr(volume, "storage", None)
    if storage is None or not callable(getattr(storage, "unkeyed", None)):
        return volume
    bare = storage.unkeyed()
    return volume if bare is storage else dataclasses.replace(volume, storage=bare)


def _bare_url(url: str) -> str:
    """``url`` without its userinfo: what a reproduction starts from when no credentials are given."""
    return mask_url(url).replace("://***@", "://", 1)


# -- writing -----------------------------------------------------------------------------------
def origin_soon() -> Future[dict[str, Any]]:
    """``origin()`` computed on a thread of its own (its git calls take tens of milliseconds):
    a pool asks for it when it opens and its record takes it once the nodes are ready."""
    future: Future[dict[str, Any]] = Future()

    def run() -> None:
        try:
            future.set_result(origin())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="skyward-origin", daemon=True).start()
    return future


def for_pool(pool: Pool, where: Future[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The record of a pool whose nodes are ready (``where``: its ``origin_soon()``)."""
    spec, cluster = pool.spec, pool.cluster
    provider = spec.provider
    # Scrubbed: the lock names the package indexes, whose URLs may carry credentials.
    lock = scrub(dict(cluster.package_lock or {})) or {"packages": [], "apt": {}, "skyward": __version__}
    head = pool.members.head()
    facts = head.facts if head is not None else {}
    if facts.get("python"):
        lock["python"] = facts["python"]  # what the nodes run, to the patch release
    cloud = getattr(cluster, "cloud_lock", None)
    if callable(cloud):
        lock["cloud"] = cloud()
    keep = getattr(cluster, "keep_lock", None)
    if callable(keep):  # a cloud pool: the same lock in its stack's config
        try:
            keep(lock)
        except Exception as exc:
            import logging

            logging.getLogger("skyward").warning("pool %s: could not put its lock in the stack config: %s",
                                                 pool.id, exc)
    offer = getattr(provider, "offer", None)
    try:
        chosen = _plain(offer(spec)) if callable(offer) else f"{provider.kind}: machines of this provider"
    except Exception as exc:  # the pool runs already: a catalogue that changed must not stop it
        chosen = f"unknown ({exc})"
    cost = provider.hourly_cost(spec)
    who = audit.who()
    scheduler = getattr(cluster, "scheduler_facts", None)  # Slurm: the jobs, their scripts and nodes
    more = {getattr(provider, "kind", "?"): scheduler()} if callable(scheduler) else {}
    groups = getattr(pool, "groups", {})
    if len(groups) > 1:  # a pool of several groups: each group's spec, nodes and offer
        more["head"] = pool.head_group.name
        more["groups"] = {name: {"provider": getattr(g.spec.provider, "kind", "?"),
                                 "spec": spec_view(g.spec, pool.worker), "nodes": g.members.current_nodes(),
                                 "hourly_cost": g.spec.provider.hourly_cost(g.spec)}
                          for name, g in groups.items()}
        more["rebuild_groups"] = _rebuild_groups_blob({name: g.spec for name, g in groups.items()})
    return {
        **more,
        "format": FORMAT,
        "id": pool.id,
        "name": pool.name,
        "label": pool.label,  # a Session's name for a pool it described (not a named pool)
        "provider": getattr(provider, "kind", "?"),
        "created": time.time(),
        "who": who,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "origin": where.result() if where is not None else origin(),
        "spec": _as_asked(spec_view(spec, pool.worker), _SOURCE.get()),
        "nodes": pool.current_nodes(),
        "offer": chosen,
        "hourly_cost": cost,
        "total_hourly_cost": None if cost is None else round(cost * pool.current_nodes(), 4),
        "lock": lock,
        "reproduces": _SOURCE.get(),
        "rebuild": _rebuild_blob(spec, pool.worker),
    }


def _store(record: dict[str, Any]) -> None:
    folder = records_dir()
    fd, tmp = tempfile.mkstemp(prefix=f".{record['id']}.", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        os.replace(tmp, folder / f"{record['id']}.json")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write(record: dict[str, Any]) -> dict[str, Any]:
    """Store a record (atomically, 0600) and put its hash in the trail."""
    _store(record)
    lock = record.get("lock") or {}
    audit.append(audit.POOLS, "recorded", record["id"], pool_name=record.get("name"),
                 provider=record.get("provider"), nodes=record.get("nodes"), offer=_offer_text(record),
                 hourly_cost=record.get("total_hourly_cost"), script=(record.get("origin") or {}).get("script"),
                 commit=((record.get("origin") or {}).get("git") or {}).get("commit"),
                 packages=len(lock.get("packages") or []), reproduces=record.get("reproduces"),
                 record_sha256=digest(record))
    return record


def closed(pool_id: str) -> None:
    audit.append(audit.POOLS, "closed", pool_id)


def amend(pool_id: str, change: Callable[[dict[str, Any]], None], what: str, **details: Any) -> dict[str, Any]:
    """Change the record of a running pool (``change(record)`` in place): only the record the
    trail vouches for is changed, and the changed one's hash goes into the trail as an
    ``amended`` entry saying ``what``, so an edit by hand is still refused. Callers serialize
    amendments of one pool (the named pool's registry lock)."""
    found = verified(pool_id)
    change(found)
    _store(found)
    audit.append(audit.POOLS, "amended", pool_id, what=what, record_sha256=digest(found), **details)
    return found


def _offer_text(record: dict[str, Any]) -> str:
    offer = record.get("offer")
    if isinstance(offer, dict):
        return f"{offer.get('instance_type')} in {offer.get('region')}"
    return str(offer)


# -- reading -----------------------------------------------------------------------------------
def shown(found: dict[str, Any]) -> dict[str, Any]:
    """A record as the CLI and the dashboard show it: every secret masked (``secrets.scrub``).
    Records written by this version hold none; an older one may hold Storage keys, index
    passwords or the script's arguments in clear, and then its rebuild pickle holds them too:
    that is withheld (``reproduce`` still reads the file itself)."""
    plain = {k: v for k, v in found.items() if k != "rebuild"}
    out: dict[str, Any] = scrub(plain)
    if "rebuild" in found:
        out["rebuild"] = found["rebuild"] if out == plain else (
            "withheld: this record was written before skyward masked secrets in records, and this "
            "pickle may hold them")
    if isinstance(out.get("origin"), dict) and isinstance(out["origin"].get("argv"), list):
        out["origin"]["argv"] = mask_argv([str(a) for a in out["origin"]["argv"]])  # not in the pickle
    return out


def read(pool_id: str) -> dict[str, Any]:
    path = records_dir() / f"{pool_id}.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(
            f"no pool with id {pool_id!r} was recorded here; `skyward history` lists the recent pools "
            f"and their ids."
        ) from None
    except ValueError as exc:
        raise RecordError(f"the record of pool {pool_id} ({path}) is not valid JSON ({exc}): it was changed.") from None
    return data


def exists(pool_id: str) -> bool:
    return (records_dir() / f"{pool_id}.json").is_file()


def trail() -> dict[str, dict[str, Any]]:
    """pool id -> {"recorded": trail entry, "closed": time or None}."""
    out: dict[str, dict[str, Any]] = {}
    for e in audit.read(audit.POOLS):
        pool = str(e.get("pool"))
        if e.get("event") == "recorded":
            out[pool] = {"recorded": e, "closed": None}
        elif e.get("event") == "amended" and pool in out:  # the record's hash from now on
            out[pool]["recorded"] = {**out[pool]["recorded"], "record_sha256": e.get("record_sha256")}
        elif e.get("event") == "closed" and pool in out:
            out[pool]["closed"] = e.get("time")
    return out


def recent(limit: int = 20) -> list[dict[str, Any]]:
    """The newest records first."""
    records = []
    for path in sorted(records_dir().glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[: max(limit, 0)]:
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(path.read_text()))
    return sorted(records, key=lambda r: r.get("created", 0), reverse=True)


def verified(pool_id: str) -> dict[str, Any]:
    """The record, checked against the hash the trail kept when it was written."""
    record = read(pool_id)
    entry = trail().get(pool_id, {}).get("recorded")
    if entry is None:
        raise RecordError(
            f"the record of pool {pool_id} is not in the audit trail ({audit.POOLS}.jsonl), so it cannot "
            f"be trusted; it was copied in by hand or the trail was cut. `skyward history --verify` checks the trail."
        )
    if entry.get("record_sha256") != digest(record):
        raise RecordError(
            f"the record of pool {pool_id} was changed after it was written (its hash no longer matches the "
            f"one in the audit trail); refusing to use it. Restore it from a backup, or reproduce another pool."
        )
    return record


def summary(record: dict[str, Any], closed_at: float | None = None) -> dict[str, Any]:
    origin_ = record.get("origin") or {}
    git = origin_.get("git") or {}
    lock = record.get("lock") or {}
    return {
        "id": record.get("id"), "name": record.get("name"), "provider": record.get("provider"),
        "created": record.get("created"), "who": record.get("who"), "nodes": record.get("nodes"),
        "script": origin_.get("script"), "commit": git.get("commit"), "dirty": git.get("dirty"),
        "packages": len(lock.get("packages") or []), "hourly_cost": record.get("total_hourly_cost"),
        "reproduces": record.get("reproduces"), "closed": closed_at,
    }


# -- diff ----------------------------------------------------------------------------------------
def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """What differs between two records: [{"what", "key", "a", "b"}], packages first."""
    out: list[dict[str, Any]] = []
    la, lb = a.get("lock") or {}, b.get("lock") or {}
    pa = {p["name"]: p["version"] for p in la.get("packages") or []}
    pb = {p["name"]: p["version"] for p in lb.get("packages") or []}
    for name in sorted(pa.keys() | pb.keys()):
        if pa.get(name) != pb.get(name):
            what = "added" if name not in pa else "removed" if name not in pb else "changed"
            out.append({"what": f"package {what}", "key": name, "a": pa.get(name), "b": pb.get(name)})
    aa, ab = la.get("apt") or {}, lb.get("apt") or {}
    for name in sorted(aa.keys() | ab.keys()):
        if aa.get(name) != ab.get(name):
            out.append({"what": "apt", "key": name, "a": aa.get(name), "b": ab.get(name)})
    for key in ("python", "skyward", "platform"):
        if la.get(key) != lb.get(key):
            out.append({"what": key, "key": key, "a": la.get(key), "b": lb.get(key)})
    ca, cb = la.get("cloud") or {}, lb.get("cloud") or {}
    for key in sorted(ca.keys() | cb.keys()):
        if ca.get(key) != cb.get(key):
            out.append({"what": "cloud", "key": key, "a": ca.get(key), "b": cb.get(key)})
    ga, gb = a.get("groups") or {}, b.get("groups") or {}
    if not ga and not gb:
        fa, fb = _flat(a.get("spec") or {}), _flat(b.get("spec") or {})
        for key in sorted(fa.keys() | fb.keys()):
            if fa.get(key) != fb.get(key):
                out.append({"what": "spec", "key": key, "a": fa.get(key), "b": fb.get(key)})
    else:  # pools of several groups: group by group (a pool of one spec is its one group, "default")
        ga = ga or {"default": {"spec": a.get("spec") or {}, "nodes": a.get("nodes"), "provider": a.get("provider")}}
        gb = gb or {"default": {"spec": b.get("spec") or {}, "nodes": b.get("nodes"), "provider": b.get("provider")}}
        for group in [*ga, *(g for g in gb if g not in ga)]:
            if group not in ga or group not in gb:
                out.append({"what": "group " + ("added" if group not in ga else "removed"), "key": group,
                            "a": None if group not in ga else ga[group].get("provider"),
                            "b": None if group not in gb else gb[group].get("provider")})
                continue
            fa, fb = _flat(ga[group].get("spec") or {}), _flat(gb[group].get("spec") or {})
            for key in sorted(fa.keys() | fb.keys()):
                if fa.get(key) != fb.get(key):
                    out.append({"what": f"spec of group {group}", "key": key, "a": fa.get(key), "b": fb.get(key)})
        if a.get("head") != b.get("head"):
            out.append({"what": "head group", "key": "head", "a": a.get("head"), "b": b.get("head")})
    for key in ("provider", "offer", "hourly_cost"):
        if a.get(key) != b.get(key):
            out.append({"what": key, "key": key, "a": a.get(key), "b": b.get(key)})
    return out


# -- reproduce -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Reproduction:
    """A record turned back into a pool: the spec with everything pinned, the packages to install
    as they are, and what cannot be the same (said before anything is created)."""

    source: str
    spec: Spec
    worker: Worker
    packages: tuple[Any, ...]
    differences: tuple[str, ...]
    record: dict[str, Any]
    groups: dict[str, Spec] | None = None  # a pool of several groups: each group's spec, pinned
    head: str | None = None

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """Pools opened inside install the recorded packages and record what they reproduce."""
        from .pkglock import pinned

        token = _SOURCE.set(self.source)
        try:
            with pinned(self.packages):
                yield
        finally:
            _SOURCE.reset(token)


def reproduction(pool_id: str, provider: Any = None) -> Reproduction:
    """Pin a record's spec: package versions (the lock), Python, apt versions, the image id,
    instance type and region; ``provider``: use this one instead of the recorded one (same kind;
    e.g. other credentials), with the recorded image, instance type and region put in."""
    import cloudpickle

    from .pkglock import Package

    record = verified(pool_id)
    spec, worker = cloudpickle.loads(base64.b64decode(record["rebuild"]))
    lock = record.get("lock") or {}
    notes: list[str] = []
    recorded_kind = record.get("provider")
    if provider is not None:
        if getattr(provider, "kind", None) != recorded_kind:
            raise RecordError(
                f"pool {pool_id} ran on provider {recorded_kind!r}; reproduce it with a provider of that "
                f"kind (got {getattr(provider, 'kind', provider)!r}), or leave provider= out."
            )
        spec = dataclasses.replace(spec, provider=provider)
    groups = _pinned_groups(record, lock, provider, notes)
    spec = _pin_image(spec, record, lock, notes)
    spec = _ask_secrets(spec, record, notes)
    spec = _pin_cloud(spec, lock.get("cloud") or {}, notes)
    if groups is not None:
        spec = groups[record["head"]]
    if lock.get("skyward") and lock["skyward"] != __version__:
        notes.append(f"skyward is {__version__} here and the pool ran {lock['skyward']}: nodes always run "
                     f"the client's skyward")
    packages = tuple(Package.from_json(p) for p in lock.get("packages") or [])
    notes += _agent_versions(packages, record)
    why = spec.provider.check(spec)
    if why is not None:
        notes.append(f"the recorded machines cannot be had: {why}")
    else:
        cost = spec.provider.hourly_cost(spec)
        was = record.get("hourly_cost")
        if cost is not None and was is not None and abs(float(cost) - float(was)) > 1e-9:
            notes.append(f"the price changed: ${float(was):.4g}/h per node then, ${float(cost):.4g}/h now")
    notes += _unavailable(spec, record, packages)
    return Reproduction(pool_id, spec, worker, packages, tuple(notes), record, groups,
                        record.get("head") if groups is not None else None)


def _pinned_groups(record: dict[str, Any], lock: dict[str, Any], provider: Any,
                   notes: list[str]) -> dict[str, Spec] | None:
    """A pool of several groups: each group's spec with its image and secrets pinned as the one
    spec of a pool's are (the cloud pins of the lock, the head group's machines, on the head
    group only). None for a pool of one spec."""
    if not record.get("groups"):
        return None
    import cloudpickle

    if "rebuild_groups" not in record:
        raise RecordError(
            f"pool {record.get('id')} was a pool of several groups, and its record (written before skyward "
            f"kept each group's spec to rebuild) holds only the head group's; start it again from a "
            f"skyward.toml with [pools.NAME.groups.GROUP] tables, as `skyward history {record.get('id')}` shows."
        )
    if provider is not None:
        raise RecordError(
            f"pool {record.get('id')} was a pool of several groups: provider= cannot replace each group's "
            f"provider; leave it out."
        )
    specs: dict[str, Spec] = cloudpickle.loads(base64.b64decode(record["rebuild_groups"]))
    out = {}
    for name, spec in specs.items():
        kept = record["groups"].get(name) or {}
        view = {**record, "spec": kept.get("spec") or {}, "provider": kept.get("provider")}
        spec = _pin_image(spec, view, lock, notes)
        spec = _ask_secrets(spec, view, notes)
        if name == record.get("head"):
            spec = _pin_cloud(spec, lock.get("cloud") or {}, notes)
        out[name] = spec
    return out


def _pin_image(spec: Spec, record: dict[str, Any], lock: dict[str, Any], notes: list[str]) -> Spec:
    image = spec.image
    changes: dict[str, Any] = {}
    python = str(lock.get("python") or "")
    minor = ".".join(python.split(".")[:2])
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if minor and image.python == "auto" and record.get("provider") != "local" and minor != here:
        changes["python"] = minor  # "auto" would be this client's Python now
    if record.get("provider") == "local" and python:
        import platform

        if platform.python_version() != python:
            notes.append(f"Local nodes run this interpreter, Python {platform.python_version()}; the pool ran {python}")
    apt = lock.get("apt") or {}
    if apt and record.get("provider") != "local":
        changes["apt"] = tuple(f"{p.split('=', 1)[0]}={apt[p.split('=', 1)[0]]}" if p.split("=", 1)[0] in apt else p
                               for p in image.apt)
    recorded_env = ((record.get("spec") or {}).get("image") or {}).get("env") or {}
    env = dict(image.env)
    for name, value in recorded_env.items():
        if name in env or not is_fingerprint(str(value)):
            continue
        given = os.environ.get(name)
        if given is None:
            notes.append(f"Image.env {name} was secret and is not recorded; set {name} in this environment "
                         f"to give the nodes the same value")
        else:
            env[name] = given
            if not fingerprint_matches(given, value):
                notes.append(f"Image.env {name} is taken from this environment and differs from the recorded one")
    if env != dict(image.env):
        changes["env"] = env
    return dataclasses.replace(spec, image=dataclasses.replace(image, **changes)) if changes else spec


# Where a reproduction looks for a package index's credentials, which its record did not keep:
# the variables pip and uv read index URLs from (space-separated lists; uv's UV_INDEX as NAME=URL).
INDEX_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX",
                   "UV_INDEX")


def _ask_secrets(spec: Spec, record: dict[str, Any], notes: list[str]) -> Spec:
    """The secrets the record did not keep, asked of this environment again (as the secret env
    values are, by _pin_image): Storage keys from the variables their FromEnv names, index
    credentials from a URL of the same index in pip's and uv's variables. What is missing or
    differs is said; a key still missing fails the mount then, naming its variable."""
    asked = record.get("spec") or {}
    volumes = list(spec.volumes)
    for i, (volume, seen) in enumerate(zip(volumes, asked.get("volumes") or [], strict=False)):
        storage = getattr(volume, "storage", None)
        kept = (seen or {}).get("storage") if isinstance(seen, dict) else None
        if storage is None or not isinstance(kept, dict):
            continue
        given: dict[str, str] = {}
        for field in ("access_key", "secret_key", "session_token"):
            was, ref = kept.get(field), getattr(storage, field, None)
            variable = getattr(ref, "name", None)  # the FromEnv the record's pickle has for it
            if not (isinstance(was, str) and is_fingerprint(was)) or not isinstance(variable, str):
                continue  # not a key given as a string, so nothing was left out
            value = os.environ.get(variable)
            where = f"Volume {getattr(volume, 'bucket', i)!r} (sky.Storage at {storage.endpoint})"
            if not value:
                notes.append(f"{where}: its {field} was secret and is not recorded; set {variable} in this "
                             f"environment to give it again")
                continue
            given[field] = value
            if not fingerprint_matches(value, was):
                notes.append(f"{where}: its {field} is taken from {variable} here and differs from the recorded one")
        if given:
            volumes[i] = dataclasses.replace(volume, storage=dataclasses.replace(storage, **given))
    if volumes != list(spec.volumes):
        spec = dataclasses.replace(spec, volumes=tuple(volumes))
    recorded = [ix.get("url") if isinstance(ix, dict) else None
                for ix in (asked.get("image") or {}).get("pip_indexes") or []]
    indexes = list(spec.image.pip_indexes)
    offered = [u.split("=", 1)[1] if "=" in u.split("://", 1)[0] else u
               for name in INDEX_VARIABLES for u in os.environ.get(name, "").split()]
    for i, (index, was) in enumerate(zip(indexes, recorded, strict=False)):
        if not isinstance(was, str) or f"://{MASK}@" not in was:
            continue
        found = next((u for u in offered if has_credentials(u) and mask_url(u) == was), None)
        if found is None:
            notes.append(f"Image.pip_indexes {was} had credentials, which are not recorded: put the URL with "
                         f"them in PIP_EXTRA_INDEX_URL (or {', '.join(INDEX_VARIABLES[2:4])}) in this environment "
                         f"to give them again; without, the index is used without credentials")
        else:
            indexes[i] = dataclasses.replace(index, url=found)
    if indexes != list(spec.image.pip_indexes):
        spec = dataclasses.replace(spec, image=dataclasses.replace(spec.image, pip_indexes=tuple(indexes)))
    return spec


def _pin_cloud(spec: Spec, cloud: dict[str, Any], notes: list[str]) -> Spec:
    """The recorded image id, instance type, region and zone, on the provider's own settings."""
    provider = spec.provider
    if not cloud or not dataclasses.is_dataclass(provider):
        return spec
    names = {f.name for f in dataclasses.fields(provider)}
    image_field = "ami" if "ami" in names else "image" if "image" in names else None
    pins: dict[str, Any] = {}
    if image_field and cloud.get("image"):
        pins[image_field] = cloud["image"]
    elif image_field:
        notes.append("the image id the pool ran is not recorded: the provider looks up the current one")
    for key in ("instance_type", "region"):  # the zone and subnet are recorded, not pinned
        if key in names and cloud.get(key):
            pins[key] = cloud[key]
    if not pins:
        return spec
    changes: dict[str, Any] = {"provider": dataclasses.replace(provider, **pins)}  # type: ignore[type-var]
    if spec.region is not None and cloud.get("region"):
        changes["region"] = cloud["region"]
    return dataclasses.replace(spec, **changes)


def _agent_versions(packages: tuple[Any, ...], record: dict[str, Any]) -> list[str]:
    """The agent's own dependencies are the client's versions on remote nodes (one pickle format)."""
    if record.get("provider") == "local":
        return []
    from .resolver import installed_version

    notes = []
    for p in packages:
        if p.name in ("cloudpickle", "lz4", "pydantic"):
            here = installed_version(p.name)
            if here is not None and here != p.version:
                notes.append(f"{p.name} is {here} here and the pool ran {p.version}: the agent needs the "
                             f"client's version")
    return notes


def _unavailable(spec: Spec, record: dict[str, Any], packages: tuple[Any, ...]) -> list[str]:
    from .resolver import installed_version, unavailable

    lock = record.get("lock") or {}
    indexes = [ix.url for ix in spec.image.pip_indexes]
    if record.get("provider") == "local":
        needed = [p for p in packages if installed_version(p.name) != p.version]
        return unavailable(needed, python=sys.executable, indexes=indexes)
    wheelhouse = getattr(spec.provider, "install", "wheelhouse") == "wheelhouse"
    python = sys.executable if wheelhouse else str(lock.get("python") or "3")
    python = python if wheelhouse else ".".join(python.split(".")[:2])
    platform = None if wheelhouse else lock.get("platform")
    return unavailable(packages, python=python, platform=platform, indexes=indexes)


def say(rep: Reproduction, strict: bool) -> None:
    """Warn about each difference; with ``strict``, refuse (RecordError) when there is any."""
    import warnings

    if strict and rep.differences:
        raise RecordError(
            f"pool {rep.source} cannot be reproduced exactly (--strict):\n"
            + "\n".join(f"  - {d}" for d in rep.differences)
            + "\nNothing was created. Drop strict to go on with these differences."
        )
    for d in rep.differences:
        warnings.warn(f"reproducing pool {rep.source}: {d}", stacklevel=4)


def config_data(spec: Spec, worker: Worker) -> dict[str, Any]:
    """A named pool's settings (skyward.toml's form, see named.spec_from) describing ``spec``:
    what the registry keeps so that later attaches rebuild the same pool."""
    provider = spec.provider
    kind = getattr(provider, "kind", "local")
    options: dict[str, Any] = {}
    if dataclasses.is_dataclass(provider):
        for f in dataclasses.fields(provider):
            if not f.init or not f.compare or f.name.startswith("_"):
                continue
            value = getattr(provider, f.name)
            if f.default is not dataclasses.MISSING and value == f.default:
                continue
            options[f.name] = _config_value(value)
    image = spec.image
    nodes = spec.node_spec
    data: dict[str, Any] = {
        "provider": kind, kind: options,
        "nodes": {k: v for k, v in (("desired", nodes.desired), ("max", nodes.max), ("min", nodes.min))
                  if v is not None},
        "image": {
            "python": image.python, "pip": list(image.pip), "apt": list(image.apt), "env": dict(image.env),
            "shell_vars": dict(image.shell_vars), "includes": list(image.includes),
            "excludes": list(image.excludes),
            "pip_indexes": [{"url": ix.url, "packages": list(ix.packages)} for ix in image.pip_indexes],
            **({"metrics": False} if image.metrics is None else {}),
        },
        "worker": {f.name: getattr(worker, f.name) for f in dataclasses.fields(worker)},
        "accelerator": None if spec.accelerator is None else str(spec.accelerator),
        "allocation": spec.allocation, "ttl": spec.ttl,
    }
    for key in ("vcpus", "memory_gb", "disk_gb", "architecture", "region", "max_hourly_cost"):
        if getattr(spec, key) is not None:
            data[key] = getattr(spec, key)
    return {k: v for k, v in data.items() if v is not None}


def _config_value(value: Any) -> Any:
    if type(value).__name__ == "SSHHost":
        h: Any = value
        host = f"[{h.address}]" if ":" in h.address else h.address
        return (f"{h.user}@" if h.user else "") + host + (f":{h.port}" if h.port else "")
    if isinstance(value, list | tuple):
        return [_config_value(v) for v in value]
    return value
