"""What a real account would still refuse, leave billing or boot broken,
that Pulumi's mocks cannot see -- pre-Turing GPUs on GCP (item 7), TPU VMs deleting themselves
(item 8), the projects' and accounts' known limits (item 10), orphaned disks (item 1) and AWS
machines sold through Capacity Blocks (item 3). Each test names the rule it encodes; the sources
are in the modules it tests and in docs/guides/clouds.md."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")

from stackfakes import CLIENT, cloud_config, fresh_mocks, make_plan  # noqa: E402

import skyward as sky  # noqa: E402
from skyward.catalogue import load  # noqa: E402
from skyward.stacks import gcp, userdata  # noqa: E402


def _gcp() -> Any:
    return sky.GCP(project="proj", detect_address=False, allow_ssh_from=[CLIENT])


def _gcp_plan(offer: Any, **kw: Any) -> Any:
    args = _gcp()._stack_args(sky.Spec(provider=_gcp(), accelerator=offer.accelerator), offer)
    settings = {**args["settings"], "zones": ["us-central1-c"]}
    return make_plan(gpu=True, instance_type=offer.instance_type, region="us-central1", settings=settings, **kw)


def _declare(plan: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Node 0's instance inputs and its metadata, secrets (user data) revealed."""
    mocks = fresh_mocks()
    seen: dict[str, Any] = {}

    @pulumi.runtime.test
    def go() -> Any:
        declared = gcp.program(plan)
        return declared.instances[0].metadata.apply(seen.update)

    go()
    return mocks.of_type("gcp:compute/instance:Instance")[0].inputs, seen


# -- item 7: GPUs older than Turing boot a driver that drives them ---------------------------------
PRE_TURING = sorted({o.accelerator for o in load("gcp") if (o.extra.get("accelerator_type") or "")
                     .removesuffix("-vws") in getattr(gcp, "PROPRIETARY_DRIVER_GPUS", ())})


def test_the_catalogue_has_the_pre_turing_gpus_this_rule_is_about() -> None:
    assert PRE_TURING == ["P100", "P4", "V100"]


@pytest.mark.parametrize("accelerator", ["P100", "P4", "V100"])
def test_pre_turing_gcp_gpus_boot_ubuntu_and_the_proprietary_driver(accelerator: str) -> None:
    # NVIDIA's open kernel modules drive Turing and newer only (R560 announcement); the
    # accelerator image's driver may be that flavour. These nodes boot plain Ubuntu 24.04 and
    # install the proprietary 580-server flavour, built by Canonical for the running kernel.
    offer = next(o for o in load("gcp") if o.accelerator == accelerator and o.region == "us-central1")
    inst, metadata = _declare(_gcp_plan(offer))
    assert inst["guestAccelerators"][0]["type"] == offer.extra["accelerator_type"]
    image = inst["bootDisk"]["initializeParams"]["image"]
    assert "/ubuntu-os-cloud/" in image and "ubuntu-2404-lts-amd64" in image and "nvidia" not in image
    doc = cloud_config(metadata["user-data"])
    script = next(f["content"] for f in doc["write_files"] if f["path"] == "/usr/local/sbin/skyward-nvidia-driver")
    assert '"linux-modules-nvidia-$branch-$(uname -r)"' in script and "580-server" in script
    assert "open" not in userdata.NVIDIA_BRANCH
    assert doc["runcmd"][-1][0] == "/usr/local/sbin/skyward-nvidia-driver"  # after the watchdog starts
    # The client's key arrives only through that script (no ssh-keys the guest agent would install).
    assert "ssh-keys" not in metadata
    assert "ssh_authorized_keys" not in doc["users"][1]


def test_turing_and_newer_keep_the_accelerator_image_and_their_keys() -> None:
    offer = next(o for o in load("gcp") if o.instance_type == "n1-standard-4+t4" and o.region == "us-central1")
    inst, metadata = _declare(_gcp_plan(offer))
    assert "ubuntu-accelerator-2404-amd64-with-nvidia-580" in inst["bootDisk"]["initializeParams"]["image"]
    doc = cloud_config(metadata["user-data"])
    assert metadata["ssh-keys"].endswith(doc["users"][1]["ssh_authorized_keys"][0])
    assert not any(f["path"].endswith("skyward-nvidia-driver") for f in doc["write_files"])


def test_the_preview_says_a_v100_node_installs_the_proprietary_driver() -> None:
    rows = {r["name"]: r["detail"] for r in _gcp().preview(sky.Spec(provider=_gcp(), accelerator="V100"))["resources"]}
    assert "ubuntu-2404-lts-amd64" in rows["node-0"]
    assert "NVIDIA driver nvidia-580-server (proprietary), installed at boot" in rows["node-0"]
    assert "the client is let in once its GPU answers" in rows["node-0"]


def _driver_node(tmp_path: Path, *, apt_ok: bool, gpu: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    home.mkdir()
    tools = {
        "apt-get": f'echo "apt-get $*" >> {tmp_path}/log; exit {0 if apt_ok else 100}',
        "modprobe": f'echo "modprobe $*" >> {tmp_path}/log',
        "nvidia-smi": 'echo "GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-1)"' if gpu else "exit 9",
        "logger": "exit 0", "sleep": "exit 0",
    }
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "skyward-nvidia-driver"
    script.write_text(userdata.nvidia_driver_script())
    script.chmod(0o755)
    key = tmp_path / "client.pub"
    key.write_text("ssh-ed25519 AAAA client\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SKYWARD_LOGIN_HOME": str(home)}
    done = subprocess.run([str(script), "skyward", str(key)], env=env, capture_output=True, text=True, timeout=30)
    return done, home


def test_the_driver_script_installs_the_proprietary_flavour_and_then_lets_the_client_in(tmp_path: Path) -> None:
    done, home = _driver_node(tmp_path, apt_ok=True, gpu=True)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "log").read_text()
    kernel = os.uname().release
    assert f"linux-modules-nvidia-580-server-{kernel}" in log and "nvidia-headless-no-dkms-580-server" in log
    assert "-open" not in log and "modprobe nvidia" in log
    assert (home / ".ssh" / "authorized_keys").read_text() == "ssh-ed25519 AAAA client\n"


@pytest.mark.parametrize("apt_ok,gpu", [(False, True), (True, False)])
def test_a_node_whose_gpu_does_not_answer_never_lets_the_client_in(tmp_path: Path, apt_ok: bool, gpu: bool) -> None:
    done, home = _driver_node(tmp_path, apt_ok=apt_ok, gpu=gpu)
    assert done.returncode == 1
    assert "no GPU answers with NVIDIA's proprietary 580-server driver" in done.stderr
    assert not (home / ".ssh" / "authorized_keys").exists()


# -- item 8: a TPU VM deletes its own TPU node at the TTL -------------------------------------------
def test_each_tpu_vm_has_an_account_that_may_delete_its_own_tpu_node_only() -> None:
    from skyward.stacks import gcp_tpu

    mocks = fresh_mocks()
    plan = make_plan(nodes=2, instance_type="tpu-v5litepod-8", region="us-west4", zone="us-west4-a",
                     settings={"project": "proj", "tpu": {"runtime_version": "v2-alpha-tpuv5-lite"}})
    seen: dict[int, Any] = {}

    @pulumi.runtime.test
    def go() -> Any:
        declared = gcp_tpu.program(plan)
        return pulumi.Output.all(*[vm.metadata for vm in declared.vms.values()]).apply(
            lambda ms: seen.update(enumerate(ms)))

    go()
    vms = mocks.of_type("gcp:tpu/v2Vm:V2Vm")
    accounts = mocks.of_type("gcp:serviceaccount/account:Account")
    (role,) = mocks.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
    members = mocks.of_type("gcp:projects/iAMMember:IAMMember")
    assert role.inputs["permissions"] == ["tpu.nodes.delete"]
    assert len(accounts) == len(vms) == len(members) == 2
    for i in range(2):  # (resources register in no fixed order)
        vm = next(v for v in vms if v.inputs["name"].endswith(f"-{i}"))
        email = next(f"{a.inputs['accountId']}@proj.iam.gserviceaccount.com" for a in accounts
                     if a.inputs["accountId"].endswith(f"-{i}"))
        assert vm.inputs["serviceAccount"]["email"] == email
        member = next(m for m in members if m.inputs["member"] == f"serviceAccount:{email}")
        assert member.inputs["role"] == f"projects/proj/roles/{role.inputs['roleId']}"
        # Granted on the project (a TPU node has no IAM policy of its own), with no condition
        # (Cloud TPU cannot evaluate one: tests/stacks/test_cloud_review3.py).
        name = vm.inputs["name"]
        assert not member.inputs.get("condition")
        script = next(f["content"] for f in cloud_config(seen[i]["user-data"])["write_files"]
                      if f["path"] == "/usr/local/sbin/skyward-self-delete")
        assert f"TPU = ['us-west4-a', '{name}']" in script


def test_the_preview_says_a_tpu_vm_deletes_itself() -> None:
    spec = sky.Spec(provider=_gcp(), accelerator="v5e:8")
    rows = {r["name"]: r["detail"] for r in _gcp().preview(spec)["resources"]}
    assert "deletes its TPU node when its TTL runs out (its own service account)" in rows["node-0"]
    assert "tpu.nodes.delete" in rows["tpu-self-delete"]


# -- item 10: known limits, each a clear error or a retry -------------------------------------------
def _pool(ws: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    import json

    from stackfakes import isolated_home

    from skyward.stacks import keys
    from skyward.stacks.cloudpool import CloudPool

    isolated_home(tmp_path, monkeypatch)
    plan = make_plan(nodes=0, zone="us-east-1a", **kw)
    key_path, _ = keys.client_key(plan.stack)
    return CloudPool(plan, lambda plan: None, pool_id="ab12cd34", key_path=key_path, spot=False,
                     fallback_to_on_demand=False, record={"skyward": "0.1.0"},
                     secrets={"env": json.dumps({})}, plugins={}, connect=ws)


def test_a_service_account_not_visible_yet_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Service account creation is eventually consistent (Google's IAM overview, "Consistency";
    # terraform-provider-google #2939, #15042, #18024): the grant right after it may fail.
    from stackfakes import FakeWorkspace, command_error

    from skyward.stacks import cloudpool

    monkeypatch.setattr(cloudpool, "_IAM_RETRY_SECONDS", (0.0, 0.0, 0.0))
    gone = ("error: 1 error occurred:\n  * Error applying IAM policy for instance: Error 400: Service account "
            "sky-783090604b-0@proj.iam.gserviceaccount.com does not exist., badRequest")
    ws = FakeWorkspace(fail={"update": [command_error(gone), command_error(gone)]})
    cloud = _pool(ws, tmp_path, monkeypatch)
    assert len(cloud.start(1)) == 1
    assert [k for k, _ in ws.calls].count("update") == 3


@pytest.mark.parametrize("stderr,says", [
    ("error: invoking aws:ec2/getVpc:getVpc: no matching EC2 VPC found",
     r"no default VPC.*sky\.AWS\(subnet="),
    ("error: googleapi: Error 403: Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally., quotaExceeded",
     r"quota GPUS_ALL_REGIONS is 0 for the whole project.*0 on new projects.*Quotas page"),
    ("error: googleapi: Error 403: Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 1.0 in region us-central1., quotaExceeded",
     r"quota NVIDIA_T4_GPUS is 1 in region us-central1.*Quotas page \(IAM & Admin > Quotas, filter NVIDIA_T4_GPUS"),
    ("error: creating EC2 Instance: operation error EC2: RunInstances, api error VcpuLimitExceeded: You have "
     "requested more vCPU capacity than your current vCPU limit of 0 allows for the instance bucket that the "
     "specified instance type belongs to.",
     r"vCPU quota for this instance family is 0 vCPUs.*Service Quotas console"),
    ("error: invoking aws:ec2/getSubnet:getSubnet: no matching EC2 Subnet found",
     r"no default subnet.*aws ec2 create-default-subnet --availability-zone.*sky\.AWS\(subnet="),
    ("error: Error creating Role: googleapi: Error 429: Maximum number of custom roles (300) reached",
     r"custom roles.*300.*7 days"),
    ("error: googleapi: Error 429: Maximum number of service accounts on project reached",
     r"service accounts.*100.*quota"),
    ("error: Constraint constraints/compute.requireOsLogin violated for project proj",
     r"organization policy enforces OS Login.*requireOsLogin.*project outside that policy"),
])
def test_known_limits_say_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stderr: str, says: str) -> None:
    from stackfakes import FakeWorkspace, command_error

    from skyward.errors import StackError

    ws = FakeWorkspace(fail={"update": [command_error(stderr)]})
    with pytest.raises(StackError, match="(?s)" + says):
        _pool(ws, tmp_path, monkeypatch).start(1)


def test_a_gcp_pool_over_the_service_account_quota_is_refused_before_anything_exists() -> None:
    from skyward.errors import ConfigError

    spec = sky.Spec(provider=_gcp(), accelerator="T4", nodes=101)
    with pytest.raises(ConfigError, match=r"101 nodes.*one service account per node.*100 per project"):
        _gcp().preview(spec)


def test_aws_local_and_wavelength_zones_are_not_tried() -> None:
    # Opted-in Local Zones and Wavelength Zones appear among a type's offerings like availability
    # zones (ZoneType local-zone / wavelength-zone), sorted first; a pool goes to a real AZ.
    from skyward.stacks import aws

    mocks = fresh_mocks()
    mocks.aws_zones = ["us-east-1-bos-1a", "us-east-1-wl1-nyc-wlz-1", "us-east-1b", "us-east-1a"]
    seen: dict[str, Any] = {}

    @pulumi.runtime.test
    def go() -> Any:
        return aws.program(make_plan()).subnet.availability_zone.apply(lambda z: seen.update(zone=z))

    go()
    assert seen["zone"] == "us-east-1a"
