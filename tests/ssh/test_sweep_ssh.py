"""A pool whose every process on an SSH host was SIGKILLed (its client, its agent, its workers)
leaves its node folder ($RUN/pools/<pool>-<node>); the next pool's agent on that host removes
it, and leaves alone the folders of pools that live and of named pools (``.kept``)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sshhosts import SSHHost, SSHHosts

import skyward as sky

pytestmark = pytest.mark.timeout(600)
QUIET = sky.Options(console=False)
ROOT = Path(__file__).resolve().parents[2]

# A client that opens two pools on the host (the second as a named pool's cluster is made:
# SSH.create given a name), prints where each node's folder is and its agent's pid, and waits.
CLIENT = r"""
import json, os, sys, time
import skyward as sky
from skyward.providers import ssh

host = json.loads(sys.argv[1])
named = []
plain_create = ssh.SSH.create

def create(self, *args, **kwargs):
    if named:
        kwargs["name"] = "kept"
    return plain_create(self, *args, **kwargs)

ssh.SSH.create = create

@sky.function
def where():
    return os.getppid(), os.path.dirname(os.environ["SKYWARD_SITE"])

quiet = sky.Options(console=False)
with sky.Compute(provider=sky.SSH(hosts=[sky.SSHHost(**host)]), nodes=1, options=quiet) as dead:
    a = dead.run(where())
    named.append(True)
    with sky.Compute(provider=sky.SSH(hosts=[sky.SSHHost(**host)]), nodes=1, options=quiet) as kept:
        n = kept.run(where())
        print(json.dumps([a, n]), flush=True)
        time.sleep(3600)
"""


def provider(host: SSHHost) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=host.address, port=host.port, user=host.user, key=str(host.key_path))])


def on_host(host: SSHHost, command: str) -> str:
    argv = [*host.ssh_argv("/dev/null", strict="no"), command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout


def exists(host: SSHHost, path: str) -> bool:
    return on_host(host, f"[ -e {shlex.quote(path)} ] && echo yes || echo no").strip() == "yes"


def kill_all(host: SSHHost, agent: int, folder: str) -> None:
    """SIGKILL the agent's session (its workers) and every process holding the folder's lock,
    until the lock is free (nothing of that pool is left on the host)."""
    q = shlex.quote(folder)
    script = (f"kill -KILL -- -{agent} {agent} 2>/dev/null\n"
              f"for p in /proc/[0-9]*; do ls -l $p/fd 2>/dev/null | grep -qF -- {q}/ && kill -KILL ${{p#/proc/}}; done\n"
              f"flock -x -n {q}/.owner.lock true && echo free || echo held\n")
    deadline = time.monotonic() + 60
    while on_host(host, script).strip() != "free":
        assert time.monotonic() < deadline, f"the processes of {folder} did not go"
        time.sleep(0.5)


@sky.function
def where() -> str:
    return os.path.dirname(os.environ["SKYWARD_SITE"])


def test_a_killed_pools_node_folder_is_swept_by_the_next_pool(ssh_hosts: Callable[..., SSHHosts]) -> None:
    host = ssh_hosts(1)[0]
    spec = {"address": host.address, "port": host.port, "user": host.user, "key": str(host.key_path)}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    client = subprocess.Popen([sys.executable, "-c", CLIENT, json.dumps(spec)], stdout=subprocess.PIPE,
                              text=True, env=env)
    named_folder = ""
    try:
        assert client.stdout is not None
        line = client.stdout.readline()
        assert line, f"the client ended without its pools (exit {client.poll()})"
        (dead_agent, dead), (named_agent, named_folder) = json.loads(line)
        with sky.Compute(provider=provider(host), nodes=1, options=QUIET) as live:
            live_folder = live.run(where())
            assert exists(host, f"{named_folder}/.kept") and not exists(host, f"{dead}/.kept")
            client.kill()  # the client first: it would start the agents again
            client.wait()
            kill_all(host, dead_agent, dead)
            kill_all(host, named_agent, named_folder)
            assert exists(host, dead) and exists(host, named_folder)  # nobody left to remove them
            with sky.Compute(provider=provider(host), nodes=1, options=QUIET) as nxt:
                mine = nxt.run(where())
                assert not exists(host, dead), "the killed pool's folder was not swept"
                assert exists(host, named_folder), "a named pool's folder was swept"
                assert exists(host, live_folder) and exists(host, mine), "a live pool's folder was swept"
                assert live.run(where()) == live_folder  # and that pool still works
    finally:
        if client.poll() is None:
            client.kill()
        client.wait()
        if named_folder:  # (a named pool's folders go with `skyward down`; this one had no registry)
            on_host(host, f"rm -rf {shlex.quote(named_folder)}")
