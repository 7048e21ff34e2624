"""The dashboard in a real headless browser (Debian's chromium, driven by Selenium through
chromedriver): a named Local pool, a program mapping over it, the charts, the progress bar,
the audit trail, `down` from the page, and no secret anywhere. Screenshots of each page go to
tests/artifacts/dashboard/ (or $SKYWARD_TEST_ARTIFACTS)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import chrome

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
webdriver = pytest.importorskip("selenium.webdriver")

from selenium.webdriver.common.by import By  # noqa: E402

from .conftest import CLI  # noqa: E402
from .dashboard_helpers import SECRET, TOML, artifacts, dashboard, program, wait_for  # noqa: E402

# The nodes table's own rows: a chart's legend (uPlot draws it as a table) sits in a row's cell,
# and its rows would match a looser selector once the chart has points.
NODE_ROWS = "#nodes-table > tbody > tr"


@pytest.fixture
def browser() -> Iterator[Any]:
    with chrome((1280, 1000), page_load_timeout=60) as driver:
        yield driver


def _text(driver: Any, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def _click(driver: Any, css: str) -> None:
    """Click the element ``css`` names now (live updates may re-render it between find and click)."""

    def attempt() -> bool:
        found = [e for e in driver.find_elements(By.CSS_SELECTOR, css) if e.is_enabled()]
        if not found:
            return False
        found[0].click()
        return True

    wait_for(attempt, 30, f"{css} to click")


def _confirm(driver: Any) -> str:
    """Accept the page's confirmation dialog; returns its text."""
    wait_for(lambda: driver.find_element(By.ID, "confirm").is_displayed(), 10, "the confirmation")
    text = _text(driver, "#confirm-text")
    driver.find_element(By.ID, "confirm-ok").click()
    return text


def test_the_dashboard_shows_a_pool_live_and_stops_it(cli: CLI, browser: Any) -> None:
    cli.toml(TOML)
    assert cli("up", "demo").code == 0
    shots = artifacts()
    pages: list[str] = []

    def keep(name: str) -> None:
        pages.append(browser.page_source)
        # The whole page (the pool page's trail and logs are below the fold), then back.
        height = int(browser.execute_script("return document.documentElement.scrollHeight"))
        browser.set_window_size(1280, min(max(height + 200, 1000), 8000))  # + the window's frame
        browser.save_screenshot(str(shots / f"{name}.png"))
        browser.set_window_size(1280, 1000)

    with dashboard(cli) as d:
        browser.get(d.url)  # the printed URL: the token becomes a cookie, the address loses it
        assert "token=" not in browser.current_url
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#pools tr[data-ref='demo']"), 30, "the pools list")
        assert "running" in _text(browser, "#pools tr[data-ref='demo']")
        keep("pools")

        # A program attaches and maps over the pool while the page watches.
        prog = program(cli, """
            import sys, time, skyward as sky

            @sky.function
            def work(x):
                end = time.time() + 0.25
                while time.time() < end:  # busy: the CPU chart has something to show
                    pass
                return x

            with sky.Compute(name="demo", options=sky.Options(console="silent")) as pool:
                time.sleep(3)  # registered with the dashboard, charts filling
                assert pool.map(work, range(24)) == list(range(24))
                print("mapped", flush=True)
                sys.stdin.readline()
        """)
        try:
            browser.get(d.base + "/pools/demo")
            wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, NODE_ROWS)) == 2, 30,
                     "two nodes")
            chart = "#chart-0"
            first = wait_for(lambda: int(browser.find_element(By.CSS_SELECTOR, chart).get_attribute("data-points")
                                         or 0), 60, "the CPU chart's first samples")
            wait_for(lambda: int(browser.find_element(By.CSS_SELECTOR, chart).get_attribute("data-points")
                                 or 0) > first, 30, "the chart to move")
            assert browser.find_elements(By.CSS_SELECTOR, f"{chart} canvas")  # uPlot drew it
            bar = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".batch[data-percent='100']"), 90,
                           "the map's progress bar at 100 %")
            assert "24/24" in bar[0].text and "100 %" in bar[0].text
            assert prog.stdout is not None and prog.stdout.readline().strip() == "mapped"
            events = wait_for(lambda: {e.get_attribute("data-event") for e in
                                       browser.find_elements(By.CSS_SELECTOR, "#audit-table tr[data-event]")}
                              >= {"provisioned", "attached"} and True, 30, "the audit trail")
            assert events
            keep("pool")
        finally:
            prog.communicate(timeout=60)
        assert prog.returncode == 0

        browser.get(d.base + "/config")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#config-pools tr[data-pool='demo']"), 30,
                 "the skyward.toml pools")
        _click(browser, ".preview-btn[data-pool='demo']")
        wait_for(lambda: "agent node-1" in _text(browser, "#preview-demo"), 30, "the preview")
        keep("config")

        # `down` from the page, through its confirmation.
        browser.get(d.base + "/pools/demo")
        _click(browser, "#down")
        assert "Stop pool demo" in _confirm(browser)
        wait_for(lambda: not (cli.home / "registry" / "demo.json").exists(), 60, "the pool to be removed")
        wait_for(lambda: [p for p in cli.processes() if p != d.proc.pid] == [] or None, 30, "its agents to stop")
        wait_for(lambda: any(words in browser.find_element(By.ID, "main").text
                             for words in ("pool demo destroyed", "no pool named 'demo'")), 30, "the page to say so")
        keep("destroyed")

        # `up` from the skyward.toml page, then a resize from the pool's page: both confirmed first.
        browser.get(d.base + "/config")
        _click(browser, ".up-btn[data-pool='demo']")
        assert "Start pool demo" in _confirm(browser)
        wait_for(lambda: browser.current_url.endswith("/pools/demo"), 90, "the new pool's page")
        assert cli.record("demo")["state"] == "running"
        def type_one() -> bool:
            box = browser.find_element(By.ID, "resize-nodes")
            box.clear()
            box.send_keys("1")
            return str(browser.find_element(By.ID, "resize-nodes").get_attribute("value")) == "1"

        wait_for(type_one, 30, "the resize box to say 1")
        _click(browser, "#resize")
        assert "from 2 to 1" in _confirm(browser)
        wait_for(lambda: len(cli.record("demo")["cluster"]["nodes"]) == 1, 60, "the pool to shrink")
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, NODE_ROWS)) == 1, 30,
                 "the page to show one node")
        pages.append(browser.page_source)

        api_texts = [d.api("GET", path).text for path in
                     ("/api/pools", "/api/config", "/api/config/demo/preview", "/api/pools/demo/history")]
    for text in pages + api_texts:
        assert SECRET not in text


QUIET_POOL = """
[pools.quiet]
provider = "local"
nodes = 1
ttl = 120

[pools.quiet.image]
metrics = false
"""
NOTE = "//p[@id='charts-note']"


def _facts(driver: Any) -> list[dict[str, Any]]:
    """Each fact of the pool page's head: its label's and its value's boxes."""
    return list(driver.execute_script("""
        return [...document.querySelectorAll("dl.facts dt")].map((dt) => {
          const dd = dt.nextElementSibling, a = dt.getBoundingClientRect(), b = dd.getBoundingClientRect();
          return {label: dt.textContent, value: dd.textContent, tag: dd.tagName,
                  top: a.top, bottom: a.bottom, right: a.right, value_top: b.top, value_left: b.left};
        });"""))


def _check_facts_and_shoot(driver: Any, name: str) -> None:
    """At 1400 and 800 px: every label sits on its value's line, just before it, and the page fits
    the window's width; then a whole-page screenshot."""
    for width in (1400, 800):
        driver.set_window_size(width, 1000)
        wait_for(lambda w=width: abs(driver.execute_script("return window.innerWidth") - w) <= 20, 10,
                 "the window to take its width")
        facts = _facts(driver)
        assert {f["label"] for f in facts} >= {"kind", "provider", "nodes", "age", "expires", "$/h",
                                               "cost so far", "owner", "clients", "offer"}
        for f in facts:
            assert f["tag"] == "DD", f
            assert abs(f["top"] - f["value_top"]) <= 6 and f["bottom"] > f["value_top"], (width, f)  # one line
            assert 0 <= f["value_left"] - f["right"] <= 24, (width, f)  # the value follows its label
        wait_for(lambda: driver.execute_script(  # nothing, the charts included, runs off the side
            "return document.documentElement.scrollWidth <= window.innerWidth"), 10, "the page to fit its width")
        height = int(driver.execute_script("return document.documentElement.scrollHeight"))
        driver.set_window_size(width, min(max(height + 200, 1000), 8000))
        driver.save_screenshot(str(artifacts() / f"{name}-{width}.png"))
    driver.set_window_size(1280, 1000)


# The page's fetch, wrapped: the next answer about pool demo is held back 1.5 s and made to say
# one node (an answer from before a resize), so that a later load's answer overtakes it.
STALE_ANSWER = """
const real = window.fetch;
let held = false;
window.staleAnswerSent = false;
window.fetch = async (url, opts) => {
  const response = await real(url, opts);
  if (held || !String(url).endsWith("/api/pools/demo")) return response;
  held = true;
  const d = await response.json();
  d.hosts = d.hosts.slice(0, 1);
  d.nodes = 1;
  await new Promise((done) => setTimeout(done, 1500));
  window.staleAnswerSent = true;
  return new Response(JSON.stringify(d), { status: 200, headers: { "Content-Type": "application/json" } });
};
loadPool();
loadPool();
"""


def test_an_answer_overtaken_by_a_later_one_does_not_repaint_the_pool_page(cli: CLI, browser: Any) -> None:
    """The pool page loads again on every change (live events, its own buttons): a load begun
    before a resize may answer after the one begun after it. The newest load's answer is shown,
    whatever order the answers come in."""
    cli.toml(TOML)
    assert cli("up", "demo").code == 0
    with dashboard(cli) as d:
        browser.get(d.url)
        browser.get(d.base + "/pools/demo")
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, NODE_ROWS)) == 2, 30, "two nodes")
        browser.execute_script(STALE_ANSWER)
        wait_for(lambda: browser.execute_script("return window.staleAnswerSent"), 30, "the held answer")
        time.sleep(0.5)  # what the page does with it, it has done
        assert len(browser.find_elements(By.CSS_SELECTOR, NODE_ROWS)) == 2


def test_the_pool_page_keeps_facts_whole_reads_its_time_axis_and_explains_empty_charts(
        cli: CLI, browser: Any) -> None:
    import re

    cli.toml(TOML + QUIET_POOL)
    assert cli("up", "demo").code == 0
    assert cli("up", "quiet").code == 0  # its agents sample nothing: nothing to chart
    with dashboard(cli) as d:
        browser.get(d.url)
        browser.get(d.base + "/pools/quiet")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, NODE_ROWS), 30, "the node")
        note = wait_for(lambda: [e for e in browser.find_elements(By.XPATH, NOTE) if e.is_displayed()], 10,
                        "the sentence that says why there are no charts")
        assert "samples no metrics" in note[0].text
        _check_facts_and_shoot(browser, "pool-no-charts")
        assert [e for e in browser.find_elements(By.XPATH, NOTE) if e.is_displayed()]

        browser.get(d.base + "/pools/demo")
        wait_for(lambda: int(browser.find_element(By.CSS_SELECTOR, "#chart-0").get_attribute("data-points")
                             or 0) >= 4, 60, "the first samples")
        wait_for(lambda: browser.execute_script("const x = window.skywardCharts[0].plot.data[0];"
                                                "return x[x.length - 1] - x[0] >= 4"), 60, "four seconds of samples")
        wait_for(lambda: not [e for e in browser.find_elements(By.XPATH, NOTE) if e.is_displayed()], 10,
                 "the sentence to go once there are charts")
        ticks = browser.execute_script("return window.skywardCharts[0].plot.axes[0]._values")
        assert ticks and all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in ticks), ticks  # e.g. 14:45:10
        _check_facts_and_shoot(browser, "pool-charts")
        assert not [e for e in browser.find_elements(By.XPATH, NOTE) if e.is_displayed()]


def test_open_logs_the_browser_in_without_the_token_on_its_command_line(cli: CLI, browser: Any,
                                                                        tmp_path: Path) -> None:
    """`--open` hands the browser a local page (its argv carries no secret):
    opened in a real browser, that page logs in and shows the pools, and a second visit of it,
    its one-time code spent, does not."""
    argv_file = tmp_path / "argv.json"
    opener = tmp_path / "browser"
    opener.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(argv_file)!r}, 'w').write(json.dumps(sys.argv))\n")
    opener.chmod(0o755)
    cli.env["BROWSER"] = str(opener)
    with dashboard(cli, "--open") as d:
        argv = json.loads(wait_for(lambda: argv_file.exists() and argv_file.read_text(), 30, "the browser's argv"))
        assert d.token not in " ".join(argv)
        browser.get(argv[-1])  # what the real browser would have been given
        wait_for(lambda: browser.find_elements(By.ID, "no-pools"), 30, "the pools page, logged in")
        assert browser.current_url == d.base + "/"
        browser.delete_all_cookies()
        browser.get(argv[-1])
        wait_for(lambda: "used already or has expired" in browser.page_source, 30, "the spent code's refusal")


@contextlib.contextmanager
def _recorder() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """Another server on another port of 127.0.0.1 (another user's, say) that keeps the headers
    of every request it gets: (its URL, those headers)."""
    seen: list[dict[str, str]] = []

    class Keep(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers.items()))
            body = b"<!doctype html><title>elsewhere</title><p id='elsewhere'>another server</p>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Keep)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_what_the_browser_sends_to_another_port_opens_nothing(cli: CLI, browser: Any) -> None:
    """The dashboard's cookie was the token, and a browser sends 127.0.0.1's cookies to
    every port of 127.0.0.1: another user's server got the token from the logged-in browser and
    ran commands on every node (POST /api/pools/NAME/exec). Whatever that server receives now,
    replayed to the dashboard as a cookie or as a token, is refused."""
    with dashboard(cli) as d, _recorder() as (elsewhere, seen):
        browser.get(d.url)
        wait_for(lambda: browser.find_elements(By.ID, "no-pools"), 30, "the pools page, logged in")
        assert "token=" not in browser.current_url
        browser.get(elsewhere + "/")
        wait_for(lambda: browser.find_elements(By.ID, "elsewhere"), 30, "the other server's page")
        cookies: dict[str, str] = {}
        for headers in seen:
            for pair in headers.get("Cookie", "").split(";"):
                name, _, value = pair.strip().partition("=")
                if name:
                    cookies[name] = value
        assert cookies, seen  # the browser did send the dashboard's cookie to the other port
        values = {*cookies.values(), *(v for headers in seen for v in headers.values())}
        port = d.base.rsplit(":", 1)[1]
        for value in values:
            attempts = [
                {"headers": {"Cookie": "; ".join(f"{n}={v}" for n, v in cookies.items())}},
                {"headers": {"Cookie": f"skyward_session_{port}={value}"}},
                {"headers": {"Cookie": f"skyward_token={value}"}},
                {"headers": {"Authorization": f"Bearer {value}"}},
                {"headers": {"X-Skyward-Token": value}},
                {"params": {"token": value}},
            ]
            for attempt in attempts:
                headers = {**attempt.get("headers", {}), "X-Skyward-Request": "1"}
                params = attempt.get("params")
                listed = httpx.get(d.base + "/api/pools", headers=headers, params=params, timeout=30)
                ran = httpx.post(d.base + "/api/pools/demo/exec", json={"command": "id"}, headers=headers,
                                 params=params, timeout=30)
                assert {listed.status_code, ran.status_code} <= {401, 403}, (attempt, listed.text, ran.text)
        # The browser's own session still works on the dashboard's port.
        browser.get(d.base + "/")
        wait_for(lambda: browser.find_elements(By.ID, "no-pools"), 30, "the pools page, still logged in")
