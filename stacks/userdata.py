"""The cloud-init user data every cloud node boots with (the same for AWS and GCP).

It does three things before the client ever connects:

* installs the node's host key, generated on the client (so the first SSH connection is
  already verified) and removes every other host key;
* formats and mounts the node's extra disks;
* starts a watchdog, the TTL safety net: if no skyward agent runs on the node for ``ttl``
  seconds (plus the bootstrap grace at first boot) the node powers itself off, which
  terminates it (AWS: instance_initiated_shutdown_behavior, GCP: the stack deletes it). The
  agent's own lease watchdog is the first line; this one covers a client that died before
  any agent started. ``ttl=0`` disables it.

cloud-config is YAML, and JSON is YAML: the document is written with json.dumps.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

from .plan import NodePlan, PoolPlan

_WATCHDOG = """#!/bin/bash
# skyward TTL safety net: power off when no skyward agent has run for TTL seconds.
ttl={ttl}; grace={grace}
start=$(date +%s); last=$start
while sleep 15; do
  now=$(date +%s)
  if pgrep -f 'skyward[.]bootstrap[.]agent' >/dev/null; then last=$now; fi
  limit=$ttl
  if [ "$last" -eq "$start" ]; then limit=$((ttl + grace)); fi
  if [ $((now - last)) -ge "$limit" ]; then
    logger -t skyward "no skyward agent for ${{limit}}s: powering off"
    systemctl poweroff || shutdown -h now
    exit 0
  fi
done
"""

_UNIT = """[Unit]
Description=skyward TTL safety net (powers the node off when no agent runs)
After=network-online.target

[Service]
ExecStart=/usr/local/sbin/skyward-watchdog
Restart=always

[Install]
WantedBy=multi-user.target
"""

_DISK = """#!/bin/bash
# Format (once) and mount one extra disk: the first of the candidate devices that appears.
set -eu
mount_point=$1; shift
for _ in $(seq 1 120); do
  for dev in "$@"; do
    if [ -b "$dev" ]; then
      dev=$(readlink -f "$dev")
      blkid "$dev" >/dev/null 2>&1 || mkfs.ext4 -q -F "$dev"
      mkdir -p "$mount_point"
      uuid=$(blkid -s UUID -o value "$dev")
      grep -q "$uuid" /etc/fstab || echo "UUID=$uuid $mount_point ext4 defaults,nofail 0 2" >> /etc/fstab
      mountpoint -q "$mount_point" || mount "$mount_point"
      chmod 1777 "$mount_point"
      exit 0
    fi
  done
  sleep 5
done
echo "skyward: no device for $mount_point among: $*" >&2
exit 1
"""


def cloud_config(plan: PoolPlan, node: NodePlan, disk_devices: Sequence[Sequence[str]] = ()) -> str:
    """User data for one node; ``disk_devices[j]`` lists where plan.disks[j] may appear."""
    files = [
        {"path": "/usr/local/sbin/skyward-disk", "permissions": "0755", "content": _DISK},
    ]
    run: list[str | list[str]] = []
    for disk, devices in zip(plan.disks, disk_devices, strict=True):
        run.append(["/usr/local/sbin/skyward-disk", disk.mount, *devices])
    if plan.ttl > 0:
        files += [
            {"path": "/usr/local/sbin/skyward-watchdog", "permissions": "0755",
             "content": _WATCHDOG.format(ttl=int(plan.ttl), grace=int(plan.grace))},
            {"path": "/etc/systemd/system/skyward-watchdog.service", "permissions": "0644", "content": _UNIT},
        ]
        run += [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", "skyward-watchdog.service"]]
    if plan.expires is not None:
        minutes = max(1, (plan.expires - plan.created) // 60)
        run.append(f"shutdown -P +{minutes} {shlex.quote('skyward: the pool reached its max_duration')}")
    doc = {
        # Replace the image's host keys with the one the client generated and expects.
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "ssh_keys": {"ed25519_private": node.host_key_private, "ed25519_public": node.host_key},
        "users": ["default", {
            "name": plan.ssh_user, "groups": ["sudo"], "shell": "/bin/bash",
            "sudo": "ALL=(ALL) NOPASSWD:ALL", "ssh_authorized_keys": [plan.ssh_public_key],
        }],
        "write_files": files,
        "runcmd": run,
    }
    return "#cloud-config\n" + json.dumps(doc, indent=1) + "\n"
