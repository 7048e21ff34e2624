"""Who may use a Local pool's endpoint: another user of this machine gets 401 and nothing about
the replicas, and cannot reach a replica's socket past the router; the owner, with the
endpoint's headers, is served."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import httpx
import pytest

import skyward as sky

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                 reason="running as another user needs root and setpriv")]
QUIET = sky.Options(console=False)
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"  # one the other user can run

# What the other user runs: the request, with or without a token, and what came back.
ASK = r"""
import json, socket, sys, urllib.error, urllib.request
url, token, sockets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token} if token else {})
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        status, headers, body = r.status, dict(r.headers), r.read().decode()
except urllib.error.HTTPError as e:
    status, headers, body = e.code, dict(e.headers), e.read().decode()
reached = []
for path in sockets:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
        reached.append(path)
    except OSError:
        pass
print(json.dumps({"status": status, "headers": headers, "body": body, "reached": reached}))
"""


def replica_sockets() -> list[str]:
    """The Unix sockets replicas listen on now (every user can read this list, not open them)."""
    with open("/proc/net/unix") as f:
        return sorted({line.split()[-1] for line in f if "skyward-serve-" in line and line.split()[-1].startswith("/")})


def as_nobody(url: str, token: str, sockets: list[str]) -> dict:
    out = subprocess.run([*NOBODY, PYTHON, "-c", ASK, url, token, json.dumps(sockets)],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_another_user_gets_401_and_nothing_else_while_the_owner_is_served() -> None:
    with sky.Compute(nodes=2, options=QUIET) as pool, pool.serve("serve.apps:app") as endpoint:
        endpoint.wait_ready(timeout=120)
        sockets = replica_sockets()
        assert len(sockets) == 2, sockets
        url = endpoint.url + "/whoami"
        owner = httpx.get(url, headers=endpoint.headers, timeout=30)
        assert owner.status_code == 200 and "pid" in owner.json()
        for token in ("", "not-the-token", endpoint.token[:-1] + "x"):  # none, a guess, one character off
            got = as_nobody(url, token, sockets)
            assert got["status"] == 401, got
            text = got["body"] + json.dumps(got["headers"])
            assert "replica" not in text.lower() and "pid" not in text and "skyward-serve" not in text, got
            assert got["headers"].get("WWW-Authenticate") == "Bearer", got
            assert got["reached"] == [], f"another user opened a replica's socket: {got['reached']}"
        assert endpoint.stats().by_status.get(401) == 3
