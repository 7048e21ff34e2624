"""A port on this machine's loopback that carries the user's HTTP connections to a server on a node.

``skyward notebook`` serves JupyterLab (or marimo) on a node this way, and a router in front of
served replicas can carry its requests the same way: each connection goes through a stream the
caller opens (``Cluster.open_stream``: the pool's own SSH connection, a relay, a Unix socket).

What it does, whatever it carries:

* **admits** a connection only once its first request shows it comes from the user: the server's
  token (in the URL, or as ``Authorization: token|Bearer TOKEN``) or this forwarder's own session
  cookie, which it gives a browser that came with the token; anything else is refused here,
  without opening anything on the node;
* **bounds** what a stranger on this machine can take: connections waiting for their first
  request, and connections carried at once;
* **streams both ways**: request heads (with skyward's cookies taken out), bodies as their length
  or their chunks say, and an upgraded connection (a websocket) as it is;
* answers two things itself: its refusals, and ``POST /.skyward/login`` with a one-time code
  (a browser page opened for the user, never the token on a command line). Every page of its own
  carries ``X-Frame-Options: DENY`` and ``Content-Security-Policy: frame-ancestors 'none'``: no
  other site can frame it (clickjacking).
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..bootstrap.routes import Stream

LOGIN_PATH = "/.skyward/login"  # the forwarder's own: the one-time code of --open is posted here
_HEAD_LIMIT = 64 << 10
# On every page the forwarder answers itself: no other site may frame it.
FRAME_HEADERS = ("X-Frame-Options: DENY", "Content-Security-Policy: frame-ancestors 'none'")


class Served(Protocol):
    """The server a Forwarder carries connections to, as its admission and its login need it."""

    @property
    def title(self) -> str: ...  # its name, on the forwarder's pages ("JupyterLab")
    @property
    def token_query(self) -> str: ...  # the query parameter that carries its token
    @property
    def landing(self) -> str: ...  # the page a browser logged in with a one-time code goes to
    def login_path(self, token: str) -> str: ...  # its page that turns the token into its session cookie


class Forwarder:
    """127.0.0.1:PORT here, each admitted connection carried to the server through ``connect()``.

    Every local user can connect to a loopback port, so a connection is carried only once its
    first request shows it comes from the user: the forwarder's own session cookie
    (``skyward_PURPOSE_PORT``, a random value, never the token), or the server's token (in the
    URL the command printed, ``hint``, or as ``Authorization: token|Bearer TOKEN``). Anything else
    is refused here (403) without opening anything on the node. A browser that brings the token
    in the URL is given the cookie with the server's answer. The one request it
    answers itself is ``POST /.skyward/login`` with a one-time code (``codes``).

    Bounded: at most ``MAX_PENDING`` connections wait for their first request (``HEAD_DEADLINE``
    s each; past it the oldest waiting one is closed, so a stranger's flood cannot keep the user
    out), at most ``MAX_CARRIED`` are carried at once (two threads each). Every request carried
    loses the cookies named ``skyward_...`` (this forwarder's, and the dashboard's, which a
    browser sends to every port of 127.0.0.1): the server on the node never sees them."""

    MAX_PENDING = 16
    MAX_CARRIED = 64
    HEAD_DEADLINE = 10.0

    def __init__(self, connect: Callable[[], Stream], served: Served, token: str, port: int = 0, *,
                 purpose: str, hint: str) -> None:
        """``purpose``: what it serves, one word ("notebook"), in its cookie's name and its pages;
        ``hint``: where the user finds the URL with the token ("the URL that `skyward notebook`
        printed"), on its refusals."""
        from .browser import OneTimeCodes

        self._connect, self._served, self._token = connect, served, token
        self._purpose, self._hint = purpose, hint
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
        self.cookie = f"skyward_{purpose}_{self.port}"
        self._secret = secrets.token_urlsafe(32)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pending: dict[socket.socket, None] = {}  # oldest first
        self._carried = 0

    def __enter__(self) -> Forwarder:
        threading.Thread(target=self._accept, name=f"skyward-{self._purpose}-forward", daemon=True).start()
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
                _answer(client, 403, f"skyward: this port serves a {self._purpose} to the user who started it; "
                                     f"open {self._hint}")
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
                _answer(client, 502, f"skyward: cannot reach the {self._purpose} server on the node ({exc})")
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
        if same(next(iter(parse_qs(query).get(self._served.token_query) or []), None), self._token):
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
            _answer(client, 401, f"this login code was used already or has expired; open {self._hint} instead")
            return
        host = headers.get("host") or f"127.0.0.1:{self.port}"
        upstream = self._connect()
        try:
            upstream.sendall(f"GET {self._served.login_path(self._token)} HTTP/1.1\r\nHost: {host}\r\n"
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
        landing = self._served.landing
        page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" '
                f'content="0; url={landing}"><title>skyward</title></head><body><p><a href="{landing}">Open '
                f'{self._served.title}</a></p><script>location.replace("{landing}")</script></body></html>')
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
            f"Content-Length: {len(body)}", "Cache-Control: no-store", "Connection: close", *FRAME_HEADERS,
            *(extra or [])]
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
