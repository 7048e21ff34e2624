"""No page of the dashboard can be shown in another page's frame (clickjacking).

A review ran as another local user: its page on another loopback port held the logged-in
dashboard in a transparent frame under decoy buttons, and two clicks in it destroyed a pool.
Every response of the dashboard now forbids framing (X-Frame-Options and CSP frame-ancestors),
whatever kind it is, and a page that finds itself in a frame anyway acts on nothing. Over HTTP
against the real server, then in Debian's chromium with the framing page served by another user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from browser import chrome

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from .conftest import CLI
from .dashboard_helpers import TOML, Dashboard, dashboard, logged_in, wait_for


def _refuses_framing(response: httpx.Response) -> bool:
    return (response.headers.get("x-frame-options") == "DENY"
            and "frame-ancestors 'none'" in response.headers.get_list("content-security-policy"))


def _every_kind(d: Dashboard) -> dict[str, httpx.Response]:
    """One response of each kind the server gives, by what it is."""
    out: dict[str, httpx.Response] = {}
    anonymous = httpx.Client(timeout=60)
    with anonymous:
        out["page, no token (401 HTML)"] = anonymous.get(d.base + "/")
        out["API, no token (401 JSON)"] = anonymous.get(d.base + "/api/pools")
        out["metrics, no token"] = anonymous.get(d.base + "/metrics")
        out["the printed URL (login page)"] = login = anonymous.get(d.url)
        out["POST /login, a spent code (401)"] = anonymous.post(d.base + "/login", data={"code": "nope"})
        out["static file"] = anonymous.get(d.base + "/static/dashboard.js")
        out["static file, missing (404)"] = anonymous.get(d.base + "/static/nothing.js")
        out["unknown path (404)"] = anonymous.get(d.base + "/nowhere")
        out["wrong method (405)"] = anonymous.put(d.base + "/api/pools")
        name, sid, key = logged_in(d, login)
    with httpx.Client(cookies={name: sid}, timeout=60) as browser:
        out["page shell, session"] = browser.get(d.base + "/config")
        out["pool page shell"] = browser.get(d.base + "/pools/demo")
        out["API, session"] = browser.get(d.base + "/api/pools", headers={"X-Skyward-Session": key})
    out["API list"] = d.api("GET", "/api/pools")
    out["API error (404)"] = d.api("GET", "/api/pools/nosuchpool/history")
    out["API bad request (400)"] = d.api("POST", "/api/pools", content=b"not json")
    out["metrics"] = d.api("GET", "/metrics")
    with d.client.stream("GET", d.base + "/api/events") as events:
        out["event stream"] = events
    return out


def test_every_response_forbids_framing(cli: CLI) -> None:
    with dashboard(cli) as d:
        responses = _every_kind(d)
    statuses = {r.status_code for r in responses.values()}
    assert {200, 400, 401, 404, 405} <= statuses, statuses  # every kind was met
    bad = {what: (r.status_code, dict(r.headers)) for what, r in responses.items() if not _refuses_framing(r)}
    assert not bad, bad


def test_an_unhandled_error_forbids_framing_too() -> None:
    """The 500 of an error no endpoint caught comes from Starlette's outermost layer: the
    headers are set outside it."""
    import asyncio

    from starlette.routing import Route

    from skyward.dashboard.app import build

    app = build("the-token")

    async def boom(request: Any) -> Any:
        raise RuntimeError("a bug")

    app.router.routes.append(Route("/boom", boom))

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.get("/boom")

    response = asyncio.run(get())
    assert response.status_code == 500 and _refuses_framing(response), response.headers


# -- in a real browser ----------------------------------------------------------------------------
NOBODY = 65534
FRAMER = """
import http.server, sys
page = ('<!doctype html><title>prizes</title><button id="decoy">Claim your prize</button>'
        '<iframe id="victim" src="%s" width="900" height="600" style="opacity:.1" '
        'onload="document.body.dataset.loaded = 1"></iframe>' % sys.argv[1]).encode()
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Page)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.fixture
def browser() -> Iterator[Any]:
    with chrome((1280, 1000), page_load_timeout=60) as driver:
        yield driver


def _framer(target: str) -> subprocess.Popen[str]:
    """The framing page, served on another loopback port by another user (nobody) when this
    test is root and the system's python runs as nobody; else by a process of this user."""
    python = shutil.which("python3", path="/usr/bin:/bin") or "python3"
    command = [python, "-I", "-c", textwrap.dedent(FRAMER), target]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command]
        if subprocess.run([*as_nobody[:-3], "-c", "pass"], cwd="/", capture_output=True).returncode == 0:
            command = as_nobody
    return subprocess.Popen(command, cwd="/", stdout=subprocess.PIPE, text=True)


def test_another_users_page_cannot_frame_the_logged_in_dashboard(cli: CLI, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    with dashboard(cli) as d:
        browser.get(d.url)  # logged in: the session's cookie and key are in the browser
        wait_for(lambda: browser.find_elements(By.ID, "no-pools"), 30, "the pools page, logged in")
        framer = _framer(d.base + "/")
        try:
            assert framer.stdout is not None
            port = int(framer.stdout.readline())
            browser.get(f"http://127.0.0.1:{port}/")
            wait_for(lambda: browser.find_elements(By.ID, "decoy"), 30, "the framing page")
            wait_for(lambda: browser.execute_script("return document.body.dataset.loaded"), 30, "the frame's load")
            browser.switch_to.frame("victim")
            try:
                # What a logged-in dashboard page shows within a second or two, if it is there at all.
                for _ in range(15):
                    shown = browser.find_elements(By.CSS_SELECTOR, "#nav-pools, #no-pools, #pools, #main")
                    assert not shown, "the dashboard is shown in another user's frame"
                    time.sleep(0.2)
            finally:
                browser.switch_to.default_content()
        finally:
            framer.terminate()
            framer.wait(10)
            if framer.stdout is not None:
                framer.stdout.close()


def test_a_page_in_a_frame_the_headers_did_not_stop_acts_on_nothing(cli: CLI, browser: Any) -> None:
    """A browser that ignores the headers: the page's own shell written into a frame of its own
    origin (no response of the server is framed, so no header applies). It loads no data and
    wires no button; it says why."""
    from selenium.webdriver.common.by import By

    cli.toml(TOML)  # the skyward.toml page would offer its pool's Start button
    with dashboard(cli) as d:
        browser.get(d.url)
        wait_for(lambda: browser.find_elements(By.ID, "no-pools"), 30, "the pools page, logged in")
        browser.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch("/config", {credentials: "same-origin"}).then((r) => r.text()).then((html) => {
              const frame = document.createElement("iframe");
              frame.id = "copy";
              document.body.append(frame);
              frame.contentDocument.open();
              frame.contentDocument.write(html);
              frame.contentDocument.close();
              done(true);
            });""")
        browser.switch_to.frame("copy")
        try:
            notice = wait_for(lambda: browser.find_elements(By.ID, "framed"), 30, "the framed page's notice")
            assert "frame" in notice[0].text
            assert not browser.find_elements(By.CSS_SELECTOR, "#config-pools, .up-btn, .preview-btn, #no-pools")
            assert browser.find_element(By.ID, "live-status").text == ""
        finally:
            browser.switch_to.default_content()
