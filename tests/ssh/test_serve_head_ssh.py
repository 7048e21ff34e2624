"""pool.serve(app, on="head") on real sshd hosts (tests/sshhosts.py): the router runs on the head
node, on its private address, and a client in another host's network namespace calls the app."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest
from serve import checks
from sshhosts import SSHHost, SSHHosts

import skyward as sky

pytestmark = pytest.mark.timeout(600)
QUIET = sky.Options(console=False)


def provider(hosts: list[SSHHost]) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts])

ASK = """
import json, sys, urllib.request, urllib.error
from concurrent.futures import ThreadPoolExecutor
def ask(x):
    req = urllib.request.Request(sys.argv[1] + "/predict", data=json.dumps({"x": x}).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **json.loads(sys.argv[2])})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
with ThreadPoolExecutor(8) as ex:
    print(json.dumps(list(ex.map(ask, range(int(sys.argv[3]))))))
"""


def ask_from(host: SSHHost, url: str, headers: dict[str, str], n: int) -> list[tuple[int, str]]:
    """``n`` POST /predict (8 at a time) from ``host`` (its own network namespace on netns hosts),
    with its python3: [(status, body)] in order."""
    command = " ".join(shlex.quote(a) for a in ("python3", "-c", ASK, url, json.dumps(headers), str(n)))
    argv = [*host.ssh_argv("/dev/null", strict="no"), command]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout
    return [(int(status), body) for status, body in json.loads(out)]


def test_a_client_on_another_host_reaches_the_head_nodes_router_with_the_token(three_hosts: SSHHosts) -> None:
    head, other, outsider = list(three_hosts)
    image = sky.Image(pip=[*checks.PIP, "httptools"], includes=[str(checks.APPS)])
    with sky.Compute(provider=provider([head, other]), nodes=2, image=image, worker=sky.Worker(concurrency=2),
                     options=QUIET) as pool, pool.serve("apps:app", on="head", ready="/health") as endpoint:
        endpoint.wait_ready(timeout=300)
        assert endpoint.url.startswith(f"http://{head.address}:"), endpoint.url
        answers = ask_from(outsider, endpoint.url, endpoint.headers, 200)
        assert [status for status, _ in answers] == [200] * 200, answers[:3]
        bodies = [json.loads(body) for _, body in answers]
        assert [b["y"] for b in bodies] == [2.0 * x + 1 for x in range(200)]
        assert all(b["auth"] is None for b in bodies)  # the token stops at the replica's check
        # the other node's replica too, reached from the head (a netns host has a pid namespace of its
        # own, so two hosts' replicas can have the same pid: the host name tells them apart)
        assert len({(b["host"], b["pid"]) for b in bodies}) == 2
        [(status, body)] = ask_from(outsider, endpoint.url, {}, 1)
        assert status == 401 and "pid" not in body
