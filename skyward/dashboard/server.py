"""``skyward dashboard``: serve the app on this machine, print its URL, stop on Ctrl-C.

The server file (``SKYWARD_HOME/dashboard/server.json``, 0600) says where the dashboard
listens and its token; running programs read it to register their pools (``hook``). It is
removed when the server stops.

``--open`` hands the browser the path of a 0600 page beside it (``open-*.html``), never a URL
with the token: every local user can read every process's command line. The page posts a
one-time code to ``/login``, which the server exchanges once for a session (app.py); the page
is removed once the code expires, or when the server stops.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from skyward.errors import ConfigError
from skyward.named.browser import open_in_browser, write_open_page

from .hook import running_server, server_file

INSTALL = "pip install 'skyward[dashboard]'"


def check_installed() -> None:
    """Raise a ConfigError that says how to install the server's packages when they are missing."""
    missing = []
    for module in ("starlette", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ConfigError(
            f"the dashboard needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed: run `{INSTALL}` (the dashboard extra), then `skyward dashboard` again."
        )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another port with "
            f"--port (0 picks a free one)."
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _write_server_file(info: dict[str, Any]) -> Path:
    path = server_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".server.", dir=path.parent)  # 0600: it holds the token
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)
    return path


def serve(host: str = "127.0.0.1", port: int = 8765, *, open_browser: bool = False,
          token: str | None = None, project: Path | None = None,
          announce: Any = None) -> None:
    """Run the dashboard until interrupted. ``announce(url)`` is called once it listens."""
    check_installed()
    import uvicorn

    from .app import CODE_TTL, build

    other = running_server()
    if other is not None and other.get("pid") != os.getpid():
        raise ConfigError(
            f"a dashboard already runs on this machine (pid {other['pid']}, {other['url']}); "
            f"open that one, or stop it first."
        )
    token = token or secrets.token_urlsafe(24)
    sock = _bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    base = f"http://{shown}:{bound_port}"
    app = build(token, project)
    hub = app.state.hub
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on",
                            access_log=False)
    server = uvicorn.Server(config)
    path = _write_server_file({"url": base, "token": token, "pid": os.getpid()})
    url = f"{base}/?token={token}"
    opener: Path | None = None
    try:
        if announce is not None:
            announce(url)
        if not _loopback(str(bound_host)):
            print(f"skyward: warning: listening on {host}, not loopback: anyone who can reach this "
                  f"machine and has the token can stop your pools.", file=sys.stderr, flush=True)
        if open_browser:
            # The 0600 page and its one-time code (skyward.named.browser, as `notebook --open`);
            # spent or not, the code is worthless after its ttl: the page goes then.
            opener = write_open_page(path.parent, f"{base}/login", hub.login_code())
            open_in_browser(opener, CODE_TTL)
        server.run(sockets=[sock])
    finally:
        if opener is not None:
            opener.unlink(missing_ok=True)
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        sock.close()
