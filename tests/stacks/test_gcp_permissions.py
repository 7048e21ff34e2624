"""A GCP pool checks the caller's permissions before its first `up`
(projects.testIamPermissions, buckets.testIamPermissions), with real google-auth, against a fake
Resource Manager, Cloud Storage and token endpoint on loopback."""

from __future__ import annotations

import base64
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.auth")

from skyward.errors import ConfigError
from skyward.stacks import gcp_permissions

PROJECT = "proj-a"
TOKEN = "ya29.fake-token"


OTHER = f"pulumi@{PROJECT}.iam.gserviceaccount.com"  # a second identity, with a token of its own
OTHER_TOKEN = "ya29.other-token"


class FakeIam(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.held: set[str] = set()  # on the project
        self.other_held: set[str] = set()  # what OTHER holds there
        self.on_bucket: dict[str, set[str]] = {}
        self.asked: list[tuple[str, list[str]]] = []
        self.disabled: set[str] = set()  # services answering SERVICE_DISABLED, as Google's APIs do
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeIam

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        if self.path == "/token":  # a JWT bearer grant: the token is the signing key's identity's
            assertion = urllib.parse.parse_qs(raw)["assertion"][0].split(".")[1]
            issuer = json.loads(base64.urlsafe_b64decode(assertion + "=" * (-len(assertion) % 4)))["iss"]
            token = OTHER_TOKEN if issuer == OTHER else TOKEN
            return self._send(200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"})
        if self.headers.get("Authorization") not in (f"Bearer {TOKEN}", f"Bearer {OTHER_TOKEN}"):
            return self._send(401, {"error": {"code": 401}})
        if self.path == f"/v1/projects/{PROJECT}:testIamPermissions":
            if "cloudresourcemanager.googleapis.com" in self.server.disabled:
                return self._send(403, _service_disabled("cloudresourcemanager.googleapis.com", "Cloud Resource Manager API"))
            asked = json.loads(raw)["permissions"]
            self.server.asked.append((PROJECT, asked))
            held = self.server.other_held if self.headers["Authorization"].endswith(OTHER_TOKEN) else self.server.held
            return self._send(200, {"permissions": [p for p in asked if p in held]})
        return self._send(404, {"error": {"code": 404}})

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._send(401, {"error": {"code": 401}})
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.split("/")  # /storage/v1/b/BUCKET/iam/testPermissions
        if url.path.endswith("/iam/testPermissions") and parts[3] == "b":
            asked = urllib.parse.parse_qs(url.query)["permissions"]
            self.server.asked.append((parts[4], asked))
            return self._send(200, {"permissions": [p for p in asked if p in self.server.on_bucket.get(parts[4], set())]})
        return self._send(404, {"error": {"code": 404}})


def _service_disabled(service: str, title: str) -> dict[str, Any]:
    return {"error": {"code": 403, "status": "PERMISSION_DENIED", "message": (
        f"{title} has not been used in project 123 before or it is disabled. Enable it by visiting "
        f"https://console.developers.google.com/apis/api/{service}/overview?project=123 then retry."),
        "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED",
                     "domain": "googleapis.com", "metadata": {"service": service, "consumer": "projects/123"}}]}}


def service_account_key(email: str, token_uri: str) -> str:
    """A service account key's JSON, with a fresh RSA key, whose tokens come from ``token_uri``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return json.dumps({"type": "service_account", "project_id": PROJECT, "private_key_id": "k1", "private_key": pem,
                       "client_email": email, "client_id": "1", "token_uri": token_uri})


@pytest.fixture
def iam(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeIam]:
    server = FakeIam()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    creds = tmp_path / "sa.json"
    creds.write_text(service_account_key(f"me@{PROJECT}.iam.gserviceaccount.com", f"{server.url}/token"))
    for env in (*gcp_permissions.KEY_ENVS, gcp_permissions.ACCESS_TOKEN_ENV, gcp_permissions.IMPERSONATE_ENV):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    monkeypatch.setenv("SKYWARD_RESOURCE_MANAGER_URL", f"{server.url}/v1")
    monkeypatch.setenv("SKYWARD_STORAGE_URL", f"{server.url}/storage/v1")
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_tpu_pool_without_tpu_admin_or_project_iam_admin_is_refused_naming_the_roles(iam: FakeIam) -> None:
    iam.held = set(gcp_permissions.needed(tpu=False))  # everything an instance pool needs, nothing TPU
    with pytest.raises(ConfigError) as info:
        gcp_permissions.check(PROJECT, tpu=True)
    text = str(info.value)
    assert "TPU Admin (roles/tpu.admin): tpu.nodes.create" in text
    assert "Project IAM Admin (roles/resourcemanager.projectIamAdmin)" in text
    assert "resourcemanager.projects.setIamPolicy" in text and "nothing was created" in text
    assert "Compute Admin" not in text


def test_an_instance_pool_with_every_role_passes_and_asks_for_what_it_needs(iam: FakeIam) -> None:
    iam.held = set(gcp_permissions.needed(tpu=False))
    gcp_permissions.check(PROJECT, tpu=False)
    ((where, asked),) = iam.asked
    assert where == PROJECT and "compute.instances.create" in asked and "iam.roles.create" in asked
    assert "iam.serviceAccounts.actAs" in asked and not any(p.startswith("tpu.") for p in asked)


def test_bucket_iam_permissions_are_checked_on_the_bucket(iam: FakeIam) -> None:
    iam.held = set(gcp_permissions.needed(tpu=False))
    iam.on_bucket = {"ok": set(gcp_permissions.BUCKETS), "theirs": {"storage.buckets.get"}}
    with pytest.raises(ConfigError, match=r"storage\.buckets\.setIamPolicy on gs://theirs") as info:
        gcp_permissions.check(PROJECT, tpu=False, buckets=["ok", "theirs"])
    assert "gs://ok" not in str(info.value)


def test_a_check_that_cannot_run_does_not_block_the_pool(iam: FakeIam, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_RESOURCE_MANAGER_URL", "http://127.0.0.1:9/v1")  # nothing listens
    gcp_permissions.check(PROJECT, tpu=True)  # logged, not raised


def test_an_instance_pool_is_checked_for_setting_tags_and_labels(iam: FakeIam) -> None:
    iam.held = set(gcp_permissions.needed(tpu=False)) - {"compute.instances.setTags", "compute.instances.setLabels"}
    with pytest.raises(ConfigError, match=r"Compute Admin \(roles/compute.admin\): compute.instances.setLabels, "
                                          r"compute.instances.setTags"):
        gcp_permissions.check(PROJECT, tpu=False)


def test_a_disabled_api_is_named_with_the_command_that_enables_it(iam: FakeIam, caplog: pytest.LogCaptureFixture) -> None:
    iam.disabled = {"cloudresourcemanager.googleapis.com"}
    # A TPU pool writes its self-delete grant through that API: it cannot go on.
    with pytest.raises(ConfigError, match=r"cloudresourcemanager\.googleapis\.com is disabled.*gcloud services "
                                          r"enable cloudresourcemanager\.googleapis\.com --project proj-a"):
        gcp_permissions.check(PROJECT, tpu=True)
    # An instance pool does not need it: the up goes on, and the log says what to enable.
    with caplog.at_level("WARNING", logger="skyward.stacks"):
        gcp_permissions.check(PROJECT, tpu=False)
    assert "gcloud services enable cloudresourcemanager.googleapis.com --project proj-a" in caplog.text


@pytest.mark.parametrize("as_text", [False, True])
def test_the_identity_checked_is_the_one_pulumi_uses(
        as_text: bool, iam: FakeIam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # Application Default Credentials (me@) hold every role; GOOGLE_CREDENTIALS, which Pulumi's
    # provider reads first, names another account that holds none: that one is asked about.
    iam.held = set(gcp_permissions.needed(tpu=False))
    key = service_account_key(OTHER, f"{iam.url}/token")
    if not as_text:
        (tmp_path / "pulumi.json").write_text(key)
        key = str(tmp_path / "pulumi.json")
    monkeypatch.setenv("GOOGLE_CREDENTIALS", key)
    with pytest.raises(ConfigError) as info:
        gcp_permissions.check(PROJECT, tpu=False)
    text = str(info.value)
    assert f"service account {OTHER} (from GOOGLE_CREDENTIALS)" in text and "compute.instances.create" in text
    iam.other_held = set(gcp_permissions.needed(tpu=False))
    with caplog.at_level("INFO", logger="skyward.stacks"):
        gcp_permissions.check(PROJECT, tpu=False)  # now it holds them
    assert f"checked for service account {OTHER} (from GOOGLE_CREDENTIALS)" in caplog.text


def test_without_pulumi_settings_the_identity_is_application_default_credentials(iam: FakeIam) -> None:
    _, who = gcp_permissions.provider_credentials()
    assert who.startswith(f"service account me@{PROJECT}.iam.gserviceaccount.com (from GOOGLE_APPLICATION_CREDENTIALS=")
    with pytest.raises(ConfigError, match=r"me@proj-a\.iam\.gserviceaccount\.com \(from GOOGLE_APPLICATION_CREDENTIALS"):
        gcp_permissions.check(PROJECT, tpu=False)  # holds nothing


def test_an_unreadable_google_credentials_is_said(iam: FakeIam, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GCLOUD_KEYFILE_JSON", "/nonexistent/key.json")
    with pytest.raises(ConfigError, match=r"GCLOUD_KEYFILE_JSON is set, so Pulumi takes its Google credentials "
                                          r"from it, but it is neither a readable key file"):
        gcp_permissions.check(PROJECT, tpu=False)


def test_an_access_token_and_impersonation_are_named(iam: FakeIam, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", OTHER_TOKEN)
    _, who = gcp_permissions.provider_credentials()
    assert who == "the access token in GOOGLE_OAUTH_ACCESS_TOKEN"
    with pytest.raises(ConfigError, match=r"the access token in GOOGLE_OAUTH_ACCESS_TOKEN, lacks permissions"):
        gcp_permissions.check(PROJECT, tpu=False)  # the token is OTHER's, which holds nothing
    monkeypatch.setenv("GOOGLE_IMPERSONATE_SERVICE_ACCOUNT", "deployer@proj-a.iam.gserviceaccount.com")
    _, who = gcp_permissions.provider_credentials()
    assert who == ("service account deployer@proj-a.iam.gserviceaccount.com (from GOOGLE_IMPERSONATE_SERVICE_ACCOUNT), "
                   "impersonated by the access token in GOOGLE_OAUTH_ACCESS_TOKEN")


def test_the_guide_names_every_role_the_check_asks_for() -> None:
    guide = (Path(__file__).parents[2] / "docs" / "guides" / "clouds.md").read_text()
    roles = {*gcp_permissions.needed(tpu=False).values(), *gcp_permissions.needed(tpu=True).values(),
             *gcp_permissions.BUCKETS.values()}
    for role in roles:
        assert role.split(" (")[1].split(")")[0] in guide, role


# Compute Engine answers an insert naming a just-made service account it cannot see yet with "The
# user does not have access to service account ...": a race where the check above saw actAs held
# (the pool updates again), a missing role where it did not (the error reaches the user).
NO_ACCESS = ("error: 1 error occurred:\n  * Error creating instance: googleapi: Error 400: The user does not have "
             "access to service account 'sky-783090604b-0@proj-a.iam.gserviceaccount.com'.  User: "
             "'me@proj-a.iam.gserviceaccount.com'.  Ask a project owner to grant you the iam.serviceAccountUser "
             "role on the service account, badRequest")


@pytest.mark.parametrize("checked", [True, False])
def test_no_access_to_a_new_service_account_is_retried_when_the_check_saw_act_as(
        checked: bool, iam: FakeIam, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pulumi")
    from stackfakes import FakeWorkspace, command_error, isolated_home, make_plan

    from skyward.errors import StackError
    from skyward.stacks import cloudpool, keys

    isolated_home(tmp_path, monkeypatch)
    monkeypatch.setattr(cloudpool, "_IAM_RETRY_SECONDS", (0.0, 0.0, 0.0))
    monkeypatch.setattr(gcp_permissions, "_held", {})
    project = PROJECT if checked else "proj-unchecked"
    iam.held = set(gcp_permissions.needed(tpu=False))
    gcp_permissions.check(PROJECT, tpu=False)
    assert gcp_permissions.confirmed(PROJECT, "iam.serviceAccounts.actAs")
    ws = FakeWorkspace(fail={"update": [command_error(NO_ACCESS)]})
    plan = make_plan(nodes=0, zone="us-central1-a", region="us-central1", settings={"project": project})
    key_path, _ = keys.client_key(plan.stack)
    pool = cloudpool.CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=False,
                               fallback_to_on_demand=False, record={"skyward": "0.1.0"}, connect=ws)
    if checked:
        assert len(pool.start(1)) == 1
        assert [k for k, _ in ws.calls].count("update") == 2
    else:
        with pytest.raises(StackError, match="does not have access to service account"):
            pool.start(1)
        assert [k for k, _ in ws.calls].count("update") == 1
