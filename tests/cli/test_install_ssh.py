"""`skyward install`, `logs -f` and `events` of a named pool on real sshd hosts.
The hosts have no route out: the packages reach them as wheels this machine builds
(the pool's wheelhouse), as at their bootstrap. A host whose install fails is named with the
end of its output, the host done is said, and nothing is recorded until every node has them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshhosts import SSHHosts

from .conftest import CLI
from .ssh_helpers import netns_hosts, on_host
from .test_logs_follow import Follower
from .wheelindex import WheelIndex

PROBE = """
    import json
    import skyward as sky

    @sky.function
    def versions():
        import socket, skylive, skylivedep
        return [socket.gethostname(), skylive.VERSION, skylivedep.VERSION, skylive.__file__]

    with sky.Compute(name="lab", options=sky.Options(console="silent")) as pool:
        print(json.dumps(versions() @ pool))
"""


@pytest.fixture
def hosts() -> Iterator[SSHHosts]:
    with netns_hosts(2) as made:
        yield made


@pytest.mark.timeout(480)
def test_install_logs_and_events_on_ssh_hosts(cli: CLI, hosts: SSHHosts, tmp_path: Path) -> None:
    index = WheelIndex(tmp_path / "index")
    index.publish("skylivedep", "1.0")
    index.publish("skylivedep", "2.0")
    index.publish("skylive", "1.0", "skylivedep>=1")
    index.publish("skylive", "2.0", "skylivedep>=2")
    targets = json.dumps([f"{h.user}@{h.address}:{h.port}" for h in hosts])
    cli.toml(f'[pools.lab]\nprovider = "ssh"\nnodes = 2\nttl = 300\n\n'
             f'[pools.lab.image]\npip = ["skylivedep==1.0"]\n'
             f'pip_indexes = [{{ url = "{index.url}", packages = ["skylive", "skylivedep"] }}]\n\n'
             f'[pools.lab.ssh]\nhosts = {targets}\nkey = "{hosts[0].key_path}"\n')
    up = cli("up", "lab", timeout=240)
    assert up.code == 0, up
    nodes = cli.record("lab")["cluster"]["nodes"]
    pool_id = cli.record("lab")["id"]

    # Host 1's uv breaks: the install fails there, with what it said; host 0 has the packages.
    uv = f"{nodes[1]['home']}/bin/uv"
    on_host(hosts[1], f"mv {uv} {uv}.real && printf '#!/bin/sh\\necho disk quota exceeded >&2\\nexit 2\\n' > {uv}"
                      f" && chmod +x {uv}")
    failed = cli("install", "lab", "skylive", timeout=180)
    assert failed.code == 1, failed
    assert f"installing on node 1 ({hosts[1].name}) failed (exit code 2)" in failed.err, failed
    assert "disk quota exceeded" in failed.err and "done on: node 0; failed on: node 1" in failed.err, failed
    record = cli("history", pool_id, "--json").json()
    assert "skylive" not in {p["name"] for p in record["lock"]["packages"]}  # not on every node: not recorded

    # Fixed, again: every node has the same versions (the pool's skylivedep 1.0 kept).
    on_host(hosts[1], f"mv {uv}.real {uv}")
    done = cli("install", "lab", "skylive", timeout=180)
    assert done.code == 0, done
    assert "skylive==1.0" in done.out and "skylivedep==1.0" in done.out, done
    probe = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE)], cwd=cli.cwd, env=cli.env,
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert [s[0] for s in seen] == [h.name for h in hosts]
    assert all(s[1:3] == ["1.0", "1.0"] and "/site/skylive/" in s[3] for s in seen), seen
    record = cli("history", pool_id, "--json").json()
    assert {p["name"]: p["version"] for p in record["lock"]["packages"]}["skylive"] == "1.0"
    # A node the pool gets later (a resize, a replacement) is bootstrapped with them.
    assert "skylive" in {p["name"] for p in cli.record("lab")["cluster"]["pin"]}

    # logs -f reads each host's agent log through its agent.
    follower = Follower(cli, "lab", "-f", "--lines", "1")
    try:
        follower.wait_for(lambda out: {line.split(" ")[1] for line in out} == {"0", "1"}, timeout=60)
        assert cli("exec", "lab", "--", "echo \"followed on $(hostname)\" >> agent.log").code == 0
        follower.wait_for(lambda out: sum("followed on" in line for line in out) == 2, timeout=30)
        for rank, h in enumerate(hosts):
            assert f"[node {rank} {h.name}] followed on {h.name}" in follower.out, follower.out
        assert follower.interrupt() == 0
    finally:
        follower.kill()

    events = cli("events", "lab")
    assert events.code == 0, events
    assert "node 1: deps done" in events.out or "node 1: deps skipped" in events.out, events.out
    assert "install failed by" in events.out and "installed by" in events.out, events.out
    assert cli("down", "lab", timeout=120).code == 0
