"""What a GCP pool's `up` needs of the caller's identity, checked before anything is created.

Without this, a missing role shows as a PERMISSION_DENIED in the middle of the first ``up``,
after the firewalls and service accounts exist. Before a real pool's first ``up``,
``sky.GCP`` asks Resource Manager which of the permissions the pool's resources need the caller
holds on the project (``projects.testIamPermissions``, which counts roles inherited from folders
and the organization) and, for buckets granted to the nodes, Cloud Storage which it holds on each
bucket (``buckets.testIamPermissions``: a role granted on the bucket alone is enough). What is
missing ends the pool before anything exists, with the predefined roles that grant it. The
identity asked about is the one Pulumi's Google provider will use (``provider_credentials``):
``GOOGLE_OAUTH_ACCESS_TOKEN``, else a key in ``GOOGLE_CREDENTIALS`` (or its two older names),
else Application Default Credentials, impersonating ``GOOGLE_IMPERSONATE_SERVICE_ACCOUNT`` when
set; the error and the log name it and where it came from.

The check never blocks a pool it could not run: without google-auth, credentials or the network,
it logs why and the ``up`` goes on (and fails where it would have). An API the check calls that is
disabled in the project is named, with the command that enables it: an error where the pool needs
that API too (Resource Manager for a TPU pool's project grant, Cloud Storage for granted buckets),
else a warning that the permissions went unchecked.
``SKYWARD_RESOURCE_MANAGER_URL`` and ``SKYWARD_STORAGE_URL`` point it at other servers (tests).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from skyward.errors import ConfigError

log = logging.getLogger("skyward.stacks")

RESOURCE_MANAGER_URL = "https://cloudresourcemanager.googleapis.com/v1"
STORAGE_URL = "https://storage.googleapis.com/storage/v1"

# Predefined roles, as the clouds guide's permissions table names them.
COMPUTE_ADMIN = "Compute Admin (roles/compute.admin)"
SA_ADMIN = "Service Account Admin (roles/iam.serviceAccountAdmin)"
SA_USER = "Service Account User (roles/iam.serviceAccountUser)"
ROLE_ADMIN = "Role Administrator (roles/iam.roleAdmin)"
TPU_ADMIN = "TPU Admin (roles/tpu.admin)"
PROJECT_IAM_ADMIN = "Project IAM Admin (roles/resourcemanager.projectIamAdmin)"
STORAGE_ADMIN = "Storage Admin (roles/storage.admin), on the bucket or the project"

# permission -> the predefined role that grants it, per feature of a pool.
EVERY_POOL = {
    "compute.firewalls.create": COMPUTE_ADMIN, "compute.firewalls.delete": COMPUTE_ADMIN,
    "compute.networks.updatePolicy": COMPUTE_ADMIN,
    "iam.serviceAccounts.create": SA_ADMIN, "iam.serviceAccounts.delete": SA_ADMIN,
    "iam.serviceAccounts.actAs": SA_USER,
    "iam.roles.create": ROLE_ADMIN, "iam.roles.delete": ROLE_ADMIN,
}
INSTANCES = {
    "compute.instances.create": COMPUTE_ADMIN, "compute.instances.delete": COMPUTE_ADMIN,
    "compute.instances.setMetadata": COMPUTE_ADMIN, "compute.instances.setServiceAccount": COMPUTE_ADMIN,
    # An insert with network tags and labels is checked for these as well.
    "compute.instances.setTags": COMPUTE_ADMIN, "compute.instances.setLabels": COMPUTE_ADMIN,
    "compute.instances.setIamPolicy": COMPUTE_ADMIN, "compute.disks.create": COMPUTE_ADMIN,
    "compute.disks.setIamPolicy": COMPUTE_ADMIN, "compute.subnetworks.use": COMPUTE_ADMIN,
    "compute.subnetworks.useExternalIp": COMPUTE_ADMIN,
}
TPU_VMS = {
    "tpu.nodes.create": TPU_ADMIN, "tpu.nodes.delete": TPU_ADMIN, "tpu.nodes.get": TPU_ADMIN,
    # The TPU self-delete is a project-level grant (stacks/gcp_tpu.py): the project's policy is written.
    "resourcemanager.projects.getIamPolicy": PROJECT_IAM_ADMIN,
    "resourcemanager.projects.setIamPolicy": PROJECT_IAM_ADMIN,
}
BUCKETS = {"storage.buckets.get": STORAGE_ADMIN, "storage.buckets.getIamPolicy": STORAGE_ADMIN,
           "storage.buckets.setIamPolicy": STORAGE_ADMIN}


# What the check found held, per project, in this process: a later error that contradicts it
# (Compute Engine not seeing a just-made service account) is a race, not a missing role.
_held: dict[str, frozenset[str]] = {}


def confirmed(project: str, permission: str) -> bool:
    """Whether this process's check saw ``permission`` held on ``project``."""
    return permission in _held.get(project, frozenset())


def needed(*, tpu: bool) -> dict[str, str]:
    """{permission: role} on the project for a pool of instances, or of TPU VMs."""
    return {**EVERY_POOL, **(TPU_VMS if tpu else INSTANCES)}


def _url(env: str, default: str) -> str:
    return (os.environ.get(env) or default).rstrip("/")


# Where Pulumi's Google provider takes its credentials from, before Application Default
# Credentials: an access token, else a key (a file's path or the JSON itself) in the first of these
# set; then it may impersonate a service account with them.
ACCESS_TOKEN_ENV = "GOOGLE_OAUTH_ACCESS_TOKEN"
KEY_ENVS = ("GOOGLE_CREDENTIALS", "GOOGLE_CLOUD_KEYFILE_JSON", "GCLOUD_KEYFILE_JSON")
IMPERSONATE_ENV = "GOOGLE_IMPERSONATE_SERVICE_ACCOUNT"


def _who(credentials: Any, info: dict[str, Any] | None = None) -> str:
    email = getattr(credentials, "service_account_email", None)
    if email and email != "default":
        return f"service account {email}"
    kind = (info or {}).get("type")
    if kind == "authorized_user" or hasattr(credentials, "refresh_token"):
        account = getattr(credentials, "account", "") or ""
        return f"user {account}" if account else "a user's credentials"
    if kind == "external_account":
        return "a workload identity federation credential"
    if type(credentials).__module__.startswith("google.auth.compute_engine"):
        return "this VM's service account (the metadata server)"
    return f"{type(credentials).__module__}.{type(credentials).__name__} credentials"


def _from_info(info: dict[str, Any], scope: str) -> Any:
    """Credentials from a key's JSON that the user set in the environment (their own settings)."""
    kind = info.get("type")
    if kind == "service_account":
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info(info, scopes=[scope])
    if kind == "authorized_user":
        from google.oauth2 import credentials as oauth2

        return oauth2.Credentials.from_authorized_user_info(info, scopes=[scope])
    import warnings

    import google.auth

    with warnings.catch_warnings():  # its warning is about keys from elsewhere; this one is the user's
        warnings.simplefilter("ignore", DeprecationWarning)
        credentials, _ = google.auth.load_credentials_from_dict(info, scopes=[scope])
    return credentials


def provider_credentials() -> tuple[Any, str]:
    """The credentials Pulumi's Google provider will use for the pool's ``up``, and who they are
    in words (which identity, from which setting): the preflight asks about that identity, not
    about gcloud's or Application Default Credentials' when the environment names another."""
    import google.auth

    from .gcp_disks import SCOPE

    token = os.environ.get(ACCESS_TOKEN_ENV, "").strip()
    key_env = next((env for env in KEY_ENVS if os.environ.get(env, "").strip()), None)
    credentials: Any
    if token:
        from google.oauth2 import credentials as oauth2

        credentials, who = oauth2.Credentials(token), f"the access token in {ACCESS_TOKEN_ENV}"
    elif key_env is not None:
        value = os.environ[key_env].strip()
        try:
            info = json.loads(value if value.startswith("{") else Path(value).expanduser().read_text())
            credentials = _from_info(info, SCOPE)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"sky.GCP: {key_env} is set, so Pulumi takes its Google credentials from it, but it is "
                f"neither a readable key file nor a key's JSON ({type(exc).__name__}: {exc}). Point it at "
                f"a service account key, or unset it to use Application Default Credentials."
            ) from None
        who = f"{_who(credentials, info)} (from {key_env})"
    else:
        credentials, _ = google.auth.default(scopes=[SCOPE])
        path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        where = f"GOOGLE_APPLICATION_CREDENTIALS={path}" if path else "Application Default Credentials"
        info = None
        if path:
            try:
                info = json.loads(Path(path).expanduser().read_text())
            except (OSError, ValueError):
                info = None
        who = f"{_who(credentials, info)} (from {where})"
    target = os.environ.get(IMPERSONATE_ENV, "").strip()
    if target:
        from google.auth import impersonated_credentials

        credentials = impersonated_credentials.Credentials(
            source_credentials=credentials, target_principal=target, target_scopes=[SCOPE])
        who = f"service account {target} (from {IMPERSONATE_ENV}), impersonated by {who}"
    return credentials, who


class _Api:
    """Two testIamPermissions calls with the credentials Pulumi's provider uses (provider_credentials)."""

    def __init__(self) -> None:
        from .gcp_disks import _transport

        self._request = _transport()
        self.credentials, self.who = provider_credentials()

    def call(self, method: str, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        if not self.credentials.valid:
            self.credentials.refresh(self._request)
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self.credentials.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return dict(json.loads(r.read() or b"{}"))

    def project(self, project: str, permissions: list[str]) -> set[str]:
        base = _url("SKYWARD_RESOURCE_MANAGER_URL", RESOURCE_MANAGER_URL)
        got = self.call("POST", f"{base}/projects/{urllib.parse.quote(project)}:testIamPermissions",
                        {"permissions": permissions})
        return set(got.get("permissions") or ())

    def bucket(self, bucket: str, permissions: list[str]) -> set[str]:
        base = _url("SKYWARD_STORAGE_URL", STORAGE_URL)
        query = urllib.parse.urlencode([("permissions", p) for p in permissions])
        got = self.call("GET", f"{base}/b/{urllib.parse.quote(bucket, safe='')}/iam/testPermissions?{query}")
        return set(got.get("permissions") or ())


def disabled_api(body: str) -> str | None:
    """The service named by a Google API error saying it is disabled in the project (SERVICE_DISABLED)."""
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return None
    for detail in error.get("details") or ():
        if isinstance(detail, dict) and detail.get("reason") == "SERVICE_DISABLED":
            service = (detail.get("metadata") or {}).get("service")
            if service:
                return str(service)
    return None


def _disabled(project: str, service: str, needed_by_pool: bool) -> None:
    enable = f"gcloud services enable {service} --project {project}"
    if needed_by_pool:
        raise ConfigError(
            f"sky.GCP: the API {service} is disabled in project {project!r}, and this pool needs it "
            f"(nothing was created). Enable it: {enable} (or the console's APIs & Services page), "
            f"wait a minute, and start the pool again."
        )
    log.warning("GCP permissions not checked before up: the API %s is disabled in project %r. "
                "Enable it to have them checked: %s", service, project, enable)


def check(project: str, *, tpu: bool, buckets: Iterable[str] = ()) -> None:
    """ConfigError naming each missing permission and the role that grants it; nothing when all
    are held or when the check could not run (logged)."""
    try:
        api = _Api()
    except ConfigError:
        raise
    except Exception as exc:  # no google-auth, no credentials: the up will say it better
        log.info("GCP permissions not checked before up (%s: %s)", type(exc).__name__, exc)
        return
    log.info("GCP permissions checked for %s, the identity Pulumi uses", api.who)
    wanted = needed(tpu=tpu)
    missing: dict[str, list[str]] = {}
    asking = "resource manager"
    try:
        held = api.project(project, sorted(wanted))
        _held[project] = frozenset(held)
        for perm in sorted(set(wanted) - held):
            missing.setdefault(wanted[perm], []).append(perm)
        asking = "storage"
        for bucket in sorted(set(buckets)):
            held = api.bucket(bucket, sorted(BUCKETS))
            for perm in sorted(set(BUCKETS) - held):
                missing.setdefault(BUCKETS[perm], []).append(f"{perm} on gs://{bucket}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        body = exc.read().decode(errors="replace") if isinstance(exc, urllib.error.HTTPError) else ""
        service = disabled_api(body)
        if service:
            # Storage is only asked about for buckets the nodes get; Resource Manager writes a TPU pool's grant.
            _disabled(project, service, needed_by_pool=asking == "storage" or tpu)
        else:
            log.warning("GCP permissions of %s not checked before up: %s", api.who, body[:300] or exc)
        return
    except Exception as exc:  # google.auth refresh errors and the like
        log.warning("GCP permissions of %s not checked before up (%s: %s)", api.who, type(exc).__name__, exc)
        return
    if missing:
        lines = "\n".join(f"  {role}: {', '.join(perms)}" for role, perms in sorted(missing.items()))
        raise ConfigError(
            f"sky.GCP: the identity Pulumi creates the pool as, {api.who}, lacks permissions this pool "
            f"needs in project {project!r} (nothing was created). Grant it these roles (or the "
            f"permissions in a custom role):\n{lines}\nSee docs/guides/clouds.md, 'What a real account needs'."
        )
