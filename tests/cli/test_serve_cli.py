"""`skyward serve` on a Local named pool, with real processes: the command serves a Starlette
app from the pool's nodes and prints the URL and the header; requests go through; `skyward ls`
shows the endpoint; `--update` rolls the running server to a factory; SIGTERM stops serving and
leaves the pool up; an asleep pool is woken by a request and sleeps again when idle; and the mistakes (no app anywhere, --update with no server) say what to do."""

from __future__ import annotations

import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from .conftest import CLI  # noqa: E402
from .dashboard_helpers import wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(300)
APPS = Path(__file__).resolve().parents[1] / "serve" / "apps.py"
TOML = """
[pools.demo]
provider = "local"
nodes = 2
ttl = 300
"""


@contextmanager
def serving(cli: CLI, *args: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, str], Path]]:
    """`skyward serve ARGS` in the background: the process, what its announcement said (url,
    header) and its stderr's file. Stopped (SIGTERM, then SIGKILL) and waited for on the way out."""
    log = cli.cwd.parent / "serve.err"
    with log.open("w") as errors:
        proc = subprocess.Popen([sys.executable, "-m", "skyward", "serve", *args], cwd=cli.cwd, env=cli.env,
                                stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        said: dict[str, str] = {}
        assert proc.stdout is not None
        while "header" not in said:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"`skyward serve` ended (exit {proc.wait(30)}) before it printed its URL:\n"
                            f"{log.read_text()}")
            key, _, value = line.strip().partition(":")
            if key in ("url", "header"):
                said[key] = value.strip()
        yield proc, said, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_serve_a_named_pool_update_it_and_stop_it_leaving_the_pool_up(cli: CLI) -> None:
    cli.toml(TOML)
    shutil.copy(APPS, cli.cwd / "webapp.py")  # the app, importable from the project folder
    assert (up := cli("up", "demo")).code == 0, up
    with serving(cli, "demo", "webapp:app", "--port", "0", "--ready", "/health") as (proc, said, log):
        url, header = said["url"], said["header"]
        assert url.startswith("http://127.0.0.1:") and header.startswith("Authorization: Bearer ")
        name, _, value = header.partition(": ")
        headers = {name: value}
        token = value.removeprefix("Bearer ")
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            answers = [client.post("/predict", json={"x": x}) for x in range(20)]
            assert [r.status_code for r in answers] == [200] * 20, answers[-1].text
            assert [r.json()["y"] for r in answers] == [2.0 * x + 1 for x in range(20)]
            assert httpx.get(url + "/whoami", timeout=30).status_code == 401  # no header, no answer
            assert client.get("/whoami").json()["version"] == 1

            # `skyward ls` shows the endpoint, its replicas and its rate; never the token.
            # (the status file's counts are written about once a second: wait for all 21 requests)
            wait_for(lambda: ((s := cli("ls", "--json").json()[0].get("serving") or {}).get("ready") == 2
                              and s.get("requests", 0) >= 21), 60, "ls showing 2 replicas ready and 21 requests")
            (row,) = cli("ls", "--json").json()
            assert row["serving"]["url"] == url and row["serving"]["app"] == "webapp:app"
            assert row["serving"]["pid"] == proc.pid and row["serving"]["requests"] >= 21
            table = cli("ls")
            assert "SERVED" in table.out and url in table.out and "2/2" in table.out, table
            status = cli.home / "registry" / "demo.serve"
            assert stat.S_IMODE(status.stat().st_mode) == 0o600
            assert token not in status.read_text() and token not in table.out + str(row)

            # One server per pool: a second says who serves it.
            second = cli("serve", "demo", "webapp:app", "--port", "0")
            assert second.code == 1 and f"already being served by pid {proc.pid}" in second.err, second

            # Roll to the factory; requests keep working and the new version answers.
            rolled = cli("serve", "demo", "webapp:make_app_v2", "--factory", "--update", timeout=180)
            assert rolled.code == 0, rolled
            assert "now serves 'webapp:make_app_v2': 2 replica(s) ready" in rolled.out, rolled
            assert client.get("/whoami").json()["version"] == 2
            wait_for(lambda: cli("ls", "--json").json()[0]["serving"]["app"] == "webapp:make_app_v2", 30,
                     "ls showing the new app")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
        assert "pool 'demo' stays up" in log.read_text()
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/whoami", timeout=5)
    assert not (cli.home / "registry" / "demo.serve").exists()
    (row,) = cli("ls", "--json").json()
    assert row["state"] == "running" and row["serving"] is None and row["clients"] == 0
    ran = cli("exec", "demo", "--", "true")  # the pool's nodes still answer
    assert ran.code == 0, ran

    trail = [e for e in cli("history", "demo", "--json").json()
             if e["event"] in ("served", "serve updated", "serve stopped")]
    assert [e["event"] for e in trail] == ["served", "serve updated", "serve stopped"]
    assert all(e["url"] == url and "@" in e["who"] for e in trail)
    assert [e["app"] for e in trail] == ["webapp:app", "webapp:make_app_v2", "webapp:make_app_v2"]
    assert token not in (cli.home / "audit" / "demo.jsonl").read_text()
    assert (down := cli("down", "demo")).code == 0, down


def test_serve_without_an_app_anywhere_says_how_to_name_one(cli: CLI) -> None:
    cli.toml(TOML)
    bare = cli("serve", "demo")
    assert bare.code == 2, bare
    assert "no app to serve" in bare.err and "[pools.demo.serve]" in bare.err and 'app = "module:app"' in bare.err
    wrong = cli("serve", "demo", "webapp")
    assert wrong.code == 2 and "'module:attribute'" in wrong.err, wrong


def test_update_with_no_serve_running_says_so_and_takes_the_app_from_skyward_toml(cli: CLI) -> None:
    cli.toml(TOML + '\n[pools.demo.serve]\napp = "webapp:app"\nport = 0\n')
    assert (up := cli("up", "demo")).code == 0, up
    result = cli("serve", "demo", "--update")
    assert result.code == 1, result
    assert "no `skyward serve demo` runs" in result.err and "`skyward serve demo webapp:app`" in result.err
    assert not list((cli.home / "registry").glob("demo.serve-update.*"))  # no request left behind
    bad = cli.toml(TOML + '\n[pools.demo.serve]\napp = "webapp:app"\nport = 99999\n')
    wrong = cli("serve", "demo")
    assert wrong.code == 2 and f"{bad}: [pools.demo] serve.port = 99999" in wrong.err, wrong
    assert (down := cli("down", "demo")).code == 0, down


def test_down_of_the_served_pool_ends_the_serve_command(cli: CLI) -> None:
    shutil.copy(APPS, cli.cwd / "webapp.py")
    assert (up := cli("up", "demo", "--provider", "local", "--nodes", "1")).code == 0, up
    with serving(cli, "demo", "webapp:app", "--port", "0") as (proc, _said, log):
        wait_for(lambda: "ready: 1 replica(s)" in log.read_text(), 120, "the replica ready")
        assert (down := cli("down", "demo", "--force")).code == 0, down
        assert proc.wait(60) == 1, log.read_text()
        assert "pool 'demo' was closed" in log.read_text()
    assert not (cli.home / "registry" / "demo.serve").exists()
    assert cli("ls", "--json").json() == []


def test_serving_an_asleep_pool_wakes_it_on_a_request_and_lets_it_sleep_when_idle(cli: CLI) -> None:
    shutil.copy(APPS, cli.cwd / "webapp.py")
    assert (up := cli("up", "nap", "--provider", "local", "--nodes", "0:2", "--ttl", "300")).code == 0, up
    assert cli.record("nap")["cluster"]["nodes"] == []
    with serving(cli, "nap", "webapp:app", "--port", "0", "--idle-timeout", "3") as (proc, said, log):
        wait_for(lambda: "the first request wakes it" in log.read_text(), 30, "the command saying so")
        assert cli.record("nap")["cluster"]["nodes"] == [], "serving alone must not wake the pool"
        assert cli("ls", "--json").json()[0]["state"] == "asleep"
        name, _, value = said["header"].partition(": ")
        with httpx.Client(base_url=said["url"], headers={name: value}, timeout=120) as client:
            began = time.monotonic()
            first = client.get("/whoami")
            cold = time.monotonic() - began
            print(f"\ncold start of an asleep Local named pool (request sent -> answer): {cold:.2f} s")
            assert first.status_code == 200 and first.json()["version"] == 1, first.text
            assert len(cli.record("nap")["cluster"]["nodes"]) == 1
            assert "pool 'nap' woke for a request: 1 node(s)" in log.read_text()

            # Idle for --idle-timeout: the replica is drained and stopped, then the node; asleep again.
            wait_for(lambda: "had no request for" in log.read_text(), 60, "the pool to sleep when idle")
            wait_for(lambda: cli.record("nap")["cluster"]["nodes"] == [], 30, "the record with no node")
            assert cli("ls", "--json").json()[0]["state"] == "asleep"
            assert proc.poll() is None and " lost" not in log.read_text(), log.read_text()

            second = client.get("/whoami")  # wakes it again: a new node, a new replica
            assert second.status_code == 200 and second.json()["pid"] != first.json()["pid"], second.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()

    record = cli.record("nap")  # the last client out put it to sleep at once
    assert record["cluster"]["nodes"] == [] and record["asleep_since"], record
    trail = cli("history", "nap", "--json").json()
    (attached,) = [e for e in trail if e["event"] == "attached"]
    assert attached["by"] == "skyward serve"
    wakes = [e for e in trail if e["event"] == "woke"]
    assert len(wakes) == 2 and all(e["by"] == attached["client"] for e in wakes), trail
    assert [e["event"] for e in trail if e["event"] in ("woke", "asleep")] == ["woke", "asleep"] * 2
    assert (down := cli("down", "nap")).code == 0, down


def _listener_pid(port: int) -> int | None:
    """The pid of the process listening on this TCP port (ss -ltnp), or None."""
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=False).stdout
    found = [int(part.split("=")[1].rstrip(",)")) for part in out.replace(",", " ").split() if part.startswith("pid=")]
    return found[0] if found else None


def test_serve_on_the_head_node_and_the_flags_that_do_not_go_with_it(cli: CLI) -> None:
    cli.toml(TOML)
    shutil.copy(APPS, cli.cwd / "webapp.py")
    # What cannot go together is refused before the pool is touched.
    loose = cli("serve", "demo", "webapp:app", "--allow-from", "10.0.0.0/8")
    assert loose.code == 2 and "Add --on head and a fixed --port" in loose.err, loose
    here = cli("serve", "demo", "webapp:app", "--on", "head", "--host", "0.0.0.0")
    assert here.code == 2 and "Drop --host" in here.err, here
    cli.toml(TOML + '\n[pools.demo.serve]\napp = "webapp:app"\non = "head"\nhost = "0.0.0.0"\n')
    tabled = cli("serve", "demo")  # the same rules for skyward.toml's [pools.NAME.serve]
    assert tabled.code == 2 and "Drop --host" in tabled.err, tabled
    cli.toml(TOML + '\n[pools.demo.serve]\napp = "webapp:app"\non = "sideways"\n')
    assert cli("serve", "demo").code == 2
    cli.toml(TOML)

    assert (up := cli("up", "demo")).code == 0, up
    # The head's router holds a task slot of its own: a node of one slot cannot also run a replica.
    tight = cli("serve", "demo", "webapp:app", "--on", "head", "--port", "0")
    assert tight.code == 2 and "concurrency = 2` in [pools.demo.worker]" in tight.err, tight
    assert (down := cli("down", "demo")).code == 0, down
    cli.toml(TOML + "\n[pools.demo.worker]\nconcurrency = 2\n")
    assert (up := cli("up", "demo")).code == 0, up
    with serving(cli, "demo", "webapp:app", "--on", "head", "--port", "0", "--ready", "/health") as (proc, said, log):
        url = said["url"]
        port = int(url.rsplit(":", 1)[1])
        owner = _listener_pid(port)
        assert owner is not None and owner != proc.pid, f"the router must run on the head node, not in {proc.pid}"
        name, _, value = said["header"].partition(": ")
        with httpx.Client(base_url=url, headers={name: value}, timeout=120) as client:
            answers = [client.post("/predict", json={"x": x}) for x in range(5)]
            assert [r.status_code for r in answers] == [200] * 5, answers[-1].text
        assert httpx.get(url + "/whoami", timeout=30).status_code == 401  # the token is still required
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    assert _listener_pid(port) is None  # the head's router stopped with the command

    # A Local pool has no firewall to open: said, not promised.
    walled = cli("serve", "demo", "webapp:app", "--on", "head", "--port", "8000", "--allow-from", "10.0.0.0/8")
    assert walled.code == 2 and "manages no firewall" in walled.err, walled
    assert (down := cli("down", "demo")).code == 0, down
