"""`skyward notebook` on a real sshd host behind a bastion. The host has no route out:
JupyterLab and marimo reach it as wheels this machine sends (the pool's install mode, as `skyward
install`), recorded in the pool's lock. A real browser (Debian's chromium through Selenium) opens
the tunnelled JupyterLab and runs a cell that prints the node's hostname and imports a package of
the pool's Image; Ctrl-C stops the server on the node, and so does `skyward down`. A screenshot
of the notebook goes to the test artifacts (docs/images/notebook.png is one of them)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import chrome
from sshhosts import SSHHosts, SSHHostsUnavailable

from .conftest import CLI
from .dashboard_helpers import artifacts, wait_for
from .notebook_helpers import notebook
from .ssh_helpers import on_host
from .wheelindex import WheelIndex

pytest.importorskip("jupyterlab")
pytest.importorskip("marimo")
httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.timeout(900)

PROBE = {
    "cells": [{"cell_type": "code", "execution_count": None, "id": "probe", "metadata": {}, "outputs": [],
               "source": ["import os, socket, skyimg\n",
                          "print('@@', socket.gethostname(), skyimg.VERSION, os.environ['GREETING'])"]}],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5,
}


class Lab:
    def __init__(self, cli: CLI, hosts: SSHHosts) -> None:
        self.cli, self.hosts = cli, hosts

    def servers(self) -> str:
        """The notebook server processes on the node ('' when there are none)."""
        return on_host(self.hosts[0], "pgrep -af '[j]upyterlab|[m]arimo|[i]pykernel' || true").strip()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    hosts = SSHHosts(1, mode="netns", bastion=True, user="auto")
    try:
        hosts.start()
    except SSHHostsUnavailable as exc:
        pytest.skip(f"netns SSH test hosts unavailable: {exc}")
    root = tmp_path_factory.mktemp("notebook")
    cli = CLI(root)
    try:
        index = WheelIndex(root / "index")
        index.publish("skyimg", "1.5")
        targets = json.dumps([f"{h.user}@{h.address}:{h.port}" for h in hosts])
        cli.toml(f'[pools.lab]\nprovider = "ssh"\nnodes = 1\nttl = 600\n\n'
                 f'[pools.lab.image]\npip = ["skyimg==1.5"]\nenv = {{ GREETING = "hi from the image" }}\n'
                 f'pip_indexes = [{{ url = "{index.url}", packages = ["skyimg"] }}]\n\n'
                 f'[pools.lab.ssh]\nhosts = {targets}\nkey = "{hosts[0].key_path}"\njump = "{hosts.jump}"\n'
                 f'known_hosts = "{cli.cwd / "known_hosts"}"\n')
        up = cli("up", "lab", "--console", "silent", timeout=300)
        assert up.code == 0, up
        yield Lab(cli, hosts)
    finally:
        try:
            cli("down", "--all", "--force", timeout=120)
        finally:
            hosts.close()




@pytest.fixture
def browser() -> Iterator[Any]:
    with chrome((1280, 800), page_load_timeout=120) as driver:
        yield driver


def test_jupyterlab_in_a_browser_runs_a_cell_on_the_node_with_the_pools_image(lab: Lab, browser: Any,
                                                                               tmp_path: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    probe = tmp_path / "probe.ipynb"
    probe.write_text(json.dumps(PROBE))
    assert lab.cli("cp", str(probe), "lab:", timeout=120).code == 0
    with notebook(lab.cli, "lab") as (proc, shown):
        base, token = shown["url"].split("/lab?token=")
        assert base.startswith("http://127.0.0.1:") and shown["hostname"] == lab.hosts[0].name
        # Installed the pool's way (wheels from here, through the bastion), and in its lock.
        pool_id = lab.cli.record("lab")["id"]
        locked = {p["name"] for p in lab.cli("history", pool_id, "--json").json()["lock"]["packages"]}
        assert {"jupyterlab", "ipykernel", "skyimg"} <= locked, locked
        # Listening on the node's loopback only, and no token on its command line there.
        servers = lab.servers()
        assert "--ip=127.0.0.1" in servers and token not in servers, servers

        browser.get(f"{base}/lab/tree/probe.ipynb?token={token}")

        def editor() -> Any:
            found = browser.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell .cm-content")
            return found[0] if found else None

        def kernel_idle() -> bool:
            return bool(browser.find_elements(
                By.CSS_SELECTOR, ".jp-Notebook-ExecutionIndicator[data-status='idle']"))

        def run_cell() -> bool:
            # A dialog (the kernel's, a notice) may sit over the notebook at first: dismissed.
            for dialog in browser.find_elements(By.CSS_SELECTOR, ".jp-Dialog"):
                ActionChains(browser).send_keys(Keys.ESCAPE).perform()
                del dialog
            cell = browser.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell .jp-InputArea-editor")
            if not cell or not kernel_idle():
                return False
            ActionChains(browser).move_to_element(cell[0]).click().perform()
            ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
            return True

        def output() -> str:
            found = browser.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output")
            return str(found[0].text) if found else ""

        def ran() -> str:
            # Run it, and again if no output came: keys sent while the page still connects to
            # the kernel (its indicator already idle) are dropped.
            run_cell()
            try:
                return str(wait_for(lambda: "@@" in output() and output(), 20, "the cell's output"))
            except AssertionError:
                return ""

        shots = artifacts()
        try:
            wait_for(editor, 180, "the notebook's cell")
            said = wait_for(ran, 240, "the cell to run and print")
        except AssertionError:
            browser.save_screenshot(str(shots / "notebook-failed.png"))
            raise
        assert said.split() == ["@@", lab.hosts[0].name, "1.5", "hi", "from", "the", "image"], said
        for button in browser.find_elements(By.CSS_SELECTOR, ".Toastify button"):  # JupyterLab's news prompt
            if button.text.strip() == "No":
                button.click()
        browser.save_screenshot(str(shots / "notebook.png"))

        proc.send_signal(signal.SIGINT)  # Ctrl-C: the server and its kernel stop on the node
        assert proc.wait(90) == 0
    assert lab.servers() == ""
    with pytest.raises(httpx.TransportError):
        httpx.get(base + "/lab", timeout=5)


def test_marimo_answers_through_its_tunnel(lab: Lab) -> None:
    with notebook(lab.cli, "lab", "--marimo") as (proc, shown):
        assert shown["server"] == "marimo" and "?access_token=" in shown["url"]
        base = shown["url"].split("/?access_token=")[0]
        assert httpx.get(base + "/", timeout=30).status_code == 403  # the token is needed (this side asks)
        with httpx.Client(timeout=60, follow_redirects=True) as client:
            page = client.get(shown["url"])
            assert page.status_code == 200 and "marimo" in page.text.lower()
            assert client.get(base + "/").status_code == 200  # its session cookie, through the tunnel
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0
    assert lab.servers() == ""


def test_down_stops_the_server_on_the_node(lab: Lab) -> None:
    # Last in this module: the pool goes.
    with notebook(lab.cli, "lab") as (proc, _shown):
        assert "jupyterlab" in lab.servers()
        assert lab.cli("down", "lab", "--force", timeout=120).code == 0
        assert proc.wait(90) == 0
        assert proc.stderr is not None and "the pool was stopped" in proc.stderr.read()
    wait_for(lambda: lab.servers() == "", 30, "the server to stop on the node")
