"""One pool's Pulumi stack, driven through the automation API with an inline program.

``PoolStack`` wraps a ``pulumi.automation`` Stack: project ``skyward``, one stack per pool,
the backend and secrets of ``backend.py``, the pool's description in the stack config. Its
operations (preview, up, refresh, destroy -- which refreshes first --, remove, history,
outputs, export) stream engine events into skyward's events and turn the automation API's
errors into skyward's, with a way out for the two that need a human:

* a locked stack (``StackLockedError``): another update runs, or a killed one left its lock;
  ``unlock(name)`` removes a file backend's stale lock;
* pending operations after an interrupted update (``PendingOperationsError``): resources
  whose creation Pulumi started but never saw finish; ``clear_pending(name)`` drops them from
  the state and refreshes (then check the cloud for strays tagged with the stack's name).

Ctrl-C during an operation asks the Pulumi CLI to stop gracefully (it finishes the resource
operations in flight and saves the state), waits for it, then re-raises KeyboardInterrupt; a
second Ctrl-C stops waiting.

Configuration goes to the stack's settings file (``Pulumi.<stack>.yaml`` in the workspace
folder), through the automation API's own ``stack_settings`` / ``save_stack_settings``: never
on a command line. ``set_all_config`` runs ``pulumi config set-all key=value...``, whose every
value is one argument (visible in ``ps``, and at most 128 KiB on Linux: a pool's plan passes
that near 960 nodes). Only secret values still go through ``set_all_config`` (the CLI encrypts
them), and one too large for an argument is refused before the CLI runs.

Inline programs share process-global state in the pulumi SDK, so one operation runs at a
time per process (``_ENGINE``), and operations block: call them from a plain thread, never
from an event loop.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyward.errors import PendingOperationsError, PulumiNotFoundError, StackError, StackLockedError
from skyward.observe import events as ev
from skyward.paths import skyward_home

from . import backend
from .events import translate

log = logging.getLogger("skyward.stacks")

Program = Callable[[], None]
# (stack name, inline program) -> a pulumi.automation.Stack, or anything with the same methods.
Connect = Callable[[str, Program], Any]

_ENGINE = threading.Lock()
# The largest command-line argument skyward hands the Pulumi CLI (Linux refuses one string over
# 128 KiB, MAX_ARG_STRLEN; half of that leaves room for the rest of the command line).
MAX_ARGUMENT = 64 * 1024


def workspace_dir(name: str) -> Path:
    """Where the stack's Pulumi.yaml / Pulumi.<stack>.yaml live (its settings and salt)."""
    return skyward_home() / "workspaces" / name


def audit_file(name: str) -> Path:
    return skyward_home() / "audit" / f"{name}.json"


def local_connect(name: str, program: Program, backend_url: str | None = None) -> Any:
    """The real thing: a LocalWorkspace stack over the pulumi CLI found by stacks.cli
    (``backend_url``: where the stack lives, when not the current PULUMI_BACKEND_URL)."""
    from pulumi import automation as auto

    from .cli import require_cli

    exe = require_cli(f"stack {name}")
    env = backend.prepare(backend_url)
    work_dir = workspace_dir(name)
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        command = auto.PulumiCommand(root=str(command_root(exe)))
    except auto.InvalidVersionError as exc:
        raise PulumiNotFoundError(
            f"the Pulumi CLI at {exe} is too old for the installed pulumi SDK ({exc}). Upgrade it: "
            f"curl -fsSL https://get.pulumi.com | sh"
        ) from exc
    opts = auto.LocalWorkspaceOptions(
        work_dir=str(work_dir),
        env_vars=env,
        secrets_provider="passphrase",
        project_settings=auto.ProjectSettings(
            name=backend.PROJECT, runtime="python", backend=auto.ProjectBackend(url=env["PULUMI_BACKEND_URL"]),
        ),
        pulumi_command=command,
    )
    return auto.create_or_select_stack(stack_name=name, project_name=backend.PROJECT, program=program, opts=opts)


def command_root(exe: Path) -> Path:
    """A folder whose ``bin/pulumi`` is ``exe``: what ``PulumiCommand(root=)`` wants. A CLI
    found outside a ``bin`` folder (e.g. /opt/pulumi/pulumi) gets a link in skyward's home."""
    if exe.parent.name == "bin":
        return exe.parent.parent
    root = skyward_home() / "pulumi-cli"
    link = root / "bin" / "pulumi"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not (link.is_symlink() and os.readlink(link) == str(exe)):
        tmp = link.with_name(f".pulumi-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(exe)
        os.replace(tmp, link)
    return root


@dataclass
class PoolStack:
    """A pool's stack. ``config``/``secrets`` are written to the stack config before each update."""

    name: str
    program: Program
    pool: str = ""  # the pool id its events belong to
    config: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    plugins: Mapping[str, str] = field(default_factory=dict)  # resource plugin -> version
    connect: Connect = local_connect
    _stack: Any = field(default=None, init=False, repr=False)
    _plugins_ready: bool = field(default=False, init=False, repr=False)

    # -- the automation-API stack ----------------------------------------------------------
    @property
    def stack(self) -> Any:
        if self._stack is None:
            self._stack = self._guard("select", lambda: self.connect(self.name, self.program))
        return self._stack

    def _configure(self) -> None:
        if self.config:
            self._write_config(self.config)
        if self.secrets:
            self._set_secrets(self.secrets)
        if not self._plugins_ready:
            for plugin, version in self.plugins.items():
                self._emit(ev.Log(pool=self.pool, level="INFO", message=f"stack: installing the {plugin} plugin v{version}"))
                self.stack.workspace.install_plugin(plugin, f"v{version.lstrip('v')}")
            self._plugins_ready = True

    # -- operations ------------------------------------------------------------------------
    def preview(self) -> dict[str, int]:
        """What ``up`` would change: operation -> number of resources."""
        def run() -> dict[str, int]:
            self._configure()
            result = self.stack.preview(on_event=self._on_event, on_output=_debug, color="never")
            return {getattr(k, "value", str(k)): int(v) for k, v in (result.change_summary or {}).items()}
        return self._run("preview", run)

    def up(self) -> dict[str, Any]:
        """Create or update the stack's resources; returns its outputs as plain values."""
        def run() -> dict[str, Any]:
            self._configure()
            result = self.stack.up(on_event=self._on_event, on_output=_debug, color="never")
            return {k: v.value for k, v in result.outputs.items()}
        return self._run("up", run)

    def refresh(self) -> None:
        """Bring the state in line with the cloud (nodes may have terminated themselves)."""
        self._run("refresh", lambda: self.stack.refresh(on_event=self._on_event, on_output=_debug, color="never"))

    def destroy(self) -> None:
        """Refresh, then delete every resource of the stack (the stack and its history remain)."""
        try:
            self.refresh()
        except StackError as exc:  # destroy may still succeed; it reports its own failure
            self._emit(ev.Log(pool=self.pool, level="WARNING", message=f"stack: refresh before destroy failed: {exc}"))
        self._run("destroy", lambda: self.stack.destroy(on_event=self._on_event, on_output=_debug, color="never"))

    def remove(self) -> None:
        """Delete the (empty) stack. Its history is copied to the audit trail first."""
        self.save_history()
        self._run("remove", lambda: self.stack.workspace.remove_stack(self.name))
        _rmtree(workspace_dir(self.name))

    def set_config(self, values: Mapping[str, str]) -> None:
        """Add these values to the stack config now, without an update (and to every later one)."""
        self.config = {**self.config, **values}
        self._run("config", lambda: self._write_config(values))

    def _write_config(self, values: Mapping[str, str]) -> None:
        """Plain config values into the stack's settings file, by the automation API's
        read-modify-write of ``Pulumi.<stack>.yaml`` (what ``pulumi config set`` edits too):
        its encryption salt and secure values stay as they are."""
        from pulumi import automation as auto

        workspace = self.stack.workspace
        try:
            settings = workspace.stack_settings(self.name)
        except FileNotFoundError:  # a stack the CLI made without writing one yet
            settings = auto.StackSettings()
        config = dict(settings.config or {})
        config.update({f"{backend.PROJECT}:{k}": str(v) for k, v in values.items()})
        settings.config = config
        workspace.save_stack_settings(self.name, settings)

    def _set_secrets(self, values: Mapping[str, str]) -> None:
        """Secret values go through ``pulumi config set-all --secret`` (the CLI encrypts them):
        each is a command-line argument, so one too large for that is refused here."""
        from pulumi import automation as auto

        for key, value in values.items():
            size = len(f"{backend.PROJECT}:{key}={value}".encode())
            if size > MAX_ARGUMENT:
                raise StackError(
                    f"stack {self.name}: secret config value {key!r} is {size:,} bytes; a secret reaches "
                    f"the Pulumi CLI as one command-line argument, at most {MAX_ARGUMENT:,} bytes here. "
                    f"Pass large secrets to the program another way (skyward exports a pool's secrets "
                    f"as a secret stack output), or make this one smaller.",
                    stack=self.name, operation="config",
                )
        self.stack.set_all_config(
            {f"{backend.PROJECT}:{k}": auto.ConfigValue(value=v, secret=True) for k, v in values.items()})

    def history(self) -> list[dict[str, Any]]:
        """Every update of the stack (newest first): kind, result, start/end, changes, config."""
        entries = self._run("history", lambda: self.stack.history(show_secrets=False))
        return [_summary(e) for e in entries]

    def outputs(self) -> dict[str, Any]:
        return {k: v.value for k, v in self._run("outputs", self.stack.outputs).items()}

    def export(self) -> dict[str, Any]:
        """The stack's deployment (its full state) as a dict."""
        deployment = self._run("export", self.stack.export_stack)
        return {"version": deployment.version, "deployment": deployment.deployment}

    def clear_pending(self) -> int:
        """Drop pending operations from the state (after an interrupted update), then refresh."""
        from pulumi.automation import Deployment

        state = self.export()
        body = dict(state["deployment"] or {})
        pending = body.pop("pending_operations", None) or []
        if pending:
            self._run("import", lambda: self.stack.import_stack(Deployment(version=state["version"], deployment=body)))
        self.refresh()
        return len(pending)

    def save_history(self) -> Path:
        path = audit_file(self.name)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            entries = self.history()
        except StackError as exc:
            entries = [{"kind": "history-unavailable", "message": str(exc)}]
        path.write_text(json.dumps({"stack": self.name, "saved": time.time(), "history": entries}, indent=1, default=str))
        return path

    # -- plumbing --------------------------------------------------------------------------
    def _emit(self, event: ev.Event) -> None:
        ev.bus.emit(event)

    def _on_event(self, event: Any) -> None:
        try:
            translated = translate(self.pool, event)
        except Exception:  # an event we do not understand must not break the update
            log.debug("could not translate engine event %r", event, exc_info=True)
            return
        if translated is not None:
            self._emit(translated)

    def _guard(self, operation: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise self._error(operation, exc) from exc

    def _run(self, operation: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` alone in this process, in a helper thread so that Ctrl-C can cancel it."""
        with _ENGINE:
            outcome: dict[str, Any] = {}
            # An Event, not Thread.join: a KeyboardInterrupt inside join() can leave the thread
            # marked as finished while it still runs.
            done = threading.Event()

            def target() -> None:
                try:
                    outcome["value"] = fn()
                except BaseException as exc:
                    outcome["error"] = exc
                finally:
                    done.set()

            worker = threading.Thread(target=target, name=f"skyward-stack-{operation}", daemon=True)
            try:
                worker.start()
                while not done.wait(0.1):
                    pass
            except KeyboardInterrupt:
                if worker.ident is not None:  # it started: let the CLI stop cleanly first
                    self._cancel(operation, done)
                raise
        if "error" in outcome:
            raise self._error(operation, outcome["error"]) from outcome["error"]
        return outcome.get("value")

    def _cancel(self, operation: str, done: threading.Event) -> None:
        self._emit(ev.Log(
            pool=self.pool, level="WARNING",
            message=f"stack {self.name}: Ctrl-C: stopping `{operation}` once the resource operations in "
                    f"flight finish (Ctrl-C again to stop waiting)",
        ))
        _interrupt_cli()
        try:
            while not done.wait(0.1):
                pass
        except KeyboardInterrupt:
            self._emit(ev.Error(pool=self.pool, message=(
                f"stack {self.name}: stopped waiting for {operation}; the stack may be locked or have "
                f"pending operations. {_way_out(self.name)}"
            )))

    def _error(self, operation: str, exc: BaseException) -> BaseException:
        from pulumi import automation as auto

        if isinstance(exc, StackError | PulumiNotFoundError) or not isinstance(exc, Exception):
            return exc
        text = str(exc)
        if isinstance(exc, auto.ConcurrentUpdateError) or "currently locked" in text:
            return StackLockedError(
                f"stack {self.name}: {operation} cannot start, the stack is locked by another update. "
                f"If another skyward or pulumi process is working on this pool, wait for it to finish. "
                f"If none is (an earlier one was killed), release the lock and retry: "
                f"{_unlock_hint(self.name)}",
                stack=self.name, operation=operation, output=text,
            )
        if "pending operation" in text.lower():
            return PendingOperationsError(
                f"stack {self.name}: an earlier update was interrupted and left pending operations -- "
                f"resources whose creation or deletion Pulumi started but never saw finish, so instances "
                f"may exist that the stack does not record. {_way_out(self.name)}",
                stack=self.name, operation=operation, output=text,
            )
        if isinstance(exc, auto.CommandError):
            return StackError(
                f"stack {self.name}: {operation} failed:\n{_errors_of(text)}\n{known_limit(text)}"
                f"(The CLI's full output is this error's .output.) The stack's state is kept: fix the "
                f"cause and open the pool again, or destroy what was made with "
                f"skyward.stacks.open_stack({self.name!r}).destroy().",
                stack=self.name, operation=operation, output=text,
            )
        return exc


# Limits of the clouds that end an `up` with a raw API error: what it means and what to do.
# Sources: pulumi/pulumi#3130 (getVpc without a default VPC); Google's IAM quotas and limits page
# (300 custom roles per project, deleted ones count until purged after 7 days; 100 service
# accounts per project by default, a quota that can be raised); the compute.requireOsLogin
# organization policy constraint (OS Login docs).
def _gcp_quota(m: re.Match[str]) -> str:
    quota, limit, region = m.group("quota"), m.group("limit"), m.group("region")
    where = f"in region {region}" if region else "for the whole project (all regions)"
    spot = " It is a spot/preemptible quota: with allocation='spot-if-available' the pool goes on-demand instead." \
        if quota.startswith("PREEMPTIBLE_") else ""
    extra = (" GPUS_ALL_REGIONS is 0 on new projects: raise it as well as the region's GPU quota."
             if quota == "GPUS_ALL_REGIONS" else "")
    return (f"The project's quota {quota} is {limit.removesuffix('.0')} {where}, and this pool needs more.{extra}{spot} "
            f"Raise it on the console's Quotas page (IAM & Admin > Quotas, filter {quota}; "
            f"`gcloud compute regions describe REGION` or `gcloud compute project-info describe` shows it), "
            f"or use fewer nodes, a smaller type, or another region.")


def _aws_vcpus(m: re.Match[str]) -> str:
    limit = m.group("limit") or "(not in the message)"
    return (f"The account's vCPU quota for this instance family is {limit} vCPUs in this region, and this pool "
            f"needs more (new accounts start at 0 for GPU families). Raise it in the Service Quotas console "
            f"(Amazon EC2 > 'Running On-Demand <family> instances', or 'All <family> Spot Instance Requests' "
            f"for spot; `aws service-quotas list-service-quotas --service-code ec2`), or use fewer nodes, a "
            f"smaller type, or another region.")


_KNOWN_LIMITS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"Quota '(?P<quota>[A-Z0-9_]+)' exceeded\.?\s+Limit: (?P<limit>[\d.]+)"
                r"(?: in region (?P<region>[a-z0-9-]+)| globally)?", re.I), _gcp_quota),
    (re.compile(r"VcpuLimitExceeded(?:[^\n]*?current vCPU limit of (?P<limit>\d+))?", re.I), _aws_vcpus),
    (re.compile(r"no matching (EC2 )?VPC found|VPCIdNotSpecified|No default VPC", re.I),
     "This AWS account has no default VPC in this region (it was deleted, or the account never had "
     "one), and a pool without subnet= launches into the default VPC. Give the pool a subnet of a VPC "
     "of yours with a route to the internet: sky.AWS(subnet='subnet-...'), or recreate the default "
     "VPC: aws ec2 create-default-vpc."),
    (re.compile(r"no matching (EC2 )?Subnet found", re.I),
     "The default VPC has no default subnet in the pool's zone (it was deleted, or the zone is newer "
     "than the account). Create one with `aws ec2 create-default-subnet --availability-zone ZONE` "
     "(the zone the error names), or give the pool a subnet of yours: sky.AWS(subnet='subnet-...')."),
    (re.compile(r"custom roles?\b.*\b(limit|maximum|quota)|(limit|maximum|number) of custom roles?", re.I),
     "The project reached its limit of 300 custom roles (deleted roles count until they are purged, "
     "7 days after deletion); each GCP pool makes one. Delete unused roles with `gcloud iam roles "
     "list --project P --filter=name:skyward_` / `gcloud iam roles delete`, wait for purged ones, or "
     "use another project."),
    (re.compile(r"(maximum|limit|quota)\W+(number of )?service accounts?|service accounts? quota", re.I),
     "The project reached its service account quota (100 per project by default); a GCP pool makes "
     "one per node. Delete unused ones, request a higher quota (IAM quotas page of the console), or "
     "make the pool smaller."),
    (re.compile(r"requireOsLogin", re.I),
     "An organization policy enforces OS Login (constraints/compute.requireOsLogin), so the pool's "
     "ssh-keys metadata would be ignored and no client could log in. Ask the organization's admin for "
     "an exception for this project (gcloud resource-manager org-policies disable-enforce "
     "compute.requireOsLogin --project P), or use a project outside that policy."),
)


def known_limit(text: str) -> str:
    """What a cloud's known limit in a failure's text means and how to proceed ("" for none)."""
    said = []
    for pattern, hint in _KNOWN_LIMITS:
        m = pattern.search(text)
        if m:
            said.append(hint if isinstance(hint, str) else hint(m))
    return "".join(f"{line}\n" for line in said)


def _debug(line: str) -> None:
    log.debug("pulumi: %s", line)


def _errors_of(text: str, limit: int = 15) -> str:
    """The lines of a CLI failure that say what went wrong (or its tail)."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return "\n".join("    " + ln.strip() for ln in (errors or lines)[-limit:])


def _unlock_hint(name: str) -> str:
    if backend.local_state_dir() is not None:
        return f"skyward.stacks.unlock({name!r}) (removes the lock files of the file backend)."
    return f"`pulumi cancel --stack {name}` (with PULUMI_BACKEND_URL={backend.backend_url()})."


def _way_out(name: str) -> str:
    return (
        f"Way out: skyward.stacks.clear_pending({name!r}) drops the pending operations from the "
        f"state and refreshes it (same as `pulumi refresh --clear-pending-creates --stack {name}`); "
        f"then look in the cloud console for resources tagged skyward-stack={name} that the stack "
        f"does not list, and delete them."
    )


def _summary(entry: Any) -> dict[str, Any]:
    """One update as skyward keeps and shows it: secret config values as ``[secret]``, and the
    plain ones scrubbed -- a stack made before its description masked Storage keys and index
    credentials still holds them in its plain config, repeated by every update."""
    from skyward.observe.secrets import scrub

    return {
        "kind": entry.kind, "result": entry.result, "message": entry.message,
        "start": str(entry.start_time), "end": str(entry.end_time) if entry.end_time else None,
        "version": entry.version, "changes": entry.resource_changes, "config": {
            k: (scrub(v.value) if not getattr(v, "secret", False) else "[secret]")
            for k, v in (entry.config or {}).items()
        },
        "environment": dict(entry.environment or {}),
    }


def _interrupt_cli() -> None:
    """SIGINT the pulumi CLI this process runs, unless the terminal already sent it one.

    A Ctrl-C at a terminal reaches the whole foreground process group, pulumi included, and a
    second SIGINT would make pulumi abandon its operations rather than finish them.
    """
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return
    except OSError:
        pass
    for pid in _children():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip().startswith("pulumi"):
                os.kill(pid, signal.SIGINT)
        except OSError:
            pass


def _children() -> list[int]:
    pids: list[int] = []
    for task in Path("/proc/self/task").glob("*"):
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# -- ways out, usable from a Python prompt -------------------------------------------------------
def open_stack(name: str, connect: Connect = local_connect) -> PoolStack:
    """An existing stack by name (with an empty program: for refresh, destroy, history...)."""
    return PoolStack(name, program=lambda: None, connect=connect)


def unlock(name: str) -> list[Path]:
    """Remove the lock files a killed update left on a file backend (returns what was removed)."""
    state = backend.local_state_dir()
    if state is None:
        raise StackError(
            f"stack {name} is on {backend.backend_url()}, not a file backend: release its lock with "
            f"`pulumi cancel --stack {name}`.", stack=name, operation="unlock",
        )
    removed = []
    for lock in (state / ".pulumi" / "locks").glob(f"**/{name}/*.json"):
        lock.unlink(missing_ok=True)
        removed.append(lock)
    return removed


def clear_pending(name: str, connect: Connect = local_connect) -> int:
    """Drop an interrupted update's pending operations from a stack's state and refresh it."""
    return open_stack(name, connect).clear_pending()
