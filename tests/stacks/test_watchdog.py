"""The cloud nodes' TTL watchdog and self-delete, run for real (bash and python3) with short
TTLs against fakes of what they call: an HTTP server on loopback standing for the GCE metadata
server and the compute API, and ``systemctl``/``shutdown``/``poweroff`` on PATH that record
the power-off instead of doing it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pulumi")  # stackfakes builds its plans with it

from stackfakes import make_plan

from skyward.stacks import userdata
from skyward.stacks.plan import DiskPlan

TOKEN = "ya29.fake-token"


class FakeGoogle(ThreadingHTTPServer):
    """The metadata server and the compute API in one (paths do not overlap)."""

    def __init__(self, refuse_delete: bool = False) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.refuse_delete = refuse_delete
        self.refuse_auto_delete = 0  # how many setDiskAutoDelete calls to refuse (a grant not yet visible)
        self.fail_deletes = 0  # how many DELETE calls to answer 503 (the API failing for a while)
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeGoogle

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        self.server.requests.append((self.command, self.path, dict(self.headers)))
        md = {"/md/instance/service-accounts/default/token": json.dumps({"access_token": TOKEN}),
              "/md/project/project-id": "proj", "/md/instance/zone": "projects/123/zones/us-east1-c",
              "/md/instance/name": "sky-train-0"}
        if self.path.startswith("/md/"):
            ok = self.headers.get("Metadata-Flavor") == "Google"
            body, code = (md.get(self.path, ""), 200) if ok else ("missing Metadata-Flavor", 403)
        elif self.headers.get("Authorization") != f"Bearer {TOKEN}":
            body, code = "no token", 401
        elif "setDiskAutoDelete" in self.path and self.server.refuse_auto_delete > 0:
            self.server.refuse_auto_delete -= 1
            body, code = '{"error": {"code": 403, "message": "Required compute.instances.setDiskAutoDelete"}}', 403
        elif self.command == "DELETE" and self.server.fail_deletes > 0:
            self.server.fail_deletes -= 1
            body, code = '{"error": {"code": 503, "message": "The service is currently unavailable."}}', 503
        elif self.command == "DELETE" and self.server.refuse_delete:
            body, code = '{"error": {"code": 403, "message": "Required compute.instances.delete"}}', 403
        else:
            body, code = '{"kind": "compute#operation"}', 200
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer


@pytest.fixture
def google() -> Iterator[FakeGoogle]:
    server = FakeGoogle()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class Node:
    """A directory standing for a node: the scripts, fake power commands, what they recorded."""

    def __init__(self, root: Path, plan: Any, cloud: str, google: FakeGoogle | None = None) -> None:
        self.root, self.log = root, root / "poweroff.log"
        self.pattern = f"skyward-test-agent-{uuid.uuid4().hex}"
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True)
        for tool in ("systemctl", "shutdown", "poweroff"):
            (bin_dir / tool).write_text(f'#!/bin/bash\necho "{tool} $* $(date +%s)" >> {self.log}\n')
            (bin_dir / tool).chmod(0o755)
        (bin_dir / "logger").write_text("#!/bin/bash\nexit 0\n")
        (bin_dir / "logger").chmod(0o755)
        self.watchdog = root / "skyward-watchdog"
        self.watchdog.write_text(userdata.watchdog_script(plan, cloud))
        self.watchdog.chmod(0o755)
        self.self_delete = root / "skyward-self-delete"
        self.self_delete.write_text(userdata.self_delete_script(plan))
        self.self_delete.chmod(0o755)
        self.env = {
            **os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SKYWARD_WATCHDOG_INTERVAL": "0.3",
            "SKYWARD_AGENT_PATTERN": self.pattern, "SKYWARD_SELF_DELETE": str(self.self_delete),
            "SKYWARD_STATE_DIR": str(root / "state"), "SKYWARD_BACKOFF_FIRST": "1", "SKYWARD_BACKOFF_MAX": "1",
        }
        if google is not None:
            self.env.update(SKYWARD_METADATA_URL=f"{google.url}/md", SKYWARD_COMPUTE_URL=f"{google.url}/compute/v1")
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> float:
        started = time.time()
        self.proc = subprocess.Popen([str(self.watchdog)], env=self.env)
        self.procs.append(self.proc)
        return started

    def agent(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", self.pattern])
        self.procs.append(proc)
        return proc

    def powered_off(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Any]:
    made: list[Node] = []

    def make(plan: Any, cloud: str = "aws", google: FakeGoogle | None = None) -> Node:
        node = Node(tmp_path / f"node{len(made)}", plan, cloud, google)
        made.append(node)
        return node

    try:
        yield make
    finally:
        for node in made:
            node.close()


def test_aws_node_powers_off_after_the_ttl_not_before(nodes: Any) -> None:
    node = nodes(replace(make_plan(ttl=2), grace=0), "aws")
    started = node.start()
    assert node.wait_exit(30) == 0
    (line,) = node.powered_off()
    assert line.startswith("systemctl poweroff")
    assert int(line.split()[-1]) >= int(started) + 2, "powered off before the TTL"


def test_no_power_off_while_an_agent_runs(nodes: Any) -> None:
    node = nodes(replace(make_plan(ttl=2), grace=0), "aws")
    agent = node.agent()
    node.start()
    assert node.wait_exit(5) is None, "the watchdog stopped a node whose agent runs"
    assert node.powered_off() == []
    agent.kill()
    agent.wait()
    stopped = time.time()
    assert node.wait_exit(30) == 0
    (line,) = node.powered_off()
    assert int(line.split()[-1]) >= int(stopped) + 1


def test_the_deadline_stops_a_node_even_with_an_agent_and_no_ttl(nodes: Any) -> None:
    plan = replace(make_plan(ttl=0), expires=int(time.time()) + 2)
    node = nodes(plan, "aws")
    node.agent()
    node.start()
    assert node.wait_exit(30) == 0
    assert node.powered_off()[0].startswith("systemctl poweroff")


def test_gcp_node_deletes_itself_with_its_disks(nodes: Any, google: FakeGoogle) -> None:
    plan = replace(make_plan(ttl=1, disks=(DiskPlan(10, "/a"), DiskPlan(10, "/b"))), grace=0)
    node = nodes(plan, "gcp", google)
    node.start()
    assert node.wait_exit(30) == 0
    assert node.powered_off() == [], "a GCP node that could delete itself powered off (a stopped VM bills disks)"
    calls = [(m, p) for m, p, _ in google.requests if p.startswith("/compute")]
    base = "/compute/v1/projects/proj/zones/us-east1-c/instances/sky-train-0"
    assert calls == [("POST", f"{base}/setDiskAutoDelete?autoDelete=true&deviceName=disk-0"),
                     ("POST", f"{base}/setDiskAutoDelete?autoDelete=true&deviceName=disk-1"),
                     ("DELETE", base)]


def test_gcp_node_powers_off_when_its_delete_is_refused_for_minutes(nodes: Any, google: FakeGoogle) -> None:
    google.refuse_delete = True
    node = nodes(replace(make_plan(ttl=1), grace=0), "gcp", google)
    node.env["SKYWARD_DELETE_WINDOW"] = "3"  # "a few minutes", shortened
    node.start()
    assert node.wait_exit(30) == 0
    deletes = [m for m, p, _ in google.requests if p.startswith("/compute")]
    assert set(deletes) == {"DELETE"} and len(deletes) >= 2, "the refused delete was not retried"
    assert node.powered_off()[0].startswith("systemctl poweroff")


def test_gcp_node_retries_its_delete_until_the_api_takes_it(nodes: Any, google: FakeGoogle) -> None:
    google.fail_deletes = 3
    plan = replace(make_plan(ttl=1, disks=(DiskPlan(10, "/a"),)), grace=0)
    node = nodes(plan, "gcp", google)
    node.start()
    assert node.wait_exit(60) == 0
    assert node.powered_off() == [], "a GCP node whose delete failed for a moment powered off"
    calls = [(m, p.split("?")[0].rsplit("/", 1)[-1]) for m, p, _ in google.requests if p.startswith("/compute")]
    # The disk is marked once; the retries only repeat the delete.
    assert calls == [("POST", "setDiskAutoDelete")] + [("DELETE", "sky-train-0")] * 4


def test_gcp_self_delete_skips_the_disk_marking_done_at_boot(nodes: Any, google: FakeGoogle) -> None:
    plan = replace(make_plan(ttl=1, disks=(DiskPlan(10, "/a"), DiskPlan(10, "/b"))), grace=0)
    node = nodes(plan, "gcp", google)
    boot = subprocess.run([str(node.self_delete), "--auto-delete-only"], env=node.env, timeout=60)
    assert boot.returncode == 0
    node.start()
    assert node.wait_exit(30) == 0
    calls = [m for m, p, _ in google.requests if p.startswith("/compute")]
    assert calls == ["POST", "POST", "DELETE"], "the disks were marked again at the node's death"


def test_ebs_device_names_are_read_from_the_nvme_vendor_area() -> None:
    namespace: dict[str, Any] = {"__name__": "ebsname"}
    exec(userdata.ebs_name_script().split("\n", 1)[1], namespace)
    blob = bytearray(4096)
    blob[3072:3104] = b"/dev/sdf".ljust(32, b" ")
    assert namespace["ebs_name"](bytes(blob)) == "sdf"
    blob[3072:3104] = b"sdg".ljust(32, b" ")
    assert namespace["ebs_name"](bytes(blob)) == "sdg"


def test_disk_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", "-c", userdata.disk_script()], check=True)
    subprocess.run(["bash", "-n", "-c", userdata.watchdog_script(make_plan(), "gcp")], check=True)


# -- GCP's extra disks go with their instance on every path ------------------------
# A disk attached through attached_disks has auto-delete off (the provider has no field for it:
# terraform-provider-google #4378), so a spot preemption or termination_time, which delete the
# instance without running anything on it, would leave the extra disks billing. The node sets
# auto-delete on its own disks at boot, retrying while its new grant is not visible yet.
def test_a_gcp_node_sets_auto_delete_on_its_disks_at_boot(google: FakeGoogle) -> None:
    from stackfakes import cloud_config

    plan = make_plan(disks=(DiskPlan(10, "/a"), DiskPlan(10, "/b")))
    doc = cloud_config(userdata.cloud_config(plan, plan.nodes[0], [["x"], ["y"]], cloud="gcp"))
    script = next(f["content"] for f in doc["write_files"] if f["path"] == "/usr/local/sbin/skyward-self-delete")
    boot = [c for c in doc["runcmd"] if "--auto-delete-only" in c]
    assert boot == [["systemd-run", "--unit=skyward-disk-auto-delete", "--no-block",
                     "/usr/local/sbin/skyward-self-delete", "--auto-delete-only"]]
    # Also without a TTL or deadline (the watchdog is off, the preemption path is not).
    plan0 = replace(plan, ttl=0)
    doc0 = cloud_config(userdata.cloud_config(plan0, plan0.nodes[0], [["x"], ["y"]], cloud="gcp"))
    assert any("--auto-delete-only" in c for c in doc0["runcmd"])
    assert not any("--auto-delete-only" in c for c in cloud_config(userdata.cloud_config(
        make_plan(), make_plan().nodes[0], [], cloud="gcp"))["runcmd"])

    google.refuse_auto_delete = 2  # the first two tries: the grant is not visible yet
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"self-delete-{uuid.uuid4().hex}"
    path.write_text(script)
    path.chmod(0o755)
    try:
        env = {**os.environ, "SKYWARD_METADATA_URL": f"{google.url}/md", "SKYWARD_STATE_DIR": str(path) + ".state",
               "SKYWARD_COMPUTE_URL": f"{google.url}/compute/v1", "SKYWARD_RETRY_SECONDS": "0.1"}
        done = subprocess.run([str(path), "--auto-delete-only"], env=env, timeout=60)
    finally:
        path.unlink()
        shutil.rmtree(str(path) + ".state", ignore_errors=True)
    assert done.returncode == 0
    calls = [(m, p) for m, p, _ in google.requests if p.startswith("/compute")]
    base = "/compute/v1/projects/proj/zones/us-east1-c/instances/sky-train-0"
    assert ("DELETE", base) not in calls  # it only marks its disks, it does not delete itself
    assert calls[-2:] == [("POST", f"{base}/setDiskAutoDelete?autoDelete=true&deviceName=disk-0"),
                          ("POST", f"{base}/setDiskAutoDelete?autoDelete=true&deviceName=disk-1")]
    assert len(calls) == 4  # two refused tries, then both disks


# -- a TPU VM stops billing at the TTL -------------------------------------------
# A TPU VM is not a Compute Engine instance: the compute API refuses to delete it and a guest
# power-off leaves the TPU node (and its bill) in place. The node deletes its TPU node through the
# TPU API (v2: DELETE projects/P/locations/Z/nodes/N) with its own service account. Its metadata
# server names the worker VM, not the TPU node, so the node's zone and name come in the user data.
def test_a_tpu_vm_deletes_its_tpu_node_through_the_tpu_api(nodes: Any, google: FakeGoogle) -> None:
    from stackfakes import cloud_config

    plan = replace(make_plan(ttl=1, instance_type="tpu-v5litepod-8", zone="us-west4-a"), grace=0)
    doc = cloud_config(userdata.cloud_config(plan, plan.nodes[0], [], cloud="gcp",
                                             tpu_node=("us-west4-a", "sky-train-ab12cd34-0")))
    script = next(f["content"] for f in doc["write_files"] if f["path"] == "/usr/local/sbin/skyward-self-delete")
    node = nodes(plan, "gcp", google)
    node.self_delete.write_text(script)
    node.env["SKYWARD_TPU_URL"] = f"{google.url}/tpu/v2"
    node.start()
    assert node.wait_exit(30) == 0
    assert node.powered_off() == [], "a TPU VM that could delete its TPU node powered off (the node bills on)"
    calls = [(m, p) for m, p, _ in google.requests if not p.startswith("/md/")]
    assert calls == [("DELETE", "/tpu/v2/projects/proj/locations/us-west4-a/nodes/sky-train-ab12cd34-0")]


def _tpu_node(nodes: Any, google: FakeGoogle) -> Any:
    from stackfakes import cloud_config

    plan = replace(make_plan(ttl=1, instance_type="tpu-v5litepod-8", zone="us-west4-a"), grace=0)
    doc = cloud_config(userdata.cloud_config(plan, plan.nodes[0], [], cloud="gcp",
                                             tpu_node=("us-west4-a", "sky-train-ab12cd34-0")))
    files = {f["path"]: f["content"] for f in doc["write_files"]}
    node = nodes(plan, "gcp", google)
    node.self_delete.write_text(files["/usr/local/sbin/skyward-self-delete"])
    node.watchdog.write_text(files["/usr/local/sbin/skyward-watchdog"])
    node.env.update(SKYWARD_TPU_URL=f"{google.url}/tpu/v2", SKYWARD_DELETE_WINDOW="0")
    return node


def test_a_tpu_vm_retries_its_delete_for_ever_and_never_powers_off(nodes: Any, google: FakeGoogle) -> None:
    """A powered-off TPU VM bills on, and nothing else would end it: the node keeps trying (the
    window after which a Compute Engine instance gives up is 0 here) until the API takes it."""
    google.refuse_delete = True
    node = _tpu_node(nodes, google)
    node.start()
    assert node.wait_exit(6) is None, "the TPU VM's watchdog gave up on its delete"
    assert node.powered_off() == [], "a TPU VM powered off (its TPU node bills on)"
    tries = [p for m, p, _ in google.requests if m == "DELETE"]
    assert len(tries) >= 3 and set(tries) == {"/tpu/v2/projects/proj/locations/us-west4-a/nodes/sky-train-ab12cd34-0"}
    google.fail_deletes, google.refuse_delete = 1, False  # one more failure, then the API recovers
    assert node.wait_exit(30) == 0
    assert node.powered_off() == []
    assert len([m for m, _, _ in google.requests if m == "DELETE"]) >= len(tries) + 2


def test_a_tpu_vm_startup_script_installs_and_starts_the_same_watchdog(tmp_path: Path) -> None:
    """The guest agent runs ``startup-script`` on TPU runtime images (cloud-init may not run
    there): run for real under a root of its own, it installs the user data's watchdog and
    self-delete and starts the unit; a second boot changes nothing."""
    from stackfakes import cloud_config

    plan = replace(make_plan(ttl=60, instance_type="tpu-v5litepod-8", zone="us-west4-a"), grace=0)
    tpu = ("us-west4-a", "sky-train-ab12cd34-0")
    doc = cloud_config(userdata.cloud_config(plan, plan.nodes[0], [], cloud="gcp", tpu_node=tpu))
    files = {f["path"]: f for f in doc["write_files"]}
    root, bin_dir, log = tmp_path / "root", tmp_path / "bin", tmp_path / "systemctl.log"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/bash\necho "$*" >> {log}\n[ "$1" != is-active ]\n')
    (bin_dir / "systemctl").chmod(0o755)
    script = tmp_path / "startup-script"
    script.write_text(userdata.startup_script(plan, tpu))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SKYWARD_ROOT": str(root)}
    for _ in range(2):
        subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    for path in ("/usr/local/sbin/skyward-watchdog", "/usr/local/sbin/skyward-self-delete",
                 "/etc/systemd/system/skyward-watchdog.service"):
        installed = root / path.lstrip("/")
        assert installed.read_text() == files[path]["content"], path
        assert oct(installed.stat().st_mode & 0o777) == oct(int(files[path]["permissions"], 8))
    assert "tpu=1" in files["/usr/local/sbin/skyward-watchdog"]["content"]
    assert log.read_text().splitlines() == ["is-active --quiet skyward-watchdog.service", "daemon-reload",
                                            "enable --now skyward-watchdog.service"] * 2
    assert not list(root.rglob("*.new"))
