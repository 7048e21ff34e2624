"""Another user of an SSH host who made ``/var/tmp/skyward-<uid>`` first moves nothing: the
node's folder is still a private one on local disk and its agent still listens on a Unix
socket, on a host with an EC2-style long name too (where a folder in the home had a socket path
too long for one, and the agent took a loopback port that user could flood)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from helpers import running_description
from sshhosts import SSHHost

import skyward as sky

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)
LONG_NAME = "ip-172-31-45-123-skyward-node-with-a-long-name.eu-west-3.compute.internal"[:63]


def on_host(host: SSHHost, command: str) -> str:
    argv = [*host.ssh_argv("/dev/null", strict="no"), command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


@sky.function
def answer() -> int:
    return 42


def test_a_folder_another_user_made_first_moves_neither_the_folder_nor_the_socket(ssh_hosts: Any) -> None:
    from skyward.core.pool import Pool

    host = ssh_hosts(1, mode="netns")[0]  # its own /var/tmp, host name and users' view
    on_host(host, f"hostname {LONG_NAME} && setpriv --reuid=65534 --regid=65534 --clear-groups "
                  "mkdir -m 777 /var/tmp/skyward-$(id -u)")
    ssh = sky.SSH(hosts=[sky.SSHHost(address=host.address, port=host.port, user=host.user, key=str(host.key_path))])
    spec = sky.Spec(provider=ssh, nodes=1)
    description = running_description(ssh, spec, "moved61")
    try:
        node = description["nodes"][0]
        pool = Pool(spec, QUIET, sky.Worker(), cluster=ssh.attach(description))
        try:
            assert answer() >> pool == 42
        finally:
            pool.close()
    finally:
        ssh.destroy(description)
    uid = on_host(host, "id -u").strip()
    run = node["pool_dir"].rsplit("/pools/", 1)[0]
    assert run.startswith(f"/var/tmp/skyward-{uid}."), node  # not the stranger's, not the home
    assert node["agent_socket"] and node["agent_port"] is None, node  # no loopback TCP port
    assert on_host(host, f"stat -c '%u %a %F' {run}").split() == [uid, "700", "directory"]
    assert on_host(host, "stat -c %u /var/tmp/skyward-$(id -u)").strip() == "65534"  # theirs, untouched
