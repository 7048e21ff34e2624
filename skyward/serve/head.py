"""An endpoint's router on the pool's head node (``pool.serve(app, on="head")``).

``run`` is a streaming task of the pool, dispatched to rank 0. It starts a ``Router``
(skyward.serve.router) listening on the head's private address, the one the pool's other nodes
reach it by, so that clients inside the pool's network can call the app. The replicas of such an
endpoint listen on TCP on their own node's private address and check the same bearer token
(skyward.serve.replica ``listen=``); this router passes the header on to them.

The client's endpoint still decides which replicas there are: it tells this router through a
control socket (a Unix socket in a private folder, reached with ``Cluster.open_stream`` like a
replica's), one JSON line a command, one JSON line an answer:

* ``{"add": KEY, "host": H, "port": P, "max_concurrency": N}``;
* ``{"remove": KEY, "lost": BOOL}``;
* ``{"drained": KEY, "timeout": SECONDS}`` -> ``{"ok": BOOL}``.

The task yields ``{"host", "port", "control"}`` once listening, then every ``BEAT`` seconds the
router's counts and the access records since the last beat (the client writes them to the
pool's access log). Closing it closes the router. Node-side: imports nothing of the client's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from skyward.bootstrap import sweep
from skyward.errors import ServeError

if TYPE_CHECKING:
    from skyward.serve.router import AccessRecord, Router, Upstream

BEAT = 0.5
_CHUNK = 1 << 16


def _upstream(key: str, host: str, port: int, max_concurrency: int) -> Upstream:
    from skyward.serve.router import Upstream

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(host, port, limit=_CHUNK)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    return Upstream(key, connect, max_concurrency)


def _command(router: Router, line: bytes) -> dict[str, Any]:
    try:
        cmd = json.loads(line)
        if "add" in cmd:
            router.add(_upstream(cmd["add"], cmd["host"], int(cmd["port"]), int(cmd.get("max_concurrency", 0))))
            return {"ok": True}
        if "remove" in cmd:
            router.remove(cmd["remove"], lost=bool(cmd.get("lost")))
            return {"ok": True}
        if "drained" in cmd:
            return {"ok": router.wait_drained(cmd["drained"], float(cmd.get("timeout", 60.0)))}
        return {"error": f"unknown command {line[:80]!r}"}
    except Exception as e:  # the client is told; the router goes on
        return {"error": f"{type(e).__name__}: {e}"}


def _serve_control(router: Router, server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return  # closed
        threading.Thread(target=_one_client, args=(router, conn), name="skyward-serve-control", daemon=True).start()


def _one_client(router: Router, conn: socket.socket) -> None:
    with conn, conn.makefile("rb") as lines:
        for line in lines:
            try:
                conn.sendall(json.dumps(_command(router, line)).encode() + b"\n")
            except OSError:
                return


def run(*, host: str, port: int, token: str | None, timeout: float, max_queue: int) -> Iterator[dict[str, Any]]:
    """Route requests on ``host:port`` of this node until closed (see the module's doc)."""
    try:
        from skyward.serve.router import Router
    except ImportError as e:
        raise ServeError(
            f"the endpoint's router cannot start on the head node {socket.gethostname()}: {e} (it parses "
            f"HTTP with httptools). Add it to the pool's image: sky.Image(pip=['uvicorn', 'httptools', "
            f"...]).") from None
    records: collections.deque[AccessRecord] = collections.deque()
    router = Router(token=token, timeout=timeout, max_queue=max_queue, access_log=records.append,
                    forward_auth=True)
    bound_host, bound_port = router.start(host, port)
    sweep.sweep(tempfile.gettempdir(), "skyward-serve-*")
    folder = tempfile.mkdtemp(prefix="skyward-serve-")  # 0700: this user's only
    held = sweep.hold(folder)
    path = os.path.join(folder, "control.sock")
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        control.bind(path)
        control.listen(16)
        threading.Thread(target=_serve_control, args=(router, control), name="skyward-serve-control",
                         daemon=True).start()
        yield {"host": bound_host, "port": bound_port, "control": path}
        while True:
            threading.Event().wait(BEAT)
            done = [records.popleft() for _ in range(len(records))]
            yield {"stats": router.stats(), "access": done}
    finally:
        with contextlib.suppress(OSError):
            control.shutdown(socket.SHUT_RDWR)
        control.close()
        router.close()
        shutil.rmtree(folder, ignore_errors=True)
        sweep.release(held)
