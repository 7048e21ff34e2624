"""`skyward notebook` and `skyward ssh-config` on a Local pool: JupyterLab runs in the
node's folder with the pool's environment, behind this command's local port; `--open` gives the
browser a 0600 page with a one-time code, never the token; Ctrl-C stops the server; a Local
pool has no sshd, and ssh-config says so."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("jupyterlab")
httpx = pytest.importorskip("httpx")

from .conftest import CLI  # noqa: E402
from .dashboard_helpers import wait_for  # noqa: E402
from .notebook_helpers import notebook  # noqa: E402

pytestmark = pytest.mark.timeout(300)
TOML = """
[pools.demo]
provider = "local"
nodes = 2
ttl = 300

[pools.demo.image]
env = { GREETING = "hello from the pool" }
"""




def answers(url: str) -> bool:
    host, port = url.split("//")[1].split("/")[0].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return False
    return True


def server_pids(root: str) -> list[int]:
    """Notebook server processes started for the node folder ``root``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a == f"--ServerApp.root_dir={root}".encode() for a in argv):
                found.append(int(entry))
    return found


def test_notebook_on_a_local_node_serves_its_folder_and_stops_on_ctrl_c(cli: CLI) -> None:
    cli.toml(TOML)
    assert cli("up", "demo", "--console", "silent").code == 0
    with notebook(cli, "demo", "--node", "1") as (proc, shown):
        url = shown["url"]
        base, token = url.split("/lab?token=")
        assert base.startswith("http://127.0.0.1:") and shown["node"] == 1
        assert shown["cwd"].endswith("node-1")  # the node's own folder, where its tasks run
        (Path(shown["cwd"]) / "data.csv").write_text("x\n1\n")
        auth = {"Authorization": f"token {token}"}
        assert httpx.get(url, timeout=30).status_code == 200
        assert httpx.get(base + "/api/contents", timeout=30).status_code == 403  # the token is needed
        listing = httpx.get(base + "/api/contents", headers=auth, timeout=30).json()
        assert "data.csv" in {f["name"] for f in listing["content"]}  # the node's folder
        # The server runs with the pool's environment: a terminal-free look at it, its process.
        (pid,) = server_pids(shown["cwd"])
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"GREETING=hello from the pool" in environ
        assert not any(token.encode() in a for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert proc.stderr is not None and "stopped" in proc.stderr.read()
    assert not server_pids(shown["cwd"]) and not answers(url)
    trail = cli("history", "demo", "--json").json()
    assert any(e["event"] == "notebook" and e["node"] == 1 and e["server"] == "jupyter" for e in trail)


def test_open_gives_the_browser_a_one_time_code_never_the_token(cli: CLI, tmp_path: Path) -> None:
    cli.toml(TOML)
    assert cli("up", "demo", "--console", "silent").code == 0
    opened = tmp_path / "argv.json"
    opener = tmp_path / "browser"
    opener.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(opened)!r}, 'w').write(json.dumps(sys.argv))\n")
    opener.chmod(0o755)
    cli.env["BROWSER"] = str(opener)  # what webbrowser.open runs, with the URL as its argument
    with notebook(cli, "demo", "--open") as (_proc, shown):
        base, token = shown["url"].split("/lab?token=")
        argv = json.loads(wait_for(lambda: opened.exists() and opened.read_text(), 60, "the browser to be opened"))
        assert not any(token in a for a in argv) and argv[-1].startswith("file://"), argv
        page = Path(argv[-1].removeprefix("file://"))
        assert page.stat().st_mode & 0o077 == 0 and token not in page.read_text()
        import re

        action = re.search(r'action="([^"]+)"', page.read_text())
        code = re.search(r'name="code" value="([^"]+)"', page.read_text())
        assert action and code and action[1] == base + "/.skyward/login"
        r = httpx.post(action[1], data={"code": code[1]}, timeout=30)
        assert r.status_code == 200 and 'location.replace("/lab")' in r.text, r.text
        assert token not in r.text
        # The browser now holds the server's own session cookie: the API answers it.
        with httpx.Client(cookies=r.cookies, timeout=30) as browser:
            assert browser.get(base + "/api/contents").status_code == 200
        assert httpx.post(action[1], data={"code": code[1]}, timeout=30).status_code == 401  # once
        assert httpx.post(action[1], data={"code": token}, timeout=30).status_code == 401  # codes only


def test_ssh_config_says_a_local_node_has_no_sshd(cli: CLI) -> None:
    cli.toml(TOML)
    up = cli("up", "demo", "--console", "silent")
    assert up.code == 0 and "Include" not in up.out  # nothing to include for a Local pool
    said = cli("ssh-config", "demo")
    assert said.code == 2 and "no sshd" in said.err and "skyward ssh demo" in said.err, said
    assert not (cli.home / "ssh" / "pools" / "demo.conf").exists()


def test_the_server_listens_on_the_private_address_only_where_the_provider_says_so() -> None:
    from skyward.named.notebook import _serves_on_private_ip

    # Slurm's streams come through the login node, which never reaches a node's loopback.
    assert [_serves_on_private_ip({"provider": kind}) for kind in ("slurm", "local", "ssh", "container", "aws")] \
        == [True, False, False, False, False]
    assert _serves_on_private_ip({"provider": "a-provider-of-another-version"}) is False
    assert _serves_on_private_ip({}) is False
