"""A Slurm node's folder of a pool (``$RUN/pools/<pool>-<node>``) whose job step was killed
outright, its script, agent and workers alike, is removed by the next pool's agent on that node;
the folder of a pool that still runs there stays."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
import time

import pytest

import skyward as sky

from .conftest import Site

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


@sky.function
def where() -> tuple[str, str, int]:
    import os
    import socket

    return socket.gethostname(), os.path.dirname(os.environ["SKYWARD_SITE"]), os.getppid()


def on_node(pid: int, command: str) -> str:
    """``command`` (sh) inside a compute host's mount and pid namespaces, as root."""
    return subprocess.run(["nsenter", "-t", str(pid), "-p", "-m", "--", "sh", "-c", command],
                          capture_output=True, text=True, timeout=60, check=True).stdout


def exists(pid: int, path: str) -> bool:
    return on_node(pid, f"[ -e {shlex.quote(path)} ] && echo yes || echo no").strip() == "yes"


CLIENT = textwrap.dedent("""
    import json, os, sys, time
    import skyward as sky
    args = json.loads(sys.argv[1])
    provider = sky.Slurm(args["login"], key=args["key"], known_hosts=args["known_hosts"], options=args["options"])

    @sky.function
    def where():
        import socket
        return socket.gethostname(), os.path.dirname(os.environ["SKYWARD_SITE"]), os.getppid()

    with sky.Compute(provider=provider, nodes=1, options=sky.Options(console=False)) as pool:
        print(json.dumps(pool.run(where())), flush=True)
        time.sleep(600)
""")


def test_a_killed_node_folder_is_swept_by_the_next_pool_on_that_node(site: Site) -> None:
    # One CPU a job (a pool's job takes a whole node by default): three pools on one node.
    with sky.Compute(provider=site.provider(options=["--cpus-per-task=1"]), nodes=1, options=QUIET) as live:
        node, live_folder, _ = live.run(where())
        host = next(h for h in site.compute if h.name == node)
        pinned = ["--cpus-per-task=1", f"--nodelist={node}"]
        args = {"login": f"{site.login.user}@{site.login.address}", "key": str(site.hosts.client_key),
                "known_hosts": site.known_hosts, "options": pinned}
        client = subprocess.Popen([sys.executable, "-c", CLIENT, json.dumps(args)], stdout=subprocess.PIPE, text=True)
        try:
            assert client.stdout is not None
            line = client.stdout.readline()
            assert line, f"the client ended without its pool (exit {client.poll()})"
            dead_node, folder, agent = json.loads(line)
            assert dead_node == node
            client.kill()  # the client first: it would replace the node
            client.wait()
            q = shlex.quote(folder)
            # Every process holding the folder's lock (the step's script first: its pid is lower,
            # and it would remove the folder once the agent is gone), and the agent's workers.
            kill = (f"for p in /proc/[0-9]*; do n=${{p#/proc/}}; if ls -l $p/fd 2>/dev/null | grep -qF -- {q}/ "
                    f"|| [ \"$(cut -d' ' -f4 $p/stat 2>/dev/null)\" = {agent} ]; then kill -KILL $n; fi; done\n"
                    f"flock -x -n {q}/.owner.lock true && echo free || echo held\n")
            deadline = time.monotonic() + 60
            while on_node(host.pid, kill).strip() != "free":
                assert time.monotonic() < deadline, f"the processes of {folder} did not go"
                time.sleep(0.5)
        finally:
            if client.poll() is None:
                client.kill()
            client.wait()
        pool_id = folder.rsplit("/", 1)[1].rsplit("-", 1)[0]
        site.cluster.run(["scancel", "-n", f"skyward-{pool_id}"], check=False)  # its CPU, for the next
        assert exists(host.pid, folder), "nobody was left to remove it"
        with sky.Compute(provider=site.provider(options=pinned), nodes=1, options=QUIET) as nxt:
            nxt_node, mine, _ = nxt.run(where())
            assert nxt_node == node
            assert not exists(host.pid, folder), "the killed pool's folder was not swept"
            assert exists(host.pid, live_folder) and exists(host.pid, mine), "a live pool's folder was swept"
            assert live.run(where())[1] == live_folder
    site.cluster.wait_idle()
