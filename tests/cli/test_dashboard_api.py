"""The dashboard's HTTP API against the real server (``skyward dashboard`` in a subprocess),
with real named Local pools and real programs: auth, the pool lifecycle, SSE, the hook."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import skyward as sky
from skyward.dashboard import hook
from skyward.observe import events as ev

from .conftest import CLI
from .dashboard_helpers import SECRET, TOML, dashboard, logged_in, program, wait_for


def _missing(cli: CLI, name: str) -> bool:
    return not (cli.home / "registry" / f"{name}.json").exists()


def test_every_request_needs_the_token(cli: CLI) -> None:
    with dashboard(cli) as d:
        for path in ("/api/pools", "/api/config", "/api/events", "/api/pools/demo", "/", "/config"):
            assert httpx.get(d.base + path).status_code == 401, path
            assert httpx.get(d.base + path, headers={"Authorization": "Bearer nope"}).status_code == 401, path
        assert httpx.delete(d.base + "/api/pools/demo").status_code == 401
        assert httpx.post(d.base + "/api/ingest/register", json={"id": "x"}).status_code == 401
        # The printed URL: the token starts a session (a cookie named after the port, a key the
        # page keeps in localStorage); the page goes on to the address without the token.
        r = httpx.get(d.url)
        assert r.status_code == 200 and 'location.replace("/")' in r.text and d.token not in r.text
        name, sid, key = logged_in(d, r)
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("samesite", "SameSite")
        assert sid != d.token and key != d.token
        with httpx.Client(cookies={name: sid}) as browser:
            assert browser.get(d.base + "/").status_code == 200  # a page's shell: the cookie is enough
            assert browser.get(d.base + "/api/pools", headers={"X-Skyward-Session": key}).json() == []
            # The cookie alone opens no API call (a browser sends it to every port of 127.0.0.1).
            assert browser.get(d.base + "/api/pools").status_code == 401
            assert browser.delete(d.base + "/api/pools/demo", headers={"X-Skyward-Request": "1"}).status_code == 401
            assert browser.delete(d.base + "/api/pools/demo", headers={"X-Skyward-Session": key}).status_code == 404
        # Neither half is a token.
        for value in (sid, key):
            assert httpx.get(d.base + "/api/pools", headers={"Authorization": f"Bearer {value}"}).status_code == 401


def test_a_named_pool_through_the_api_from_up_to_down(cli: CLI) -> None:
    cli.toml(TOML)
    seen: list[str] = []

    with dashboard(cli) as d:
        def call(method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
            r = d.api(method, path, **kwargs)
            seen.append(r.text)
            assert r.status_code == status, (method, path, r.text)
            return r.json()

        config = call("GET", "/api/config")
        demo = next(p for p in config["pools"] if p["name"] == "demo")
        assert demo["running"] is False and demo["provider"] == "local"
        assert demo["config"]["image"]["env"] == {"HF_TOKEN": "***"}
        preview = call("GET", "/api/config/demo/preview")
        assert preview["nodes"] == 2 and [r["type"] for r in preview["resources"]] == ["process", "process"]
        assert _missing(cli, "demo")  # preview created nothing

        made = call("POST", "/api/pools", 201, json={"name": "demo"})
        assert made["state"] == "running" and made["nodes"] == 2
        assert cli.record("demo")["state"] == "running"
        call("POST", "/api/pools", 409, json={"name": "demo"})  # already up: says so
        listed = call("GET", "/api/pools")
        assert [p["name"] for p in listed] == ["demo"] and listed[0]["kind"] == "named"
        detail = call("GET", "/api/pools/demo")
        assert len(detail["hosts"]) == 2 and detail["config"]["image"]["env"] == {"HF_TOKEN": "***"}
        assert "token" not in json.dumps(detail["hosts"])

        resized = call("POST", "/api/pools/demo/resize", json={"nodes": 3})
        assert resized["nodes"] == 3 and len(cli.record("demo")["cluster"]["nodes"]) == 3
        call("POST", "/api/pools/demo/resize", 400, json={"nodes": 0})

        results = call("POST", "/api/pools/demo/exec", json={"command": "echo token=$HF_TOKEN"})
        assert [r["exit_code"] for r in results] == [0, 0, 0]
        assert all(r["stdout"].strip() == "token=***" for r in results), results  # redacted

        logs = call("GET", "/api/pools/demo/logs?lines=20")
        assert [entry["node"] for entry in logs] == [0, 1, 2] and all(entry["text"] for entry in logs)
        trail = [e["event"] for e in call("GET", "/api/pools/demo/history")]
        assert trail[0] == "provisioned" and "resized" in trail and "exec" in trail
        assert call("GET", "/api/pools/demo/stack")["stack"] is None  # Local pools have no stack

        assert call("DELETE", "/api/pools/demo")["state"] == "destroyed"
        call("GET", "/api/pools/demo", 404)
        assert _missing(cli, "demo")
        assert [e["event"] for e in call("GET", "/api/pools/demo/history")][-1] == "destroyed"
        agents = wait_for(lambda: [p for p in cli.processes() if p != d.proc.pid] == [] or None, 20,
                          "the agents to stop")
        assert agents
    for text in seen:
        assert SECRET not in text


def test_the_event_stream_carries_a_running_programs_pool(cli: CLI) -> None:
    with dashboard(cli) as d, d.client.stream("GET", d.base + "/api/events",
                                              timeout=httpx.Timeout(30, read=30)) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        prog = program(cli, """
            import time, skyward as sky

            @sky.function
            def work(x):
                time.sleep(0.05)
                print("working on", x)
                return x + 1

            image = sky.Image(metrics=[sky.metrics.CPU(interval=0.3)])
            with sky.Compute(nodes=1, image=image, options=sky.Options(console="silent")) as pool:
                time.sleep(1.5)
                assert pool.map(work, range(10)) == list(range(1, 11))
                time.sleep(1.0)
        """)
        messages: list[dict[str, Any]] = []
        kinds: set[str] = set()
        deadline = time.monotonic() + 60
        for line in stream.iter_lines():
            if line.startswith("data: "):
                batch = json.loads(line[6:])
                messages.extend(batch)
                for m in batch:
                    kinds.update(e["type"] for e in m.get("events", []))
            if {"Metric", "BatchStarted", "BatchFinished", "ClusterDestroyed"} <= kinds or time.monotonic() > deadline:
                break
        _, err = prog.communicate(timeout=60)
        assert prog.returncode == 0, err
    assert messages[0]["type"] == "hello"
    assert {"Metric", "TaskStarted", "TaskCompleted", "BatchStarted", "BatchFinished", "Log",
            "ClusterDestroyed"} <= kinds, kinds
    assert any(m["type"] == "changed" and m["what"] == "pools" for m in messages)
    finished = [e for m in messages for e in m.get("events", []) if e["type"] == "BatchFinished"]
    assert finished[0]["done"] == finished[0]["total"] == 10


def test_a_programs_pool_is_listed_with_its_progress_and_output(cli: CLI) -> None:
    with dashboard(cli) as d:
        prog = program(cli, """
            import sys, time, skyward as sky

            @sky.function
            def work(x):
                print("item", x)
                return x

            with sky.Compute(nodes=2, options=sky.Options(console="silent")) as pool:
                time.sleep(2.5)  # the hook looks for a dashboard once a second
                pool.map(work, range(8))
                print("mapped", flush=True)
                sys.stdin.readline()  # hold the pool open until the test has looked
        """)
        listed = wait_for(lambda: [p for p in d.api("GET", "/api/pools").json()
                                   if p["kind"] == "program" and p["tasks_done"]], 60, "the program's pool")
        ref = listed[0]["ref"]
        detail = wait_for(lambda: (v := d.api("GET", f"/api/pools/{ref}").json())["batches"]
                          and v["batches"][0]["finished"] and v, 30, "the map to finish")
        assert detail["batches"][0]["done"] == 8 and detail["batches"][0]["kind"] == "map"
        assert len(detail["hosts"]) == 2 and detail["state"] == "running"
        lines = [line for text in detail["output"].values() for line in text]
        assert sorted(lines) == sorted(f"item {i}" for i in range(8))
        prog.communicate(timeout=60)  # closes its stdin: the program ends
        # The program is gone: its pool shows as ended.
        wait_for(lambda: d.api("GET", f"/api/pools/{ref}").json()["state"] == "ended", 30, "ended")


def test_a_pool_of_groups_shows_each_groups_nodes_apart(cli: CLI) -> None:
    with dashboard(cli) as d:
        prog = program(cli, """
            import sys, time, skyward as sky

            @sky.function
            def work(x):
                print("item", x)
                return x

            groups = {"prep": sky.Spec(nodes=2), "train": sky.Spec(nodes=1)}
            with sky.Compute(groups=groups, options=sky.Options(console="silent")) as pool:
                time.sleep(2.5)  # the hook looks for a dashboard once a second
                pool["train"].map(work, range(3))
                pool["prep"].map(work, range(3, 8))
                print("mapped", flush=True)
                sys.stdin.readline()
        """)
        listed = wait_for(lambda: [p for p in d.api("GET", "/api/pools").json()
                                   if p["kind"] == "program" and p["tasks_done"]], 60, "the program's pool")
        ref = listed[0]["ref"]
        def both_maps() -> dict[str, Any] | None:
            v = d.api("GET", f"/api/pools/{ref}").json()
            out = v["output"]
            done = len(out.get("train:0", [])) == 3 and sum(len(out.get(k, [])) for k in ("prep:0", "prep:1")) == 5
            return v if done else None

        detail = wait_for(both_maps, 30, "both maps' output")
        assert sorted((h["group"], h["index"]) for h in detail["hosts"]) == [("prep", 0), ("prep", 1), ("train", 0)]
        assert sorted(detail["output"]["train:0"]) == ["item 0", "item 1", "item 2"]
        assert {t["group"] for t in detail["finished"]} == {"prep", "train"}
        assert sorted(line for key in ("prep:0", "prep:1") for line in detail["output"].get(key, [])) == [
            f"item {i}" for i in range(3, 8)]
        prog.communicate(timeout=60)


def test_the_hook_costs_a_pool_nothing_while_no_dashboard_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))
    stale = hook.server_file()
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "x", "pid": 2 ** 22 + 12345}))
    assert hook.running_server() is None  # a file left by a dashboard that died is ignored
    with sky.Compute(nodes=1, options=sky.Options(console="silent", logging=False)) as pool:
        time.sleep(2.5 * hook.LOOK_EVERY)
        assert not ev.bus.wants(pool.id, ev.TaskStarted)  # nothing subscribed: no events built
        assert hook._link is None


def test_without_the_extra_the_command_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from skyward.named.cli import main

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn now raises ImportError
    assert main(["dashboard", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "uvicorn" in err and "pip install 'skyward[dashboard]'" in err


@pytest.mark.parametrize("port", ["99999", "65536", "-1"])
def test_a_port_out_of_range_is_a_usage_error(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    from skyward.named.cli import main

    assert main(["dashboard", "--port", port]) == 2  # not an OverflowError from bind()
    err = capsys.readouterr().err
    assert f"--port {port}: a port goes from 0 to 65535 (0 picks a free one)" in err
    assert "Traceback" not in err


def test_an_idle_named_pools_page_gets_its_nodes_metrics_without_keeping_it_alive(cli: CLI) -> None:
    cli.toml('[pools.idle]\nprovider = "local"\nnodes = 2\nttl = 8\n')
    assert cli("up", "idle").code == 0
    with dashboard(cli) as d:
        samples: set[int] = set()
        with d.client.stream("GET", d.base + "/api/events?pool=idle",
                             timeout=httpx.Timeout(30, read=30)) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    for m in json.loads(line[6:]):
                        samples.update(e["node"] for e in m.get("events", []) if e["type"] == "Metric")
                if samples == {0, 1}:
                    break
            live = d.api("GET", "/api/pools/idle").json()["live"]
            assert live is not None and {"0", "1"} <= set(live["metrics"])
            assert all(live["metrics"][n]["cpu"] for n in ("0", "1"))
            # Listening sends the agents nothing: the pool still stops when its ttl passes.
            wait_for(lambda: [p for p in cli.processes() if p != d.proc.pid] == [] or None, 60,
                     "the agents to stop by their ttl")
        wait_for(lambda: d.api("GET", "/api/pools/idle").status_code == 404
                 or d.api("GET", "/api/pools/idle").json()["state"] == "expired", 30, "the pool to expire")


def _login_form(page: str) -> tuple[str, str]:
    """(the form's action, its one-time code) from the page ``--open`` hands the browser."""
    import re

    action = re.search(r'<form[^>]* action="([^"]+)"', page)
    code = re.search(r'name="code" value="([^"]+)"', page)
    assert action and code, page
    return action[1], code[1]


def test_open_puts_no_secret_on_the_browsers_command_line(cli: CLI, tmp_path: Path) -> None:
    """Every local user reads every command line (`ps`), and the token in
    the browser's argv opened `POST /api/pools/NAME/exec`. The browser now gets the path of a
    0600 page that posts a one-time code, which the server exchanges once for the cookie."""
    opened = tmp_path / "argv.json"
    opener = tmp_path / "browser"
    opener.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(opened)!r}, 'w').write(json.dumps(sys.argv))\n")
    opener.chmod(0o755)
    cli.env["BROWSER"] = str(opener)  # what webbrowser.open runs, with the URL as its argument
    with dashboard(cli, "--open") as d:
        argv = json.loads(wait_for(lambda: opened.exists() and opened.read_text(), 30, "the browser to be opened"))
        assert not any(d.token in arg for arg in argv), argv
        url = argv[-1]
        assert url.startswith("file://"), argv
        page = Path(url.removeprefix("file://"))
        assert page.stat().st_mode & 0o077 == 0, oct(page.stat().st_mode)  # only the user reads it
        action, code = _login_form(page.read_text())
        assert action == d.base + "/login" and d.token not in page.read_text()
        # What the browser got logs in, once: the exchange starts a session ...
        r = httpx.post(action, data={"code": code})
        assert r.status_code == 200, r.text
        name, sid, key = logged_in(d, r)
        assert d.token not in (sid, key) and "HttpOnly" in r.headers["set-cookie"]
        with httpx.Client(cookies={name: sid}, headers={"X-Skyward-Session": key}) as browser:
            assert browser.get(d.base + "/api/pools").status_code == 200
        # ... and never again (whoever reads the code later gets nothing), nor does a made-up one.
        again = httpx.post(action, data={"code": code})
        assert again.status_code == 401 and name not in again.cookies
        assert httpx.post(action, data={"code": "guess"}).status_code == 401
        assert httpx.post(action, data={"code": d.token}).status_code == 401  # codes only


def test_the_guides_api_table_lists_every_endpoint_and_no_other() -> None:
    """docs/guides/dashboard.md's table is the API's documentation: it follows the routes."""
    import re

    from skyward.dashboard.app import build

    def shape(path: str) -> str:
        return re.sub(r"\{\w+\}", "{}", path.split("?")[0])

    guide = Path(__file__).resolve().parents[2] / "docs" / "guides" / "dashboard.md"
    row = re.compile(r"^\|\s*`(GET|POST|PUT|PATCH|DELETE)`\s*\|\s*`(/api/[^`]*)`")
    documented = {(m[1], shape(m[2])) for line in guide.read_text().splitlines() if (m := row.match(line))}
    served = {(method, shape(route.path)) for route in build("x").routes
              if route.path.startswith("/api/") and not route.path.startswith("/api/ingest/")
              for method in getattr(route, "methods", None) or () if method != "HEAD"}
    assert documented == served, (f"in the guide, not served: {sorted(documented - served)}; "
                                  f"served, not in the guide: {sorted(served - documented)}")


def test_listening_beyond_loopback_warns(cli: CLI) -> None:
    from skyward.dashboard.server import _loopback

    assert _loopback("127.0.0.1") and _loopback("127.0.0.2") and _loopback("::1")
    assert not _loopback("0.0.0.0") and not _loopback("192.168.1.5")
    with dashboard(cli, "--host", "0.0.0.0") as d:
        assert d.proc.stderr is not None
        assert "not loopback" in d.proc.stderr.readline()
        assert d.api("GET", "/api/pools").status_code == 200


def test_an_asleep_pool_through_the_api_shows_zero_of_its_max_and_each_wake(cli: CLI) -> None:
    """A pool of nodes = [0, 2]: the dashboard's API says asleep, 0/2, and lists the
    wake a program's first task made, with how long it took and what it cost."""
    cli.toml('[pools.nap]\nprovider = "local"\nnodes = [0, 2]\nttl = 300\n')
    with dashboard(cli) as d:
        def call(method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
            r = d.api(method, path, **kwargs)
            assert r.status_code == status, (method, path, r.text)
            return r.json()

        made = call("POST", "/api/pools", 201, json={"name": "nap"})
        assert (made["state"], made["nodes"], made["nodes_label"], made["max_nodes"]) == ("asleep", 0, "0/2", 2)
        assert call("GET", "/api/pools/nap")["wakes"] == []

        ran = cli.python("""
            import skyward as sky
            with sky.Compute(name="nap", options=sky.Options(console="silent")) as pool:
                assert sky.function(abs)(-3) >> pool == 3
        """)
        assert ran.code == 0, ran
        detail = call("GET", "/api/pools/nap")
        assert (detail["state"], detail["nodes_label"]) == ("asleep", "0/2"), detail  # the last out put it to sleep
        (wake,) = detail["wakes"]
        assert wake["nodes"] == 1 and wake["seconds"] > 0 and wake["awake_seconds"] is not None, wake
        assert wake["cost"] == 0.0 and detail["cost_so_far"] == 0.0  # Local: no price

        assert call("DELETE", "/api/pools/nap")["state"] == "destroyed"
        assert _missing(cli, "nap")


def test_a_session_unused_for_its_idle_time_is_refused() -> None:
    """The browser's cookie was the token, good forever. A session is now the
    server's own, and one left unused for ``session_idle`` s is forgotten: its cookie and key
    open nothing, not even a page; a session in use stays."""
    import re

    from starlette.testclient import TestClient

    from skyward.dashboard.app import build

    app = build("the-token")
    app.state.hub.session_idle = 1.5
    with TestClient(app, base_url="http://127.0.0.1:8123") as client:

        def login() -> tuple[str, str]:
            """(the session's cookie, its key), as a browser would send them."""
            r = client.get("/?token=the-token")
            assert r.status_code == 200
            key = re.search(r'<meta name="skyward-session" content="([^"]+)">', r.text)
            sid = r.cookies.get("skyward_session_8123")  # the cookie is named after the port
            assert key and sid
            client.cookies.clear()
            return f"skyward_session_8123={sid}", key[1]

        def get(path: str, session: tuple[str, str], *, page: bool = False) -> int:
            headers = {"Cookie": session[0]} if page else {"Cookie": session[0], "X-Skyward-Session": session[1]}
            return client.get(path, headers=headers).status_code

        idle, used = login(), login()
        assert get("/api/config", idle) == 200
        for _ in range(4):  # 2 s: past the idle time of the first, the second in use every 0.5 s
            time.sleep(0.5)
            assert get("/api/config", used) == 200
        assert get("/api/config", idle) == 401
        assert get("/", idle, page=True) == 401
        assert get("/", used, page=True) == 200


@pytest.mark.timeout(300)
def test_a_programs_endpoint_shows_on_its_pool_page_and_in_metrics(cli: CLI) -> None:
    import os

    tests = str(Path(__file__).parent.parent)  # serve.apps, for the program and its nodes
    cli.env["PYTHONPATH"] = os.pathsep.join([tests, *filter(None, [cli.env.get("PYTHONPATH")])])
    with dashboard(cli) as d:
        prog = program(cli, """
            import sys, time, httpx, skyward as sky

            with sky.Compute(nodes=1, options=sky.Options(console="silent")) as pool:
                time.sleep(2.5)  # the hook looks for a dashboard once a second
                with pool.serve("serve.apps:app") as endpoint:
                    endpoint.wait_ready(timeout=120)
                    with httpx.Client(base_url=endpoint.url, headers=endpoint.headers, timeout=30) as c:
                        codes = [c.get("/whoami").status_code for _ in range(20)] + [c.get("/nope").status_code]
                    print(endpoint.url, codes.count(200), flush=True)
                    sys.stdin.readline()  # hold the endpoint open until the test has looked
        """)
        assert prog.stdout is not None
        url, ok = prog.stdout.readline().split()
        assert ok == "20", prog.stderr.read() if prog.stderr else ""
        ref = wait_for(lambda: [p for p in d.api("GET", "/api/pools").json() if p["kind"] == "program"], 60,
                       "the program's pool")[0]["ref"]
        served = wait_for(lambda: [e for e in d.api("GET", f"/api/pools/{ref}").json()["endpoints"]
                                   if e["requests"] == 21], 30, "the endpoint's 21 requests")[0]
        assert served["url"] == url and not served["closed"]
        assert served["replicas"] == [{"key": "0.0", "node": 0, "state": "ready"}]
        assert served["errors"] == 0 and served["client_errors"] == 1 and served["statuses"] == {"200": 20, "404": 1}
        assert served["requests_per_second"] > 0  # 21 requests in the last 10 s
        assert 0 < served["p50_seconds"] <= served["p99_seconds"] < 30
        metrics = d.api("GET", "/metrics").text
        label = f'endpoint="{url.removeprefix("http://")}"'
        assert any(line.startswith("skyward_endpoint_requests_total{") and label in line and 'status="200"' in line
                   and line.endswith(" 20.0") for line in metrics.splitlines()), metrics
        prog.communicate(timeout=60)
        closed = wait_for(lambda: [e for e in d.api("GET", f"/api/pools/{ref}").json()["endpoints"]
                                   if e["closed"]], 30, "the endpoint closed")[0]
        assert closed["replicas"] == [] and closed["requests"] == 21
