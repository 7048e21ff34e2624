"""The cloud-init user data every cloud node boots with (the same for AWS and GCP).

It does four things before the client ever connects:

* installs the node's host key, generated on the client (so the first SSH connection is
  already verified) and removes every other host key; on GCP it also turns off the guest
  agent's host-key regeneration (``set_host_keys``) before that agent starts, or it would
  replace the key the client expects;
* formats and mounts the node's extra disks (AWS: found by their EBS device name, also when
  they show up as NVMe devices);
* starts a watchdog, the TTL safety net: if no skyward agent runs on the node for ``ttl``
  seconds (plus the bootstrap grace at first boot), or the pool's absolute deadline
  (``max_duration``) has passed, the node removes itself. AWS: it powers off, which
  terminates it (``instance_initiated_shutdown_behavior``) and deletes its volumes
  (``delete_on_termination``). GCP: a guest power-off only *stops* a VM, whose disks keep
  billing, so the node deletes itself through the compute API with its own service account
  (after marking every disk auto-delete), and powers off only when that is refused. The disks
  are also marked auto-delete at boot, so that Compute Engine's own deletes (spot preemption,
  ``termination_time``) take them too. The
  agent's own lease watchdog is the first line; this one covers a client that died before any
  agent started. ``ttl=0`` disables the TTL (the deadline still applies).
* on AWS, also schedules a power-off at the deadline computed at boot from the absolute epoch
  in the user data, so a node added late does not outlive the pool's cap (and the user data
  of every node is the same, so adding one replaces none).

cloud-config is YAML, and JSON is YAML: the document is written with json.dumps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .plan import NodePlan, PoolPlan

# Every external URL and the loop period can be overridden from the environment: the tests
# run these scripts for real against fakes on loopback.
_WATCHDOG = """#!/bin/bash
# skyward TTL safety net: remove this node when no skyward agent has run for TTL seconds,
# or when the pool's absolute deadline has passed.
ttl={ttl}; grace={grace}; deadline={deadline}; cloud={cloud}; tpu={tpu}
interval=${{SKYWARD_WATCHDOG_INTERVAL:-15}}
start=$(date +%s); last=$start
say() {{ logger -t skyward "$1" 2>/dev/null || echo "skyward: $1" >&2; }}
# GCP: delete this node through its own service account, with backoff. A Compute Engine
# instance falls back to a power-off after a few minutes of refusals (its disks then bill until
# `skyward down --expired`); a TPU VM never does: a powered-off TPU bills on and nothing else
# would be left to end it, so it keeps trying until the delete is accepted.
stop_node() {{
  say "$1: removing this node"
  if [ "$cloud" = gcp ]; then
    delay=${{SKYWARD_BACKOFF_FIRST:-5}}; most=${{SKYWARD_BACKOFF_MAX:-120}}
    window=${{SKYWARD_DELETE_WINDOW:-300}}; began=$(date +%s); tries=0
    while :; do
      tries=$((tries + 1))
      if "${{SKYWARD_SELF_DELETE:-/usr/local/sbin/skyward-self-delete}}"; then exit 0; fi
      if [ "$tpu" != 1 ] && [ $(($(date +%s) - began)) -ge "$window" ]; then break; fi
      say "self-delete refused (try $tries): trying again in ${{delay}}s"
      sleep "$delay"
      delay=$((delay * 2)); if [ "$delay" -gt "$most" ]; then delay=$most; fi
    done
    say "self-delete refused $tries times over ${{window}}s: powering off instead"
  fi
  systemctl poweroff || shutdown -h now || poweroff
  exit 0
}}
while sleep "$interval"; do
  now=$(date +%s)
  if [ "$deadline" -gt 0 ] && [ "$now" -ge "$deadline" ]; then stop_node "the pool reached its max_duration"; fi
  [ "$ttl" -gt 0 ] || continue
  if pgrep -f "${{SKYWARD_AGENT_PATTERN:-skyward[.]bootstrap[.]agent}}" >/dev/null; then last=$now; fi
  limit=$ttl
  if [ "$last" -eq "$start" ]; then limit=$((ttl + grace)); fi
  if [ $((now - last)) -ge "$limit" ]; then stop_node "no skyward agent for ${{limit}}s"; fi
done
"""

# GCP: delete this instance (and, through auto-delete, its disks) with the instance's own
# service account, which may do nothing else. Exit 0 only when the delete was accepted.
# With --auto-delete-only (run once at boot), only mark the extra disks auto-delete: a disk
# attached through the provider's attached_disks has it off, and Compute Engine deletes a spot
# or termination_time instance without running anything on it. The node's grant may not be
# visible yet at boot (IAM propagation): that step retries for a few minutes.
_SELF_DELETE = """#!/usr/bin/env python3
import json, os, sys, time, urllib.request, urllib.error
MD = os.environ.get("SKYWARD_METADATA_URL", "http://metadata.google.internal/computeMetadata/v1")
API = os.environ.get("SKYWARD_COMPUTE_URL", "https://compute.googleapis.com/compute/v1")
TPU_API = os.environ.get("SKYWARD_TPU_URL", "https://tpu.googleapis.com/v2")
DISKS = {disks}
TPU = {tpu}  # [zone, name] of this TPU VM's TPU node (its metadata names the worker VM instead)
RETRY = float(os.environ.get("SKYWARD_RETRY_SECONDS", "10"))

def call(method, url, token=None):
    headers = {{"Metadata-Flavor": "Google"}} if token is None else {{"Authorization": "Bearer " + token}}
    req = urllib.request.Request(url, method=method, headers=headers, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=20) as r:
        return r.read().decode()

def instance():
    token = json.loads(call("GET", MD + "/instance/service-accounts/default/token"))["access_token"]
    project = call("GET", MD + "/project/project-id").strip()
    zone = call("GET", MD + "/instance/zone").strip().rsplit("/", 1)[-1]
    name = call("GET", MD + "/instance/name").strip()
    return token, "%s/projects/%s/zones/%s/instances/%s" % (API, project, zone, name)

# Written once the disks are marked auto-delete, so the time-of-death self-delete (and each of
# its retries) does not mark them again.
MARKED = os.path.join(os.environ.get("SKYWARD_STATE_DIR", "/var/lib/skyward"), "disks-auto-delete")

def auto_delete(token, base):
    if not DISKS or os.path.exists(MARKED):
        return
    for device in DISKS:
        call("POST", base + "/setDiskAutoDelete?autoDelete=true&deviceName=" + device, token)
    try:
        os.makedirs(os.path.dirname(MARKED), exist_ok=True)
        open(MARKED, "w").close()
    except OSError:
        pass

def delete(url, token):
    try:
        call("DELETE", url, token)
    except urllib.error.HTTPError as exc:
        if exc.code != 404:  # already gone: nothing bills
            raise

ERRORS = (OSError, ValueError, KeyError, urllib.error.URLError)
if sys.argv[1:] == ["--auto-delete-only"]:
    for attempt in range(30):
        try:
            auto_delete(*instance())
            sys.exit(0)
        except ERRORS as exc:
            print("skyward: marking the disks auto-delete failed (try %d): %s" % (attempt + 1, exc), file=sys.stderr)
            time.sleep(RETRY)
    sys.exit(1)
try:
    if TPU:  # a TPU VM: the compute API refuses it; the TPU API deletes the node (and bills no more)
        token = json.loads(call("GET", MD + "/instance/service-accounts/default/token"))["access_token"]
        project = call("GET", MD + "/project/project-id").strip()
        delete("%s/projects/%s/locations/%s/nodes/%s" % (TPU_API, project, TPU[0], TPU[1]), token)
        sys.exit(0)
    token, base = instance()
    auto_delete(token, base)
    delete(base, token)
except ERRORS as exc:
    print("skyward: self-delete failed: %s" % exc, file=sys.stderr)
    sys.exit(1)
"""

# GCP nodes with a GPU older than Turing (stacks/gcp.py: P100, P4, V100): NVIDIA's proprietary
# 580 server driver, the flavour without "-open" in its package names, prebuilt by Canonical for
# the running kernel (linux-modules-nvidia-580-server-<kernel>) and its user space without DKMS.
# The client's key is installed only once a GPU answers: a node whose GPU cannot work never
# admits the client (its login stays refused, the pool's ssh_timeout names the node, and the
# watchdog removes it), so no task ever runs on it.
_NVIDIA = """#!/bin/bash
set -u
user=$1; key=$2
branch=${{SKYWARD_NVIDIA_BRANCH:-{branch}}}
export DEBIAN_FRONTEND=noninteractive
say() {{ logger -t skyward "$1" 2>/dev/null; echo "skyward: $1" >&2; }}
installed=0
for try in 1 2 3 4 5; do
  if apt-get -o DPkg::Lock::Timeout=600 update -q \
     && apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends \
        "linux-modules-nvidia-$branch-$(uname -r)" "nvidia-headless-no-dkms-$branch" "nvidia-utils-$branch"; then
    installed=1; break
  fi
  say "installing the NVIDIA $branch driver failed (try $try)"; sleep "${{SKYWARD_RETRY_SECONDS:-15}}"
done
if [ "$installed" != 1 ] || ! modprobe nvidia || ! nvidia-smi -L | grep -q '^GPU '; then
  say "no GPU answers with NVIDIA's proprietary $branch driver: the client is not let in"
  exit 1
fi
home=${{SKYWARD_LOGIN_HOME:-$(getent passwd "$user" | cut -d: -f6)}}
mkdir -p "$home/.ssh" && cat "$key" >> "$home/.ssh/authorized_keys"
chmod 700 "$home/.ssh" && chmod 600 "$home/.ssh/authorized_keys"
chown -R "$user:" "$home/.ssh" 2>/dev/null || true
say "NVIDIA $branch driver loaded: $(nvidia-smi -L | head -1)"
"""
NVIDIA_BRANCH = "580-server"  # the last branch that supports Pascal and Volta GPUs

_UNIT = """[Unit]
Description=skyward TTL safety net (removes the node when no agent runs)
After=network-online.target

[Service]
ExecStart=/usr/local/sbin/skyward-watchdog
Restart=always

[Install]
WantedBy=multi-user.target
"""

# The EBS device name (e.g. "sdf") of an NVMe device, from the vendor-specific part of its
# NVMe identify-controller data (the method of amazon-ec2-utils' ebsnvme-id). On Nitro
# instances EBS volumes are NVMe devices whose kernel names follow no fixed order.
_EBS_NAME = """#!/usr/bin/env python3
import ctypes, fcntl, sys

class AdminCommand(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("opcode", ctypes.c_uint8), ("flags", ctypes.c_uint8), ("cid", ctypes.c_uint16),
                ("nsid", ctypes.c_uint32), ("reserved0", ctypes.c_uint64), ("mptr", ctypes.c_uint64),
                ("addr", ctypes.c_uint64), ("mlen", ctypes.c_uint32), ("alen", ctypes.c_uint32),
                ("cdw10", ctypes.c_uint32), ("cdw11", ctypes.c_uint32), ("cdw12", ctypes.c_uint32),
                ("cdw13", ctypes.c_uint32), ("cdw14", ctypes.c_uint32), ("cdw15", ctypes.c_uint32),
                ("reserved1", ctypes.c_uint64)]

def ebs_name(identify):
    # bytes 3072..3104: the block device name the volume was attached as, space padded
    name = bytes(identify[3072:3104]).decode("ascii", "replace").strip().strip("\\x00").strip()
    return name[5:] if name.startswith("/dev/") else name

def identify(path):
    buf = ctypes.create_string_buffer(4096)
    cmd = AdminCommand(opcode=0x06, addr=ctypes.addressof(buf), alen=4096, cdw10=1)
    with open(path, "rb") as dev:
        fcntl.ioctl(dev, 0xC0484E41, cmd)
    return buf.raw

if __name__ == "__main__":
    try:
        print(ebs_name(identify(sys.argv[1])))
    except OSError:
        sys.exit(1)
"""

_DISK = """#!/bin/bash
# Format (once) and mount one extra disk: the first candidate device that appears. A
# candidate "ebs:sdf" is the EBS volume attached as sdf, whatever name the kernel gave it.
set -eu
mount_point=$1; shift
find_dev() {
  for want in "$@"; do
    case "$want" in
      ebs:*)
        name=${want#ebs:}
        for dev in "/dev/$name" "/dev/xvd${name#sd}"; do [ -b "$dev" ] && { echo "$dev"; return 0; }; done
        for dev in /dev/nvme*n1; do
          [ -b "$dev" ] || continue
          [ "$(${SKYWARD_EBS_NAME:-/usr/local/sbin/skyward-ebs-name} "$dev" 2>/dev/null)" = "$name" ] && { echo "$dev"; return 0; }
        done ;;
      *) [ -b "$want" ] && { echo "$want"; return 0; } ;;
    esac
  done
  return 1
}
for _ in $(seq 1 120); do
  if dev=$(find_dev "$@"); then
    dev=$(readlink -f "$dev")
    blkid "$dev" >/dev/null 2>&1 || mkfs.ext4 -q -F "$dev"
    mkdir -p "$mount_point"
    uuid=$(blkid -s UUID -o value "$dev")
    grep -q "$uuid" /etc/fstab || echo "UUID=$uuid $mount_point ext4 defaults,nofail 0 2" >> /etc/fstab
    mountpoint -q "$mount_point" || mount "$mount_point"
    chmod 1777 "$mount_point"
    exit 0
  fi
  sleep 5
done
echo "skyward: no device for $mount_point among: $*" >&2
exit 1
"""

# AWS: the deadline is an absolute epoch, so every node's user data is the same; at boot the
# minutes left are computed and handed to shutdown (which the watchdog backs up).
_DEADLINE = (
    "left=$(( ({deadline} - $(date +%s)) / 60 )); "
    "if [ $left -lt 1 ]; then left=1; fi; "
    "shutdown -P +$left 'skyward: the pool reached its max_duration'"
)

# GCP guest environment: no host-key regeneration (it would replace the key the client
# pinned); the login user made from ssh-keys metadata stays when keys change.
_GCE_GUEST = """[InstanceSetup]
set_host_keys = false

[Accounts]
deprovision_remove = false
"""


def cloud_config(
    plan: PoolPlan, node: NodePlan, disk_devices: Sequence[Sequence[str]] = (), *, cloud: str = "aws",
    proprietary_driver: bool = False, tpu_node: tuple[str, str] | None = None,
) -> str:
    """User data for one node; ``disk_devices[j]`` lists where plan.disks[j] may appear.
    ``cloud`` ("aws" or "gcp") decides how the watchdog removes the node. ``proprietary_driver``:
    install NVIDIA's proprietary driver at boot and admit the client only once a GPU answers.
    ``tpu_node``: (zone, name) of a TPU VM's TPU node, which its self-delete deletes."""
    files = [
        {"path": "/usr/local/sbin/skyward-disk", "permissions": "0755", "content": _DISK},
    ]
    if cloud == "aws" and plan.disks:
        files.append({"path": "/usr/local/sbin/skyward-ebs-name", "permissions": "0755", "content": _EBS_NAME})
    if cloud == "gcp":
        # write_files runs in cloud-init's network stage, before network-online.target, which
        # the guest agent waits for: it reads this on its first start.
        files.append({"path": "/etc/default/instance_configs.cfg", "permissions": "0644", "content": _GCE_GUEST})
    run: list[str | list[str]] = []
    for disk, devices in zip(plan.disks, disk_devices, strict=True):
        run.append(["/usr/local/sbin/skyward-disk", disk.mount, *devices])
    deadline = int(plan.expires) if plan.expires is not None else 0
    self_delete = {"path": "/usr/local/sbin/skyward-self-delete", "permissions": "0755",
                   "content": self_delete_script(plan, tpu_node)}
    if cloud == "gcp" and plan.disks:
        # In the background (the grant may take minutes to be visible; the mounts do not wait).
        files.append(self_delete)
        run.insert(0, ["systemd-run", "--unit=skyward-disk-auto-delete", "--no-block",
                       "/usr/local/sbin/skyward-self-delete", "--auto-delete-only"])
    if plan.ttl > 0 or deadline:
        files += [
            {"path": "/usr/local/sbin/skyward-watchdog", "permissions": "0755",
             "content": watchdog_script(plan, cloud, tpu=tpu_node is not None)},
            {"path": "/etc/systemd/system/skyward-watchdog.service", "permissions": "0644", "content": _UNIT},
        ]
        if cloud == "gcp" and self_delete not in files:
            files.append(self_delete)
        run += [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", "skyward-watchdog.service"]]
    if deadline and cloud == "aws":
        run.append(_DEADLINE.format(deadline=deadline))
    login: dict[str, object] = {"ssh_authorized_keys": [plan.ssh_public_key]}
    if proprietary_driver:
        # Last: the watchdog runs and the disks are mounted whatever the driver does.
        files += [
            {"path": "/usr/local/sbin/skyward-nvidia-driver", "permissions": "0755", "content": nvidia_driver_script()},
            {"path": CLIENT_KEY, "permissions": "0644", "content": plan.ssh_public_key + "\n"},
        ]
        run.append(["/usr/local/sbin/skyward-nvidia-driver", plan.ssh_user, CLIENT_KEY])
        login = {}
    doc: dict[str, object] = {
        # Replace the image's host keys with the one the client generated and expects.
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "ssh_keys": {"ed25519_private": node.host_key_private, "ed25519_public": node.host_key},
        "users": ["default", {
            "name": plan.ssh_user, "groups": ["sudo"], "shell": "/bin/bash",
            "sudo": "ALL=(ALL) NOPASSWD:ALL", **login,
        }],
        "write_files": files,
        "runcmd": run,
    }
    return "#cloud-config\n" + json.dumps(doc, indent=1) + "\n"


def watchdog_script(plan: PoolPlan, cloud: str, *, tpu: bool = False) -> str:
    """The TTL watchdog; ``tpu``: the node is a TPU VM, which retries its delete for ever and
    never powers off (a stopped TPU bills on)."""
    deadline = int(plan.expires) if plan.expires is not None else 0
    return _WATCHDOG.format(ttl=int(plan.ttl), grace=int(plan.grace), deadline=deadline, cloud=cloud,
                            tpu=int(tpu))


def startup_script(plan: PoolPlan, tpu_node: tuple[str, str]) -> str:
    """The ``startup-script`` of a TPU VM: the watchdog again, for the runtime images where
    cloud-init does not run the user data (the guest agent runs this on every boot). It installs
    the watchdog and its self-delete (each file replaced whole, and only when it differs) and
    starts it unless it runs already; nothing in it is secret. ``SKYWARD_ROOT`` prefixes every
    path (the tests run it for real)."""
    deadline = int(plan.expires) if plan.expires is not None else 0
    if not (plan.ttl > 0 or deadline):
        return "#!/bin/bash\n# skyward: no TTL and no max_duration: no watchdog\n"
    parts = ["#!/bin/bash", "# skyward: the TTL watchdog of this TPU VM (also in its user-data)",
             'root=${SKYWARD_ROOT:-}', 'mkdir -p "$root/usr/local/sbin" "$root/etc/systemd/system"',
             'put() { if ! cmp -s "$2" "$root$1"; then install -m "$3" "$2" "$root$1.new" && mv -f "$root$1.new" "$root$1"; fi; rm -f "$2"; }']
    for path, mode, content in (
        ("/usr/local/sbin/skyward-watchdog", "0755", watchdog_script(plan, "gcp", tpu=True)),
        ("/usr/local/sbin/skyward-self-delete", "0755", self_delete_script(plan, tpu_node)),
        ("/etc/systemd/system/skyward-watchdog.service", "0644", _UNIT),
    ):
        parts += ['tmp=$(mktemp)', "cat > \"$tmp\" <<'SKYWARD_END_OF_FILE'", content.rstrip("\n"),
                  "SKYWARD_END_OF_FILE", f'put {path} "$tmp" {mode}']
    parts += ["if ! systemctl is-active --quiet skyward-watchdog.service; then",
              "  systemctl daemon-reload; systemctl enable --now skyward-watchdog.service",
              "fi", ""]
    return "\n".join(parts)


def self_delete_script(plan: PoolPlan, tpu_node: tuple[str, str] | None = None) -> str:
    return _SELF_DELETE.format(disks=json.dumps([f"disk-{j}" for j in range(len(plan.disks))]),
                               tpu=repr(list(tpu_node)) if tpu_node else "None")


def nvidia_driver_script(branch: str = NVIDIA_BRANCH) -> str:
    return _NVIDIA.format(branch=branch)


CLIENT_KEY = "/usr/local/share/skyward/client-key.pub"


def ebs_name_script() -> str:
    return _EBS_NAME


def disk_script() -> str:
    return _DISK
