"""``skyward notebook``'s local port (``notebook.Forwarder``) against a stand-in for the node's
server: it carries only the user's connections, boundedly, and never passes skyward's cookies on
(300 connections of a stranger made 300 connections to the node and 424 threads, and
the dashboard's cookie, which a browser sends to every port of 127.0.0.1, reached the node)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from skyward.named.notebook import JUPYTER, Forwarder

TOKEN = "the-notebook-token"


class Node:
    """The node's server: answers every request head with a 200, keeps what it received."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.opened = 0
        self.received: list[bytes] = []  # per connection, everything it got
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def connect(self) -> socket.socket:
        with self.lock:
            self.opened += 1
        return socket.create_connection(("127.0.0.1", self.port))

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with self.lock:
            index = len(self.received)
            self.received.append(b"")
        answered = False
        with conn:
            while data := conn.recv(65536):
                with self.lock:
                    self.received[index] += data
                if not answered and b"\r\n\r\n" in self.received[index]:
                    answered = True
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


@contextlib.contextmanager
def forwarder() -> Iterator[tuple[Forwarder, Node]]:
    node = Node()
    with Forwarder(node.connect, JUPYTER, TOKEN) as forward:
        yield forward, node
    node.sock.close()


def _ask(port: int, request: bytes, timeout: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


_FLOOD = """
import socket, sys
port, n, say = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "request"
held = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    if say:
        s.sendall(b"GET /lab HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nCookie: skyward_notebook_%d=guess\\r\\n\\r\\n" % port)
    held.append(s)
print("held", flush=True)
sys.stdin.readline()
answers = {}
for s in held:
    try:
        first = s.recv(64).split(b"\\r\\n")[0].decode() or "closed"
    except OSError as e:
        first = type(e).__name__
    answers[first] = answers.get(first, 0) + 1
print(answers, flush=True)
"""


def _as_another_user() -> list[str]:
    if os.geteuid() == 0 and shutil.which("setpriv"):
        return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    return []  # the same checks as this user: the forwarder does not look at who connects


@pytest.mark.parametrize("say", ["request", "nothing"])
def test_a_strangers_300_connections_open_nothing_on_the_node(say: str) -> None:
    with forwarder() as (forward, node):
        threads_before = threading.active_count()
        flood = subprocess.Popen([*_as_another_user(), sys.executable, "-c", _FLOOD, str(forward.port), "300", say],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert flood.stdout is not None and flood.stdin is not None
            assert flood.stdout.readline().strip() == "held", flood.stderr.read() if flood.stderr else ""
            time.sleep(1.0)  # let the forwarder take them all
            threads = threading.active_count() - threads_before
            assert node.opened == 0, f"{node.opened} connections to the node for a stranger"
            assert threads <= 20, f"{threads} threads for a stranger's connections"
            # The user is let in while the flood holds its connections.
            answer = _ask(forward.port, f"GET /api/contents HTTP/1.1\r\nHost: x\r\nAuthorization: token {TOKEN}"
                                        f"\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 200"), answer
            assert node.opened == 1
            flood.stdin.write("\n")
            flood.stdin.flush()
            said = flood.stdout.readline()
        finally:
            flood.kill()
            flood.wait()
        if say == "request":
            assert "'HTTP/1.1 403 Forbidden': 300" in said, said


def test_a_request_without_the_token_or_the_cookie_is_refused_here() -> None:
    with forwarder() as (forward, node):
        for head in (b"GET /lab HTTP/1.1\r\nHost: x\r\n\r\n",
                     b"GET /lab?token=guess HTTP/1.1\r\nHost: x\r\n\r\n",
                     b"GET /api/contents HTTP/1.1\r\nAuthorization: token guess\r\n\r\n",
                     f"GET /lab HTTP/1.1\r\nCookie: skyward_notebook_{forward.port}={TOKEN}\r\n\r\n".encode()):
            assert _ask(forward.port, head).startswith(b"HTTP/1.1 403"), head
        assert node.opened == 0


def test_skywards_cookies_never_reach_the_node() -> None:
    with forwarder() as (forward, node):
        # The printed URL: the server's answer, with this forwarder's cookie added.
        first = _ask(forward.port, f"GET /lab?token={TOKEN} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert first.startswith(b"HTTP/1.1 200 OK\r\nSet-Cookie: ") and b"\r\nContent-Length: 2\r\n\r\n" in first
        cookie = next(line.split(b": ", 1)[1].split(b";")[0] for line in first.split(b"\r\n")
                      if line.lower().startswith(b"set-cookie:"))
        assert cookie.startswith(f"skyward_notebook_{forward.port}=".encode()) and TOKEN.encode() not in cookie
        assert node.received[0].startswith(f"GET /lab?token={TOKEN} ".encode())
        node.received.clear()
        # Three requests on one connection, each with the dashboard's cookie among the server's own.
        cookies = b"_xsrf=abc; skyward_session_8765=dashboard-session; " + cookie + b"; username-127-0-0-1=jupyter"
        requests = (b"GET /lab HTTP/1.1\r\nHost: x\r\nCookie: " + cookies + b"\r\n\r\n"
                    b"PUT /api/contents/a HTTP/1.1\r\nHost: x\r\ncookie: " + cookies + b"\r\nContent-Length: 11\r\n\r\n"
                    b"hello world"
                    b"POST /api/x HTTP/1.1\r\nHost: x\r\nCookie: " + cookie + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nchunk\r\n0\r\n\r\n"
                    b"GET /end HTTP/1.1\r\nHost: x\r\nCookie: skyward_session_1=x\r\n\r\n")
        assert _ask(forward.port, requests).startswith(b"HTTP/1.1 200")
        deadline = time.monotonic() + 10
        while b"GET /end" not in b"".join(node.received) and time.monotonic() < deadline:
            time.sleep(0.05)
        (got,) = node.received
        assert got == (b"GET /lab HTTP/1.1\r\nHost: x\r\nCookie: _xsrf=abc; username-127-0-0-1=jupyter\r\n\r\n"
                       b"PUT /api/contents/a HTTP/1.1\r\nHost: x\r\nCookie: _xsrf=abc; username-127-0-0-1=jupyter\r\n"
                       b"Content-Length: 11\r\n\r\nhello world"
                       b"POST /api/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nchunk\r\n0\r\n\r\n"
                       b"GET /end HTTP/1.1\r\nHost: x\r\n\r\n"), got
        assert b"skyward" not in got


def test_every_page_of_the_forwarders_own_forbids_framing() -> None:
    """Its refusals (403, 401, 502) and its login page (200) carry X-Frame-Options and the CSP
    frame-ancestors rule: no other site can frame them. The server's answers are its own."""

    def headers(answer: bytes) -> dict[bytes, bytes]:
        lines = answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines)}

    def framed_by_nobody(answer: bytes, status: bytes) -> None:
        assert answer.startswith(b"HTTP/1.1 " + status), answer
        got = headers(answer)
        assert got.get(b"x-frame-options") == b"DENY", answer
        assert got.get(b"content-security-policy") == b"frame-ancestors 'none'", answer

    with forwarder() as (forward, _node):
        framed_by_nobody(_ask(forward.port, b"GET /lab HTTP/1.1\r\nHost: x\r\n\r\n"), b"403")
        login = b"POST /.skyward/login HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\ncode=%s"
        framed_by_nobody(_ask(forward.port, login % (len(b"code=spent"), b"spent")), b"401")
        code = forward.codes.issue().encode()
        framed_by_nobody(_ask(forward.port, login % (len(b"code=" + code), code)), b"200")
        # The server's own answers pass as they are.
        carried = _ask(forward.port, f"GET /lab?token={TOKEN} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert carried.startswith(b"HTTP/1.1 200") and b"x-frame-options" not in headers(carried), carried

    def unreachable() -> socket.socket:
        raise ConnectionRefusedError("the node went away")

    with Forwarder(unreachable, JUPYTER, TOKEN) as forward:
        framed_by_nobody(_ask(forward.port, f"GET /lab?token={TOKEN} HTTP/1.1\r\nHost: x\r\n\r\n".encode()), b"502")
