"""``skyward notebook NAME [--node N] [--marimo] [--open] [--port P]``: JupyterLab (or marimo)
on a node of a running named pool, in the pool's environment, served on a local port.

The server runs on the node the way a ``skyward ssh`` shell does (nodeaccess.py): in the node's
working directory, with the pool's environment (``Image.env``, the ``includes``, the pool's
virtualenv on SSH and cloud nodes, this machine's interpreter and the pool's overlay on Local
nodes), so its kernels import what the pool's tasks import and see the node's accelerators. When
the node lacks the server's package it is installed first, on every node, the way ``skyward
install`` does it (the pool's install mode: a wheelhouse sent from here for nodes with no index;
recorded in the pool's lock).

The server listens on the node's loopback only (notebookserver.py starts it there, with a token
that travels on its stdin). This command listens on this machine's loopback and carries each
connection to it through the pool's own connection: an SSH direct-tcpip channel on the node's
SSH connection (pinned host keys, the jump host), or a relay over an exec channel where the
node's sshd forbids forwarding; a Local node is this machine. It prints the local URL (with the
token: whoever has it has the server). ``--open`` gives the browser a 0600 page that posts a
one-time code to this command's forwarder (skyward.named.browser, as ``skyward dashboard
--open``), which logs the browser in to the server (the server's session cookie) and spends the
code: the token is never on a command line.

Ctrl-C (or SIGTERM) stops the server on the node, kernels included; so does ``skyward down``
(the node-side launcher sees the pool's agent go); so does this command dying (the launcher's
stdin ends). While it runs, the command is a client of the pool, like a shell: its lease is
renewed, and an asleep pool woken for it sleeps again after.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import queue
import secrets
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigError, ProviderError
from .cliout import EXIT_OK, err
from .nodeaccess import LocalNode, Node, Process, SSHNode, open_nodes

q = shlex.quote
LOGIN_PATH = "/.skyward/login"  # the forwarder's own: the one-time code of --open is posted here
_START_TIMEOUT = 240.0  # seconds the server may take to answer on the node (a cold start imports a lot)
_HEAD_LIMIT = 64 << 10


@dataclass(frozen=True)
class Flavor:
    """A notebook server: its package and how its token logs a browser in."""

    kind: str  # what notebookserver.py starts
    title: str
    package: str  # the requirement installed on the nodes when missing
    module: str  # what must import on the node
    landing: str  # the page to show once logged in
    token_query: str  # the query parameter the server takes its token from

    def login_path(self, token: str) -> str:
        return f"{self.landing}?{self.token_query}={token}"


JUPYTER = Flavor("jupyter", "JupyterLab", "jupyterlab", "jupyterlab", "/lab", "token")
MARIMO = Flavor("marimo", "marimo", "marimo", "marimo", "/", "access_token")


def add_notebook(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    p = command("notebook", "JupyterLab (or marimo) on a node of a running pool, in the pool's environment, "
                            "served on a local port through the pool's connection; Ctrl-C stops it.")
    p.add_argument("name", help="the pool's name")
    p.add_argument("--node", type=int, default=0, help="the node's rank, 0 to nodes-1 (default 0)")
    p.add_argument("--marimo", action="store_true", help="a marimo server instead of JupyterLab")
    p.add_argument("--open", action="store_true",
                   help="open it in a browser (logged in with a one-time code, never the token on a command line)")
    p.add_argument("--port", type=int, default=0, help="the local port to serve on (default 0: a free one)")
    p.add_argument("--no-wake", action="store_true",
                   help="refuse with an error when the pool is asleep, instead of waking it for the notebook")
    p.set_defaults(handler=cmd_notebook)


def cmd_notebook(args: argparse.Namespace) -> int:
    from ..records import audit
    from .wake import awake

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: a port goes from 0 to 65535 (0 picks a free one).")
    flavor = MARIMO if args.marimo else JUPYTER
    with _stops_on_sigterm(), awake(args.name, wake=not args.no_wake, command="skyward notebook", node=args.node):
        _ensure_installed(args.name, args.node, flavor)
        with open_nodes(args.name, args.node) as (record, nodes):
            node = nodes[0]
            started = time.time()
            reason = _serve(args, flavor, node, record)
    audit.append(args.name, "notebook", record.get("id", ""), node=node.rank, hostname=node.hostname,
                 server=flavor.kind, seconds=round(time.time() - started, 1), stopped=reason)
    return EXIT_OK


@contextlib.contextmanager
def _stops_on_sigterm() -> Iterator[None]:
    """SIGTERM ends the command like Ctrl-C: the server on the node is stopped on the way out."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    saved = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved)


# -- the server's package on the node ------------------------------------------------------------
def _ensure_installed(name: str, rank: int, flavor: Flavor) -> None:
    from .install import install

    with open_nodes(name, rank) as (_, nodes):
        code, _out, _err = nodes[0].run(nodes[0].activate() + f"exec python -c {q(f'import {flavor.module}')}")
    if code == 0:
        return
    err(f"{flavor.title} is not installed on pool {name!r}: installing {flavor.package} on its nodes, "
        f"as `skyward install {name} {flavor.package}` would (recorded in the pool's lock)")
    # What the install says goes to stderr: this command's stdout is the notebook's URL.
    with contextlib.redirect_stdout(sys.stderr):
        failed = install(name, (flavor.package,), timeout=900.0)
    if failed:
        raise ProviderError(f"pool {name!r}: {flavor.package} could not be installed on its nodes (see above); "
                            f"`skyward install {name} {flavor.package}` tries again and says why.")


# -- the server on the node ---------------------------------------------------------------------
def _launch_script(node: Node, flavor: Flavor, record: dict[str, Any]) -> str:
    described = ((record.get("cluster") or {}).get("nodes") or [])
    mine: dict[str, Any] = next((n for n in described if int(n.get("index", -1)) == node.index), {})
    agent = mine.get("agent_pid") if isinstance(node, SSHNode) else mine.get("pid")
    watch = f" --watch-pid {int(agent)}" if agent else ""
    return (f"{node.activate()}exec python -m skyward.named.notebookserver {flavor.kind} "
            f'--root "$PWD"{watch}')


class _Server:
    """The launcher on the node (notebookserver.py): its JSON lines, and stopping it."""

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.lines: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._ended = False  # the launcher's output ended (it exited)
        self._stopped = False
        self._reader = threading.Thread(target=self._read, name="skyward-notebook-server", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        pending = b""
        try:
            while chunk := self.proc.read():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    with contextlib.suppress(ValueError):
                        self.lines.put(json.loads(line))
        except (OSError, EOFError, ValueError):
            pass
        finally:
            self.lines.put(None)

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The launcher's next message (None: it ended); polls so that Ctrl-C gets through."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self.lines.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError from None
                continue
            self._ended = self._ended or message is None
            return message

    def stop(self) -> str | None:
        """End the launcher's stdin: it stops the server (and its kernels) and exits. Its last
        word (why it stopped), when it said one within 30 s. Once done, doing it again is nothing."""
        if self._stopped:
            return None
        self._stopped = True
        self.proc.close_stdin()
        said = None
        deadline = time.monotonic() + 30
        while not self._ended and time.monotonic() < deadline:
            try:
                message = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if message is None:
                self._ended = True
            elif "stopped" in message:
                said = str(message["stopped"])
        if not self._ended:
            self.proc.kill()
            return said
        self._reader.join(5)
        self.proc.wait()
        return said


def _serve(args: argparse.Namespace, flavor: Flavor, node: Node, record: dict[str, Any]) -> str:
    token = secrets.token_urlsafe(32)
    server = _Server(node.start(_launch_script(node, flavor, record)))
    page = None
    try:
        server.proc.write((token + "\n").encode())  # the token on the launcher's stdin, never argv
        try:
            first = server.next(_START_TIMEOUT)
        except TimeoutError:
            raise ProviderError(f"{node.label} of pool {args.name!r}: {flavor.title} did not answer within "
                                f"{_START_TIMEOUT:g} s; its log is in {node.cwd}/.skyward-notebook/.") from None
        if first is None or "port" not in first:
            said = (first or {}).get("error") or f"it ended: {server.proc.stderr.strip()[-2000:] or 'no output'}"
            tail = (first or {}).get("tail") or ""
            raise ProviderError(
                f"{node.label} of pool {args.name!r}: {flavor.title} did not start ({said})."
                + (f" Its log ({first.get('log')}) ends with:\n{tail.rstrip()}" if tail and first else ""))
        port = int(first["port"])
        with Forwarder(lambda: _connect(node, port), flavor, token, args.port) as forward:
            url = forward.base + flavor.login_path(token)
            if args.json:
                # One line, as soon as it serves: a program reads it and goes on.
                print(json.dumps({"url": url, "name": args.name, "node": node.rank, "hostname": node.hostname,
                            "server": flavor.kind, "cwd": node.cwd, "log": first.get("log")}), flush=True)
            else:
                print(f"{flavor.title} on {node.label} of pool {args.name!r}, in {node.cwd}: {url}", flush=True)
            err(f"(the token in this URL opens the server to whoever has it; Ctrl-C stops the server on "
                f"{node.label})")
            sys.stdout.flush()
            if args.open:
                from ..paths import skyward_home
                from .browser import open_in_browser, write_open_page

                page = write_open_page(skyward_home() / "notebook", forward.base + LOGIN_PATH,
                                       forward.codes.issue(), what=flavor.title)
                open_in_browser(page)
            try:
                while True:
                    message = server.next(365 * 86400.0)
                    if message is None:  # the launcher ended without a word: killed with the pool?
                        why = ("the pool was stopped" if _pool_gone(args.name, record.get("id"))
                               else server.proc.stderr.strip() or "no reason given")
                        err(f"the {flavor.title} server on {node.label} stopped: {why}")
                        return why
                    if "stopped" in message:
                        why = str(message["stopped"])
                        err(f"the {flavor.title} server on {node.label} stopped: {why}")
                        return why
            except KeyboardInterrupt:
                err(f"stopping the {flavor.title} server on {node.label}")
                said = server.stop()
                err(f"stopped ({said})" if said else "stopped")
                return "Ctrl-C"
    finally:
        if page is not None:
            page.unlink(missing_ok=True)
        server.stop()


def _pool_gone(name: str, pool_id: Any, wait: float = 15.0) -> bool:
    """Whether pool ``name`` (``pool_id``) was stopped: `skyward down` stops the nodes' processes
    first and forgets the record after, so its record may go a moment later."""
    from .registry import read

    deadline = time.monotonic() + wait
    while True:
        current = read(name)
        if current is None or current.get("id") != pool_id:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


# -- this machine's port, carried to the node's ---------------------------------------------------
class Stream(Protocol):
    def recv(self, n: int) -> bytes: ...
    def sendall(self, data: bytes) -> None: ...
    def shutdown(self, how: int) -> None: ...
    def close(self) -> None: ...


def _connect(node: Node, port: int) -> Stream:
    """A stream to ``port`` on the node's loopback, through the pool's connection to the node."""
    if isinstance(node, LocalNode):
        return socket.create_connection(("127.0.0.1", port))
    assert isinstance(node, SSHNode) and node.remote is not None
    import paramiko

    try:
        return node.remote.tunnel(port)
    except paramiko.ChannelException:  # the node's sshd forbids TCP forwarding: a relay on its stdio
        python = f"{node.venv}/bin/python" if node.venv else "python3"
        return node.remote.relay(f"{q(python)} -m skyward.bootstrap.relay {int(port)}")


class Forwarder:
    """127.0.0.1:PORT here, each admitted connection carried to the server through ``connect()``.

    Every local user can connect to a loopback port, so a connection is carried only once its
    first request shows it comes from the user: the forwarder's own session cookie
    (``skyward_notebook_PORT``, a random value, never the token), or the server's token (in the
    URL ``skyward notebook`` printed, or as ``Authorization: token|Bearer TOKEN``). Anything else
    is refused here (403) without opening anything on the node. A browser that brings the token
    in the URL is given the cookie with the server's answer. The one request it
    answers itself is ``POST /.skyward/login`` with a one-time code (``--open``).

    Bounded: at most ``MAX_PENDING`` connections wait for their first request (``HEAD_DEADLINE``
    s each; past it the oldest waiting one is closed, so a stranger's flood cannot keep the user
    out), at most ``MAX_CARRIED`` are carried at once (two threads each). Every request carried
    loses the cookies named ``skyward_...`` (this forwarder's, and the dashboard's, which a
    browser sends to every port of 127.0.0.1): the server on the node never sees them."""

    MAX_PENDING = 16
    MAX_CARRIED = 64
    HEAD_DEADLINE = 10.0

    def __init__(self, connect: Callable[[], Stream], flavor: Flavor, token: str, port: int = 0) -> None:
        from .browser import OneTimeCodes

        self._connect, self._flavor, self._token = connect, flavor, token
        self.codes = OneTimeCodes()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind(("127.0.0.1", port))
        except OSError as exc:
            self._sock.close()
            raise ConfigError(f"cannot listen on 127.0.0.1:{port} ({exc.strerror or exc}); pick another "
                              f"port with --port (0 picks a free one).") from None
        self._sock.listen(64)
        self.port = int(self._sock.getsockname()[1])
        self.base = f"http://127.0.0.1:{self.port}"
        self.cookie = f"skyward_notebook_{self.port}"
        self._secret = secrets.token_urlsafe(32)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pending: dict[socket.socket, None] = {}  # oldest first
        self._carried = 0

    def __enter__(self) -> Forwarder:
        threading.Thread(target=self._accept, name="skyward-notebook-forward", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                if len(self._pending) >= self.MAX_PENDING:  # the oldest waiting one goes, not the newest
                    oldest = next(iter(self._pending))
                    del self._pending[oldest]
                    with contextlib.suppress(OSError):
                        oldest.shutdown(socket.SHUT_RDWR)
                self._pending[client] = None
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        upstream: Stream | None = None
        counted = False
        try:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = _Reader(client)
            try:
                head = reader.head(time.monotonic() + self.HEAD_DEADLINE)
            finally:
                with self._lock:
                    self._pending.pop(client, None)
            if head is None:
                return
            line = head.split(b"\r\n", 1)[0]
            if line.startswith(f"POST {LOGIN_PATH} ".encode()) or line.startswith(f"POST {LOGIN_PATH}?".encode()):
                self._login(client, head, reader)
                return
            admitted = self._admitted(head)
            if admitted is None:
                _answer(client, 403, "skyward: this port serves a notebook to the user who started it; open the "
                                     "URL that `skyward notebook` printed")
                return
            with self._lock:
                if self._carried >= self.MAX_CARRIED:
                    busy = True
                else:
                    busy, self._carried, counted = False, self._carried + 1, True
            if busy:
                _answer(client, 503, f"skyward: {self.MAX_CARRIED} connections are carried already; try again")
                return
            try:
                upstream = self._connect()
            except Exception as exc:  # the node went away: say so to the browser, keep serving
                _answer(client, 502, f"skyward: cannot reach the notebook server on the node ({exc})")
                return
            # The token in the URL (a browser opening the printed URL): the server's first answer
            # also gives it this forwarder's cookie, for the requests that come without the token.
            cookie = f"Set-Cookie: {self._set_cookie()}\r\n".encode() if admitted == "url" else None
            _pump(client, upstream, lambda: _send_requests(reader, upstream, head), cookie)
        except OSError:
            pass
        finally:
            if counted:
                with self._lock:
                    self._carried -= 1
            if upstream is not None:
                with contextlib.suppress(OSError, EOFError):
                    upstream.close()
            with contextlib.suppress(OSError):
                client.close()

    def _set_cookie(self) -> str:
        return f"{self.cookie}={self._secret}; HttpOnly; SameSite=Strict; Path=/"

    def _admitted(self, head: bytes) -> str | None:
        """How the request shows it is the user's: "cookie", "url" (the token in the query),
        "header" (the token in ``Authorization``); None: it does not."""

        def same(given: str | None, wanted: str) -> bool:
            return given is not None and hmac.compare_digest(given.encode(), wanted.encode())

        headers = _headers(head)
        if same(_cookies(headers.get("cookie", "")).get(self.cookie), self._secret):
            return "cookie"
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() in ("token", "bearer") and same(given.strip(), self._token):
            return "header"
        target = head.split(b"\r\n", 1)[0].split(b" ")
        query = urlsplit(target[1].decode("latin-1")).query if len(target) > 1 else ""
        if same(next(iter(parse_qs(query).get(self._flavor.token_query) or []), None), self._token):
            return "url"
        return None

    def _login(self, client: socket.socket, head: bytes, reader: _Reader) -> None:
        """The --open page's post: a one-time code for the server's own session cookie, which this
        side fetches with the token (through the tunnel) and hands to the browser, with this
        forwarder's cookie."""
        headers = _headers(head)
        try:
            length = min(int(headers.get("content-length", "0") or 0), 1024)  # unauthenticated: a code is small
        except ValueError:
            length = 0
        body = reader.take(length, time.monotonic() + 10)
        code = (parse_qs(body[:1024].decode("latin-1")).get("code") or [""])[0]
        if not code or not self.codes.redeem(code):
            _answer(client, 401, "this login code was used already or has expired; open the URL that "
                                 "`skyward notebook` printed instead")
            return
        host = headers.get("host") or f"127.0.0.1:{self.port}"
        upstream = self._connect()
        try:
            upstream.sendall(f"GET {self._flavor.login_path(self._token)} HTTP/1.1\r\nHost: {host}\r\n"
                             f"Connection: close\r\n\r\n".encode())
            reply = b""
            while b"\r\n\r\n" not in reply and len(reply) < _HEAD_LIMIT:
                chunk = upstream.recv(65536)
                if not chunk:
                    break
                reply += chunk
        finally:
            upstream.close()
        cookies = [line.split(":", 1)[1].strip() for line in reply.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
                   if line.lower().startswith("set-cookie:")]
        landing = self._flavor.landing
        page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" '
                f'content="0; url={landing}"><title>skyward</title></head><body><p><a href="{landing}">Open '
                f'{self._flavor.title}</a></p><script>location.replace("{landing}")</script></body></html>')
        # A page that goes on by itself, not a redirect: the post came from a file (another site),
        # and the session cookie is sent on a same-site navigation.
        _answer(client, 200, page, extra=[f"Set-Cookie: {c}" for c in [*cookies, self._set_cookie()]], html=True)


class _Reader:
    """A client socket read a request head at a time, with what came after it kept."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def _more(self, deadline: float | None) -> bool:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(1 << 16)
        finally:
            if deadline is not None:
                self.sock.settimeout(None)
        self.buffer += chunk
        return bool(chunk)

    def head(self, deadline: float | None = None) -> bytes | None:
        """The next request's head (through its blank line); None when the client is done."""
        while b"\r\n\r\n" not in self.buffer:
            if len(self.buffer) > _HEAD_LIMIT or not self._more(deadline):
                return None
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        return head + b"\r\n\r\n"

    def take(self, n: int, deadline: float | None = None) -> bytes:
        while len(self.buffer) < n and self._more(deadline):
            pass
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if len(self.buffer) > _HEAD_LIMIT or not self._more(None):
                raise EOFError
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line + b"\r\n"

    def copy(self, n: int, out: Stream) -> None:
        while n > 0:
            if not self.buffer and not self._more(None):
                raise EOFError
            part, self.buffer = self.buffer[:n], self.buffer[n:]
            out.sendall(part)
            n -= len(part)


def _send_requests(reader: _Reader, upstream: Stream, head: bytes | None) -> None:
    """Pass the client's requests on, each head without skyward's cookies, each body as its
    length (or its chunks) says; an upgraded connection (a websocket) is passed on as it is."""
    while head is not None:
        upstream.sendall(_without_skyward_cookies(head))
        headers = _headers(head)
        if headers.get("upgrade") and "upgrade" in headers.get("connection", "").lower():
            if reader.buffer:
                upstream.sendall(reader.buffer)
                reader.buffer = b""
            while data := reader.sock.recv(1 << 16):
                upstream.sendall(data)
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size_line = reader.line()
                upstream.sendall(size_line)
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:  # the trailers, then the blank line
                    while (trailer := reader.line()) != b"\r\n":
                        upstream.sendall(trailer)
                    upstream.sendall(b"\r\n")
                    break
                reader.copy(size + 2, upstream)
        else:
            reader.copy(int(headers.get("content-length") or 0), upstream)
        head = reader.head()


def _cookies(header: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in header.split(";"):
        name, sep, value = pair.strip().partition("=")
        if sep:
            out.setdefault(name.strip(), value.strip())
    return out


def _without_skyward_cookies(head: bytes) -> bytes:
    """``head`` with every cookie named ``skyward...`` taken out of its Cookie lines."""
    lines = head[:-4].split(b"\r\n")
    kept = [lines[0]]
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"cookie":
            pairs = [p for p in value.split(b";") if p.strip() and not p.strip().lower().startswith(b"skyward")]
            if not pairs:
                continue
            line = b"Cookie: " + b"; ".join(p.strip() for p in pairs)
        kept.append(line)
    return b"\r\n".join(kept) + b"\r\n\r\n"


def _headers(head: bytes) -> dict[str, str]:
    out = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def _answer(client: socket.socket, status: int, text: str, *, extra: list[str] | None = None,
            html: bool = False) -> None:
    reason = {200: "OK", 401: "Unauthorized", 403: "Forbidden", 502: "Bad Gateway",
              503: "Service Unavailable"}.get(status, "")
    body = text.encode()
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {'text/html' if html else 'text/plain'}; charset=utf-8",
            f"Content-Length: {len(body)}", "Cache-Control: no-store", "Connection: close", *(extra or [])]
    client.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)


def _pump(client: socket.socket, upstream: Stream, send: Callable[[], None], header: bytes | None = None) -> None:
    """Bytes both ways until both sides are done: ``send`` passes the client's on (in a thread of
    its own), the server's are copied back here (``header``, a header line, added to the first
    answer's head); the end of one direction is passed on."""

    def up() -> None:
        try:
            send()
        except (OSError, EOFError, ValueError, TimeoutError):
            pass
        finally:
            with contextlib.suppress(OSError, EOFError):
                upstream.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=up, daemon=True)
    sender.start()
    try:
        head = b""
        while header is not None and b"\r\n" not in head and len(head) < _HEAD_LIMIT:
            data = upstream.recv(1 << 16)
            if not data:
                break
            head += data
        if header is not None:
            status, sep, rest = head.partition(b"\r\n")
            client.sendall(status + sep + header + rest if sep else head)
        while data := upstream.recv(1 << 16):
            client.sendall(data)
    except (OSError, EOFError):
        pass
    finally:
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)
    # The server is done; a browser holding its side open (keep-alive) is closed by the caller.
    sender.join(1)
