"""Orphaned GCP ``sky.Disk`` disks: found by skyward's labels, deleted once their pool is gone.

A node marks its own extra disks auto-delete at boot (userdata), so they go with the instance
however it ends. A node that Compute Engine deletes before that ran (a spot preemption, or the
pool's ``termination_time``, in the first minutes) leaves its disks behind, unattached and
billing; and a stack removed without its resources (``pulumi stack rm --force``, a lost backend)
forgets them. ``skyward down --expired`` runs ``sweep`` after destroying the stacks of expired
pools: it lists the disks labelled ``skyward-pool`` in the projects of this machine's GCP pools
and deletes those

* attached to no instance (``users`` empty: a disk in use is never touched), and
* whose pool is gone: its stack (``skyward-stack`` label) is not live here (no registry record,
  no note of a running program, no stack workspace or file-backend state, no record of a
  program still running), and either it was made on this machine (this machine's records know
  the stack) or its hard cap (``skyward-expires``) has passed, after which Compute Engine has
  deleted every node of the pool. A disk of a pool this machine does not know and with no cap
  passed is left to the machine that made it.

It also lists the pools' service accounts (``sky-<id>-<n>``, one per node, named by their display
name ``skyward <stack> [TPU ]node <n>``) whose stack was made here and is gone: an account created
but never recorded (an update interrupted between the create and its answer) survives the stack's
destroy and counts against the project's 100 accounts. They are listed with the ``gcloud`` command
that deletes them (``Sweep.manual``), not deleted: an account is free, and its name says less than
a disk's labels.

It talks to the Compute Engine REST API (``aggregated/disks`` with a label filter, then
``DELETE`` per disk) with Application Default Credentials through ``google-auth`` (the gcp
extra). Without it, ``sweep`` says what to install and the ``gcloud`` commands that do the same
by hand. ``SKYWARD_COMPUTE_URL`` (or ``base_url``) points it at another server: the tests run it
against a fake Compute Engine on loopback.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyward.bootstrap.procs import alive as _running
from skyward.errors import ProviderError
from skyward.paths import skyward_home

from . import backend
from .engine import workspace_dir
from .notes import folder as notes_folder

log = logging.getLogger("skyward.stacks")

COMPUTE_URL = "https://compute.googleapis.com/compute/v1"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
LABEL = "skyward-pool"  # every resource of a GCP pool carries it (PoolPlan.labels)
FILTER = f"labels.{LABEL}:*"
INSTALL = "pip install 'skyward[gcp]'  (or: pip install google-auth)"


@dataclass(frozen=True, slots=True)
class Known:
    """What this machine knows of its GCP pools: where they ran, and which stacks."""

    projects: dict[str, set[str]] = field(default_factory=dict)  # project -> zones ("" unknown)
    live: set[str] = field(default_factory=set)  # stacks of pools that are, or may be, running
    made_here: set[str] = field(default_factory=set)  # every stack this machine made (live or not)

    def add(self, stack: str | None, project: str | None, zone: str | None, live: bool) -> None:
        if project or stack:  # "": the credentials' own project (a pool made without one given)
            self.projects.setdefault(project or "", set()).add(zone or "")
        if stack:
            self.made_here.add(stack)
            if live:
                self.live.add(stack)


@dataclass(frozen=True, slots=True)
class Disk:
    """A labelled disk as the API lists it."""

    project: str
    zone: str
    name: str
    labels: dict[str, str]
    users: tuple[str, ...]

    @property
    def pool(self) -> str:
        return self.labels.get(LABEL, "")

    @property
    def stack(self) -> str:
        return self.labels.get("skyward-stack", "")

    def describe(self) -> dict[str, Any]:
        return {"project": self.project, "zone": self.zone, "disk": self.name, "pool": self.pool, "stack": self.stack}


@dataclass(frozen=True, slots=True)
class Sweep:
    """What ``sweep`` did: disks deleted, kept (and why), failures, and the hand-made way when
    it could not look (``manual``)."""

    deleted: tuple[Disk, ...] = ()
    kept: tuple[tuple[Disk, str], ...] = ()
    failed: tuple[str, ...] = ()
    manual: str | None = None
    accounts: tuple[tuple[str, str, str], ...] = ()  # (project, email, stack) of stray service accounts


# A pool's node accounts (stacks/gcp.py, gcp_tpu.py): the id, and the display name with the stack.
ACCOUNT_EMAIL = re.compile(r"^sky-[0-9a-f]{10}-\d+@")
ACCOUNT_NAME = re.compile(r"^skyward (\S+) (?:TPU )?node \d+$")
IAM_URL = "https://iam.googleapis.com/v1"


def iam_url() -> str:
    return (os.environ.get("SKYWARD_IAM_URL") or IAM_URL).rstrip("/")


# -- what this machine knows ---------------------------------------------------------------------
def _json(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _plan_place(plan: dict[str, Any]) -> tuple[str | None, str | None]:
    settings = plan.get("settings") or {}
    zone = plan.get("zone") or (settings.get("pinned") or {}).get("zone")
    return settings.get("project"), zone


def _is_gcp_plan(plan: dict[str, Any]) -> bool:
    return "project" in (plan.get("settings") or {})  # only GCP plans carry a project


def _config_plan(config: Any) -> dict[str, Any]:
    """The pool's plan in a stack's config (``skyward:plan``, a JSON string)."""
    try:
        plan = json.loads((config or {}).get(f"{backend.PROJECT}:plan") or "{}")
    except (ValueError, AttributeError, TypeError):
        return {}
    return plan if isinstance(plan, dict) else {}


def _stack_config_plan(stack: str) -> dict[str, Any]:
    """The plan in a stack's settings file (``Pulumi.<stack>.yaml``)."""
    path = workspace_dir(stack) / f"Pulumi.{stack}.yaml"
    try:
        import yaml

        return _config_plan((yaml.safe_load(path.read_text()) or {}).get("config"))
    except (ImportError, OSError, ValueError, AttributeError):
        return {}


def _backend_stacks() -> set[str]:
    """Stacks that exist on a file backend (a bucket or Pulumi Cloud backend is not listed:
    the stacks' workspaces stand for them)."""
    state = backend.local_state_dir()
    if state is None:
        return set()
    stacks = set()
    for folder in (state / ".pulumi" / "stacks" / backend.PROJECT, state / ".pulumi" / "stacks"):
        for suffix in (".json", ".json.gz"):  # not the .bak copies, which outlive the stack
            stacks |= {p.name.removesuffix(suffix) for p in folder.glob(f"*{suffix}") if p.is_file()}
    return stacks


def known() -> Known:
    """The GCP pools of this machine: named pools (registry), unnamed ones (notes), every
    pool's record, the stacks' settings files and saved histories."""
    from skyward.named import registry
    from skyward.records import record as records

    found = Known()
    here = socket.gethostname()
    for name in registry.names():  # after cleanup_expired: each one is running (or could not be removed)
        rec = registry.read(name) or {}
        stack = (rec.get("cluster") or {}).get("stack") or {}
        plan = stack.get("plan") or {}
        if rec.get("provider") == "gcp" or _is_gcp_plan(plan):
            found.add(stack.get("name"), *_plan_place(plan), live=True)
            found.add(None, ((rec.get("config") or {}).get("gcp") or {}).get("project"), None, live=True)
    for path in sorted(notes_folder().glob("*.json")):  # left: running programs, or stacks not destroyed
        note = _json(path)
        plan = (note.get("description") or {}).get("plan") or {}
        if note.get("kind") == "gcp":
            found.add(str(note.get("stack") or path.stem), *_plan_place(plan), live=True)
    closed = {pool for pool, seen in records.trail().items() if seen.get("closed")}
    for path in sorted(records.records_dir().glob("*.json")):
        rec = _json(path)
        if rec.get("provider") != "gcp":
            continue
        cloud = (rec.get("lock") or {}).get("cloud") or {}
        asked = ((rec.get("spec") or {}).get("provider") or {})
        running = rec.get("id") not in closed and (rec.get("host") != here or _running(int(rec.get("pid") or 0)))
        found.add(cloud.get("stack"), cloud.get("project") or asked.get("project"), cloud.get("zone"), live=running)
    workspaces = skyward_home() / "workspaces"
    for folder in sorted(workspaces.glob("*")) if workspaces.is_dir() else []:
        plan = _stack_config_plan(folder.name)
        if _is_gcp_plan(plan):  # a stack not removed yet: live for this purpose
            found.add(folder.name, *_plan_place(plan), live=True)
    found.live.update(_backend_stacks())  # a stack that exists destroys its own disks
    for path in sorted((skyward_home() / "audit").glob("*.json")):  # histories of removed stacks
        saved = _json(path)
        if saved.get("stack") != path.stem:
            continue
        plans = [_config_plan(entry.get("config")) for entry in saved.get("history") or [] if isinstance(entry, dict)]
        plan = next((p for p in plans if p), {})
        if _is_gcp_plan(plan):
            found.add(path.stem, *_plan_place(plan), live=False)
    return found


# -- Compute Engine ------------------------------------------------------------------------------
def compute_url() -> str:
    return (os.environ.get("SKYWARD_COMPUTE_URL") or COMPUTE_URL).rstrip("/")


def _transport() -> Any:
    """A ``google.auth.transport.Request`` over urllib: google-auth's own needs ``requests``."""
    from google.auth import exceptions, transport

    class Response(transport.Response):
        def __init__(self, status: int, headers: dict[str, str], data: bytes) -> None:
            self._status, self._headers, self._data = status, headers, data

        @property
        def status(self) -> int:
            return self._status

        @property
        def headers(self) -> dict[str, str]:
            return self._headers

        @property
        def data(self) -> bytes:
            return self._data

    class Request(transport.Request):
        def __call__(self, url: str, method: str = "GET", body: bytes | None = None,
                     headers: dict[str, str] | None = None, timeout: float | None = None, **_: Any) -> Response:
            req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
            try:
                with urllib.request.urlopen(req, timeout=timeout or 60) as r:
                    return Response(r.status, dict(r.headers), r.read())
            except urllib.error.HTTPError as e:
                return Response(e.code, dict(e.headers), e.read())
            except OSError as e:
                raise exceptions.TransportError(e) from e

    return Request()


class Compute:
    """The few Compute Engine calls the sweep makes, with an ADC token."""

    def __init__(self, base_url: str | None = None) -> None:
        import google.auth
        from google.auth import exceptions

        self.base = (base_url or compute_url()).rstrip("/")
        self._request = _transport()
        try:
            self.credentials, self.project = google.auth.default(scopes=[SCOPE])
        except exceptions.DefaultCredentialsError as exc:
            raise ProviderError(
                f"no Google credentials to list orphaned disks with ({exc}). Run `gcloud auth "
                f"application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service "
                f"account key file, then `skyward down --expired` again."
            ) from None

    def _call(self, method: str, path: str, query: dict[str, str] | None = None) -> dict[str, Any]:
        from google.auth import exceptions

        try:
            if not self.credentials.valid:
                self.credentials.refresh(self._request)
        except exceptions.GoogleAuthError as exc:
            raise ProviderError(f"Google credentials could not be refreshed: {exc}") from None
        url = (path if "://" in path else f"{self.base}/{path}") + (f"?{urllib.parse.urlencode(query)}" if query else "")
        req = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {self.credentials.token}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            raise ProviderError(f"Compute Engine refused {method} {path}: HTTP {e.code}: {detail}") from None
        except OSError as e:
            raise ProviderError(f"Compute Engine could not be reached at {self.base}: {e}") from None
        return json.loads(body or b"{}")

    def labelled_disks(self, project: str) -> list[Disk]:
        """Every disk of ``project`` that carries skyward's pool label, in every zone."""
        out: list[Disk] = []
        query = {"filter": FILTER}
        while True:
            page = self._call("GET", f"projects/{project}/aggregated/disks", query)
            for scope in (page.get("items") or {}).values():
                for d in scope.get("disks") or []:
                    labels = dict(d.get("labels") or {})
                    if LABEL not in labels:  # the filter asked for these only; checked again
                        continue
                    zone = str(d.get("zone") or "").rsplit("/", 1)[-1]
                    out.append(Disk(project, zone, str(d["name"]), labels, tuple(d.get("users") or ())))
            token = page.get("nextPageToken")
            if not token:
                return out
            query = {"filter": FILTER, "pageToken": str(token)}

    def service_accounts(self, project: str) -> list[dict[str, Any]]:
        """Every service account of ``project`` (IAM API, paged)."""
        out: list[dict[str, Any]] = []
        query = {"pageSize": "100"}
        while True:
            page = self._call("GET", f"{iam_url()}/projects/{project}/serviceAccounts", query)
            out += list(page.get("accounts") or [])
            token = page.get("nextPageToken")
            if not token:
                return out
            query = {"pageSize": "100", "pageToken": str(token)}

    def delete(self, disk: Disk) -> None:
        self._call("DELETE", f"projects/{disk.project}/zones/{disk.zone}/disks/{disk.name}")


# -- the sweep -----------------------------------------------------------------------------------
def verdict(disk: Disk, where: Known, now: float | None = None) -> str | None:
    """None when ``disk`` is an orphan to delete, else why it stays."""
    now = time.time() if now is None else now
    if disk.users:
        return f"attached to {', '.join(u.rsplit('/', 1)[-1] for u in disk.users)}"
    if disk.stack in where.live:
        return f"pool {disk.pool!r} (stack {disk.stack}) is live"
    expires = disk.labels.get("skyward-expires", "")
    if disk.stack in where.made_here:
        return None  # made here, and its stack, record and program are all gone
    if expires.isdigit() and int(expires) < now:
        return None  # past its hard cap: Compute Engine deleted every node of the pool
    return (f"pool {disk.pool!r} (stack {disk.stack or '?'}) was not made on this machine and its cap has "
            f"not passed; `skyward down --expired` on the machine that made it decides")


def manual(projects: Iterable[str]) -> str:
    """What to run when this machine cannot look itself."""
    names = sorted({p or "PROJECT" for p in projects}) or ["PROJECT"]
    lines = [f"orphaned GCP disks were not looked for: google-auth is not installed. Install it ({INSTALL}) "
             f"and run `skyward down --expired` again, or look by hand:"]
    for project in names:
        lines.append(f"  gcloud compute disks list --project {project} "
                     f"--filter='labels.{LABEL}:* AND -users:*' "
                     f"--format='table(name,zone.basename(),labels.{LABEL},labels.skyward-stack,labels.skyward-expires)'")
    lines.append("  and delete those of pools that are gone: gcloud compute disks delete NAME --zone ZONE --project PROJECT")
    return "\n".join(lines)


def sweep(base_url: str | None = None, where: Known | None = None) -> Sweep:
    """Delete the orphaned skyward disks of this machine's GCP projects (see the module doc)."""
    where = known() if where is None else where
    if not where.projects:
        return Sweep()
    try:
        api = Compute(base_url)
    except ImportError:
        return Sweep(manual=manual(where.projects))
    deleted: list[Disk] = []
    kept: list[tuple[Disk, str]] = []
    failed: list[str] = []
    projects = sorted({p or api.project or "" for p in where.projects} - {""})
    if not projects:
        return Sweep(failed=("GCP pools are known here but no project: set GOOGLE_CLOUD_PROJECT and run "
                             "`skyward down --expired` again",))
    for project in projects:
        try:
            disks = api.labelled_disks(project)
        except ProviderError as exc:
            failed.append(f"project {project}: {exc}")
            continue
        for disk in disks:
            why = verdict(disk, where)
            if why is not None:
                kept.append((disk, why))
                continue
            try:
                api.delete(disk)
            except ProviderError as exc:
                failed.append(f"disk {disk.name} ({project}, {disk.zone}): {exc}")
                continue
            deleted.append(disk)
            _trail(disk)
    strays = _stray_accounts(api, projects, where)
    return Sweep(tuple(deleted), tuple(kept), tuple(failed), manual=_accounts_text(strays), accounts=strays)


def _stray_accounts(api: Compute, projects: list[str], where: Known) -> tuple[tuple[str, str, str], ...]:
    """(project, email, stack) of node accounts whose stack this machine made and is gone."""
    out = []
    for project in projects:
        try:
            accounts = api.service_accounts(project)
        except ProviderError as exc:  # listing is advisory: never fails the down
            log.warning("service accounts of %s not listed: %s", project, exc)
            continue
        for a in accounts:
            email, named = str(a.get("email") or ""), ACCOUNT_NAME.match(str(a.get("displayName") or ""))
            if ACCOUNT_EMAIL.match(email) and named and named.group(1) in where.made_here - where.live:
                out.append((project, email, named.group(1)))
    return tuple(sorted(out))


def _accounts_text(strays: tuple[tuple[str, str, str], ...]) -> str | None:
    if not strays:
        return None
    lines = ["service accounts of GCP pools that are gone (free, but each counts against the project's "
             "100): delete them with"]
    lines += [f"  gcloud iam service-accounts delete {email} --project {project} --quiet   # stack {stack}"
              for project, email, stack in strays]
    return "\n".join(lines)


def _trail(disk: Disk) -> None:
    """The pool's audit trail says which disk went, and why (``skyward history POOL``)."""
    from skyward.records import audit

    name = disk.pool if (skyward_home() / "audit" / f"{disk.pool}.jsonl").exists() else audit.POOLS
    audit.append(name, "disk deleted", disk.pool, stack=disk.stack, project=disk.project, zone=disk.zone,
                 disk=disk.name, reason="orphaned sky.Disk: its pool is gone and no instance uses it")
