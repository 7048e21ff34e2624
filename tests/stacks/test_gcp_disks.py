"""`skyward down --expired` deletes orphaned GCP sky.Disk disks (stacks/gcp_disks.py): the real
code, with real google-auth, against a fake Compute Engine and token endpoint on loopback."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pulumi")
pytest.importorskip("google.auth")

from stackfakes import FakeWorkspace, make_plan

from skyward.named import cli
from skyward.records import audit
from skyward.stacks import keys
from skyward.stacks.cloudpool import CloudPool

PROJECT = "proj-a"
ZONE = "us-east1-b"
TOKEN = "ya29.fake-compute-token"


class FakeCompute(ThreadingHTTPServer):
    """Compute Engine's disks API (aggregated list with a label filter, delete) and an OAuth
    token endpoint, in one server."""

    def __init__(self) -> None:
        self.disks: dict[str, dict[str, Any]] = {}  # name -> the disk resource as the API shows it
        self.accounts: list[dict[str, Any]] = []  # the project's service accounts (IAM API)
        self.requests: list[tuple[str, str]] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add(self, name: str, labels: dict[str, str] | None = None, users: list[str] | None = None) -> None:
        base = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}"
        self.disks[name] = {"kind": "compute#disk", "name": name, "zone": base, "sizeGb": "100",
                            "selfLink": f"{base}/disks/{name}", **({"labels": labels} if labels else {}),
                            **({"users": users} if users else {})}


class _Handler(BaseHTTPRequestHandler):
    server: FakeCompute

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # the token endpoint: a service account's signed JWT for a token
        body = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
        self.server.requests.append(("POST", self.path))
        if self.path == "/token" and body.get("grant_type") == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            return self._send(200, {"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"})
        return self._send(400, {"error": "invalid_grant"})

    def _api(self) -> tuple[str, dict[str, list[str]]] | None:
        self.server.requests.append((self.command, self.path))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, {"error": {"code": 401, "message": "Request had invalid authentication credentials."}})
            return None
        url = urllib.parse.urlsplit(self.path)
        return url.path, urllib.parse.parse_qs(url.query)

    def do_GET(self) -> None:
        asked = self._api()
        if asked is None:
            return
        path, query = asked
        if path == f"/iam/v1/projects/{PROJECT}/serviceAccounts":
            return self._send(200, {"accounts": self.server.accounts} if self.server.accounts else {})
        if path != f"/compute/v1/projects/{PROJECT}/aggregated/disks":
            return self._send(404, {"error": {"code": 404, "message": f"not found: {path}"}})
        wanted = query.get("filter", [""])[0]
        disks = list(self.server.disks.values())
        if wanted.startswith("labels.") and wanted.endswith(":*"):  # `labels.KEY:*`: the label is present
            key = wanted.removeprefix("labels.").removesuffix(":*")
            disks = [d for d in disks if key in (d.get("labels") or {})]
        return self._send(200, {"kind": "compute#diskAggregatedList", "items": {
            f"zones/{ZONE}": {"disks": disks} if disks else {"warning": {"code": "NO_RESULTS_ON_PAGE"}},
            "zones/us-east1-c": {"warning": {"code": "NO_RESULTS_ON_PAGE"}}}})

    def do_DELETE(self) -> None:
        asked = self._api()
        if asked is None:
            return
        path, _ = asked
        name = path.rsplit("/", 1)[-1]
        disk = self.server.disks.get(name)
        if path != f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/disks/{name}" or disk is None:
            return self._send(404, {"error": {"code": 404, "message": f"The resource '{path}' was not found"}})
        if disk.get("users"):  # what Compute Engine answers for a disk in use
            return self._send(400, {"error": {"code": 400, "message": f"The disk resource '{name}' is already "
                                                                      f"being used by '{disk['users'][0]}'"}})
        del self.server.disks[name]
        return self._send(200, {"kind": "compute#operation", "operationType": "delete", "status": "RUNNING"})


@pytest.fixture
def compute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCompute]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    server = FakeCompute()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # Application Default Credentials: a service account key whose token endpoint is the fake.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    creds = tmp_path / "sa.json"
    creds.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "k1", "private_key": pem,
        "client_email": f"sweeper@{PROJECT}.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": f"{server.url}/token"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    monkeypatch.setenv("SKYWARD_COMPUTE_URL", f"{server.url}/compute/v1")
    monkeypatch.setenv("SKYWARD_IAM_URL", f"{server.url}/iam/v1")
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def _gcp_pool(ws: FakeWorkspace, stack: str, pool_id: str) -> CloudPool:
    """An unnamed GCP pool's stack, through the real CloudPool on the fake workspace."""
    plan = dataclasses.replace(make_plan(nodes=0, region="us-east1", zone=ZONE, instance_type="n2-standard-4",
                                         settings={"project": PROJECT, "zones": [ZONE]}),
                               stack=stack, pool=pool_id)
    key_path, _ = keys.client_key(plan.stack)
    return CloudPool(plan, lambda plan: None, pool_id=pool_id, key_path=key_path, spot=True,
                     fallback_to_on_demand=False, connect=ws, track="gcp")


def _labels(plan_pool: str, stack: str, expires: str = "never") -> dict[str, str]:
    return {"skyward-pool": plan_pool, "skyward-stack": stack, "skyward-expires": expires, "skyward-ttl": "600",
            "skyward-version": "0_1_0", "managed-by": "skyward"}


def _pools(ws: FakeWorkspace) -> tuple[CloudPool, CloudPool]:
    gone = _gcp_pool(ws, "pool-aa11bb22", "aa11bb22")
    gone.start(1)
    gone.close()  # destroyed and removed: its history is saved, its stack gone
    live = _gcp_pool(ws, "pool-cc33dd44", "cc33dd44")
    live.start(1)  # this program runs it: its note names a live client
    return gone, live


def test_down_expired_deletes_only_the_orphaned_disk_of_a_pool_that_is_gone(
        compute: FakeCompute, capsys: pytest.CaptureFixture[str]) -> None:
    ws = FakeWorkspace()
    gone, live = _pools(ws)
    assert ("remove", gone.plan.stack) in ws.calls
    instance = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/sky-x-0"
    # What Compute Engine holds: the gone pool's disk that its preempted node never marked
    # auto-delete, a disk of the live pool, a labelled disk still attached, a disk of someone
    # else's pool with no cap, and a disk skyward did not make.
    compute.add("sky-pool-aa11bb22-0-disk-0", _labels("aa11bb22", gone.plan.stack))
    compute.add("sky-pool-cc33dd44-0-disk-0", _labels("cc33dd44", live.plan.stack))
    compute.add("sky-pool-aa11bb22-1-disk-0", _labels("aa11bb22", gone.plan.stack), users=[instance])
    compute.add("sky-other-0-disk-0", _labels("other", "other-ee55ff66"))
    compute.add("postgres-data")
    try:
        assert cli.main(["down", "--expired"]) == 0
        out = capsys.readouterr().out
        assert set(compute.disks) == {"sky-pool-cc33dd44-0-disk-0", "sky-pool-aa11bb22-1-disk-0",
                                      "sky-other-0-disk-0", "postgres-data"}
        assert (f"deleted disk sky-pool-aa11bb22-0-disk-0 (GCP project {PROJECT}, zone {ZONE}): "
                f"an orphaned sky.Disk of pool aa11bb22") in out
        assert out.count("deleted disk") == 1
        # Listed by label, in the project the pools ran in, with the credentials' token.
        (listed,) = [p for m, p in compute.requests if m == "GET" and p.startswith("/compute/")]
        assert listed.startswith(f"/compute/v1/projects/{PROJECT}/aggregated/disks?")
        assert urllib.parse.parse_qs(urllib.parse.urlsplit(listed).query)["filter"] == ["labels.skyward-pool:*"]
        assert ("POST", "/token") in compute.requests
        (entry,) = [e for e in audit.read(audit.POOLS) if e["event"] == "disk deleted"]
        assert entry["disk"] == "sky-pool-aa11bb22-0-disk-0" and entry["stack"] == gone.plan.stack
        assert entry["project"] == PROJECT and entry["zone"] == ZONE

        # The live pool ends too: its disk is an orphan now, the others still are not.
        live.close()
        assert cli.main(["down", "--expired", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert [r["disk"] for r in rows if r["state"] == "orphaned disk"] == ["sky-pool-cc33dd44-0-disk-0"]
        assert set(compute.disks) == {"sky-pool-aa11bb22-1-disk-0", "sky-other-0-disk-0", "postgres-data"}
    finally:
        live.close()


def test_a_disk_past_its_pools_cap_is_deleted_even_when_made_elsewhere(
        compute: FakeCompute, capsys: pytest.CaptureFixture[str]) -> None:
    ws = FakeWorkspace()
    _gone, live = _pools(ws)
    try:
        past = str(int(time.time()) - 3600)
        compute.add("sky-other-0-disk-0", _labels("other", "other-ee55ff66", expires=past))
        compute.add("sky-later-0-disk-0", _labels("later", "later-99887766", expires=str(int(time.time()) + 3600)))
        assert cli.main(["down", "--expired"]) == 0
        assert set(compute.disks) == {"sky-later-0-disk-0"}
        assert "deleted disk sky-other-0-disk-0" in capsys.readouterr().out
    finally:
        live.close()


def test_without_google_auth_down_expired_says_what_to_install_and_the_gcloud_commands(
        compute: FakeCompute, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ws = FakeWorkspace()
    gone, live = _pools(ws)
    compute.add("sky-pool-aa11bb22-0-disk-0", _labels("aa11bb22", gone.plan.stack))
    for name in [m for m in sys.modules if m == "google.auth" or m.startswith("google.auth.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "google.auth", None)  # `import google.auth` raises ImportError
    try:
        assert cli.main(["down", "--expired"]) == 0
        out = capsys.readouterr().out
        assert "google-auth is not installed" in out and "pip install 'skyward[gcp]'" in out
        assert (f"gcloud compute disks list --project {PROJECT} --filter='labels.skyward-pool:* AND -users:*'"
                in out)
        assert "gcloud compute disks delete NAME --zone ZONE" in out
        assert compute.requests == [] and "sky-pool-aa11bb22-0-disk-0" in compute.disks
    finally:
        live.close()


def test_down_expired_lists_the_service_accounts_of_pools_that_are_gone(
        compute: FakeCompute, capsys: pytest.CaptureFixture[str]) -> None:
    # An account created but never recorded survives its stack's destroy.
    ws = FakeWorkspace()
    gone, live = _pools(ws)

    def account(stack: str, n: int, tpu: bool = False) -> dict[str, Any]:
        from skyward.stacks.gcp_common import short_id

        sid = short_id(dataclasses.replace(gone.plan, stack=stack))
        return {"email": f"sky-{sid}-{n}@{PROJECT}.iam.gserviceaccount.com",
                "displayName": f"skyward {stack} {'TPU ' if tpu else ''}node {n}"}

    compute.accounts = [account(gone.plan.stack, 0), account(gone.plan.stack, 1, tpu=True),
                        account(live.plan.stack, 0), account("other-ee55ff66", 0),
                        {"email": f"ci@{PROJECT}.iam.gserviceaccount.com", "displayName": "ci"}]
    try:
        assert cli.main(["down", "--expired"]) == 0
        out = capsys.readouterr().out
        stray = [line for line in out.splitlines() if "gcloud iam service-accounts delete" in line]
        assert len(stray) == 2 and all(gone.plan.stack in line for line in stray), out
        assert compute.accounts[0]["email"] in out and compute.accounts[1]["email"] in out
    finally:
        live.close()
