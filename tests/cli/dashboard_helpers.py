"""The real ``skyward dashboard`` in a subprocess, for the API and browser tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helpers
import httpx

from .conftest import CLI, stop

SECRET = "hf_dashboardsecret4242"
TOML = f"""
[pools.demo]
provider = "local"
nodes = 2
ttl = 120

[pools.demo.image.env]
HF_TOKEN = "{SECRET}"
"""


@dataclass
class Dashboard:
    proc: subprocess.Popen[str]
    url: str  # as printed, with the token
    base: str
    token: str
    client: httpx.Client  # sends the token

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.request(method, self.base + path, **kwargs)


@contextlib.contextmanager
def dashboard(cli: CLI, *args: str) -> Iterator[Dashboard]:
    proc = cli.start("dashboard", "--port", "0", "--json", *args)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait(10)
            raise AssertionError(f"skyward dashboard did not start: {proc.stderr.read() if proc.stderr else ''}")
        url = json.loads(line)["url"]
        base, token = url.split("/?token=")
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            yield Dashboard(proc, url, base, token, client)
    finally:
        stop(proc, grace=15)


def logged_in(d: Dashboard, answer: httpx.Response) -> tuple[str, str, str]:
    """(the cookie's name, the session id, the page's key) of the session a login ``answer``
    (the printed URL's page, or ``POST /login``'s) started: what a browser keeps."""
    import re

    name = f"skyward_session_{d.base.rsplit(':', 1)[1]}"
    sid = answer.cookies.get(name)
    key = re.search(r'<meta name="skyward-session" content="([^"]+)">', answer.text)
    assert sid and key, (answer.headers, answer.text)
    return name, sid, key[1]


def program(cli: CLI, source: str) -> subprocess.Popen[str]:
    """A client program (the caller waits for it)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(source)], cwd=cli.cwd, env=cli.env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy; generous timeouts (a loaded 2-core VM),
    and an exception (the page or API is not there yet) counts as not yet."""
    return helpers.wait_for(check, timeout, what, step=0.2, ignoring=(Exception,))


def artifacts() -> Path:
    """Where screenshots go: $SKYWARD_TEST_ARTIFACTS, else tests/artifacts (git-ignored)."""
    folder = Path(os.environ.get("SKYWARD_TEST_ARTIFACTS") or Path(__file__).parent.parent / "artifacts") / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
