"""One replica of a served app, on its node: the app under uvicorn on a Unix socket of the node.

``run`` is a streaming task of the pool (a generator): the endpoint dispatches it to a node's
rank, so it runs in one of the node's workers, with the node's environment and what the plugins
set there (the GPUs a node was given, the torch plugin's device). It

1. loads the app here (an import string is imported, a factory is called): a failure raises
   with this node's traceback, which the endpoint shows as it is;
2. serves it with uvicorn on a socket in a private (0700) folder of its own, on a thread of the
   worker, and waits for uvicorn's startup (the app's lifespan startup: loading the model) and,
   when ``ready`` names a path, for that path to answer 200 (the folders of replicas whose
   worker was killed are swept first: bootstrap.sweep, by their owner's lock);
3. yields ``{"socket": PATH, ...}`` once ready, then a beat every ``BEAT`` seconds while the
   server runs: the client's router reaches the socket the way the pool reaches the node
   (``Cluster.open_stream``); a beat is also where the endpoint's STOP closes the generator.

With ``listen=ADDRESS`` (an endpoint whose router runs on the pool's head node,
skyward.serve.head) the replica listens on a TCP port of that address instead (the node's
private address, never every address), and every request must carry the endpoint's bearer token
(``Bearer``, compared in constant time): it yields ``{"tcp": [ADDRESS, PORT], ...}``.

Closing it (the endpoint stops the replica, the pool closes) asks uvicorn to finish what it
serves and stop, and removes the folder. A server that stops by itself raises, with its last
log lines. Node-side: imports nothing of the client's parts.
"""

from __future__ import annotations

import collections
import hmac
import importlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from skyward.bootstrap import sweep
from skyward.errors import ServeError

BEAT = 0.5  # seconds between beats: how soon a STOP closes the replica
_LOG_LINES = 30


class _Tail(logging.Handler):
    """The last lines uvicorn logged, for the error that says why a replica did not start."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=_LOG_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            self.lines.append(text)
        except Exception:  # a log line must never break the server
            pass

    def text(self) -> str:
        return "\n".join(self.lines) or "(uvicorn logged nothing)"


def load(app: Any, factory: bool) -> Any:
    """The ASGI app: ``"module:attr"`` imported, a factory called, an app as it is."""
    if isinstance(app, str):
        module, _, attr = app.partition(":")
        if not module or not attr:
            raise ServeError(f"app {app!r} is not an import string: write it as 'module:attribute' "
                             f"(e.g. 'myapp:app'), or pass the app object itself.")
        target: Any = importlib.import_module(module)
        for part in attr.split("."):
            try:
                target = getattr(target, part)
            except AttributeError:
                raise ServeError(f"module {module!r} has no attribute {attr!r} (from app {app!r}) "
                                 f"on this node.") from None
        app = target
    return app() if factory else app


class Bearer:
    """ASGI middleware: an HTTP or websocket request must carry ``Authorization: Bearer TOKEN``
    (compared in constant time) or gets 401 (a websocket is closed before it opens); the header
    is taken out before the app sees the request, as the client's router does."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            got, rest = b"", []
            for name, value in scope.get("headers", ()):
                if name.lower() == b"authorization":
                    got = value
                else:
                    rest.append((name, value))
            if not hmac.compare_digest(got, self.expected):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b"unauthorized\n"})
                return
            scope = {**scope, "headers": rest}
        await self.app(scope, receive, send)


def _get(where: str | tuple[str, int], url: str, timeout: float, token: str | None = None) -> int:
    """The status of ``GET url`` on the Unix socket or TCP address ``where`` (0 when nothing
    answers)."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    try:
        family = socket.AF_UNIX if isinstance(where, str) else socket.AF_INET6 if ":" in where[0] else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(where)
            s.sendall(f"GET {url} HTTP/1.1\r\nHost: replica\r\n{auth}Connection: close\r\n\r\n".encode())
            head = s.recv(64)
        parts = head.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else 0
    except (OSError, ValueError):
        return 0


def run(app: Any, *, key: str, factory: bool = False, ready: str | None = None,
        ready_timeout: float = 300.0, listen: str | None = None,
        token: str | None = None) -> Iterator[dict[str, Any]]:
    """Serve ``app`` on this node until closed (see the module's doc)."""
    try:
        import uvicorn
    except ImportError:
        raise ServeError(
            f"replica {key}: uvicorn is not installed on node {socket.gethostname()} (each replica "
            f"runs the app under uvicorn, on its node). Add it, with the packages the app imports, "
            f"to the pool's image: sky.Compute(..., image=sky.Image(pip=['uvicorn', ...])).") from None
    began = time.monotonic()
    asgi = load(app, factory)
    sockets: list[socket.socket] | None = None
    if listen is not None:
        if token is not None:
            asgi = Bearer(asgi, token)
        try:
            sockets = [socket.create_server((listen, 0))]
        except OSError as e:
            raise ServeError(f"replica {key}: cannot listen on {listen} (the node's private address) on "
                             f"node {socket.gethostname()}: {e.strerror}.") from e
    # 0700: this user's only. Its lock is held while this worker lives, so that the next replica
    # of this machine removes it when the worker was killed (a lost node) before its finally ran.
    sweep.sweep(tempfile.gettempdir(), "skyward-serve-*")
    folder = tempfile.mkdtemp(prefix="skyward-serve-")
    held = sweep.hold(folder)
    path = os.path.join(folder, "replica.sock")
    where: str | tuple[str, int] = (listen, int(sockets[0].getsockname()[1])) if listen and sockets else path
    tail = _Tail()
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error")]
    for lg in loggers:
        lg.addHandler(tail)
    config = uvicorn.Config(asgi, uds=None if sockets else path, lifespan="auto", log_config=None,
                            access_log=False, log_level="info", timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, args=(sockets,), name=f"skyward-replica-{key}", daemon=True)
    try:
        thread.start()
        deadline = began + ready_timeout
        while not server.started:
            if not thread.is_alive():
                raise ServeError(f"replica {key}: the app's server stopped before it was ready "
                                 f"(its startup failed). Its last log lines:\n{tail.text()}")
            if time.monotonic() > deadline:
                raise ServeError(f"replica {key}: not started after ready_timeout={ready_timeout:g} s "
                                 f"(the app's startup is still running). Its last log lines:\n{tail.text()}")
            time.sleep(0.01)
        if ready:
            status = 0
            while (status := _get(where, ready, 5.0, token)) != 200:
                if not thread.is_alive():
                    raise ServeError(f"replica {key}: the app's server stopped while its readiness "
                                     f"check {ready} was polled. Its last log lines:\n{tail.text()}")
                if time.monotonic() > deadline:
                    raise ServeError(
                        f"replica {key}: {ready} did not answer 200 within ready_timeout="
                        f"{ready_timeout:g} s (last answer: {status or 'none'}). Its last log "
                        f"lines:\n{tail.text()}")
                time.sleep(0.1)
        address: dict[str, Any] = {"tcp": list(where)} if sockets else {"socket": path}
        yield {**address, "pid": os.getpid(), "seconds": time.monotonic() - began}
        while thread.is_alive():
            thread.join(BEAT)
            if thread.is_alive():
                yield {}
        raise ServeError(f"replica {key}: the app's server stopped. Its last log lines:\n{tail.text()}")
    finally:
        server.should_exit = True
        thread.join(15)
        for sock in sockets or ():
            sock.close()
        for lg in loggers:
            lg.removeHandler(tail)
        shutil.rmtree(folder, ignore_errors=True)
        sweep.release(held)
