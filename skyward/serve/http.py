"""HTTP/1.1 framing for the serving router: requests read from a client connection as events,
the head sent on to a replica, a replica's response followed to its end, the router's own answers.

Parsing is httptools (llhttp, the parser uvicorn uses). Bytes pass through: a response is
forwarded exactly as the replica wrote it; a request body keeps its bytes, and a chunked one is
re-framed chunk by chunk (httptools hands over the decoded chunks; trailers are not forwarded).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque

import httptools

END = b""  # the event after a request's last body chunk (a body chunk is never empty)

HEAD_LIMIT = 64 * 1024  # request line plus headers; past it the request is refused (431)

REASONS = {400: "Bad Request", 401: "Unauthorized", 431: "Request Header Fields Too Large",
           502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}

_DROPPED = frozenset({b"connection", b"keep-alive", b"proxy-connection"})
# the router answers "100 Continue" itself, when it starts reading the body
_NOT_SENT = frozenset({b"expect"})


def answer(status: int, text: str, *, close: bool, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """The router's own response: a short plain-text body."""
    body = (text + "\n").encode()
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
             "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in extra]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class RequestHead:
    __slots__ = ("chunked", "has_body", "headers", "keep_alive", "method", "upgrade", "url")

    def __init__(self, method: str, url: bytes, headers: list[tuple[bytes, bytes]], keep_alive: bool,
                 upgrade: bool) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.keep_alive = keep_alive
        self.upgrade = upgrade
        self.chunked = False
        self.has_body = False
        for name, value in headers:
            low = name.lower()
            if low == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = self.has_body = True
            elif low == b"content-length" and value.strip() not in (b"0", b""):
                self.has_body = True

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def upstream(self, *, strip_auth: bool, client: str) -> bytes:
        """The head sent to the replica: the client's, without its hop-by-hop connection
        headers (kept for an upgrade), without Authorization when the router checked it, with
        the client's address added to X-Forwarded-For."""
        out = [self.method.encode(), b" ", self.url, b" HTTP/1.1\r\n"]
        forwarded = b""
        for name, value in self.headers:
            low = name.lower()
            if ((low in _DROPPED and not self.upgrade) or low in _NOT_SENT
                    or (strip_auth and low == b"authorization")):
                continue
            if low == b"x-forwarded-for":
                forwarded = value + b", "
                continue
            out += (name, b": ", value, b"\r\n")
        out += (b"X-Forwarded-For: ", forwarded, client.encode(), b"\r\n\r\n")
        return b"".join(out)


class ClientReader:
    """A client connection's bytes as events: a RequestHead, body chunks (bytes), END. After an
    upgrade request, ``upgraded`` holds the bytes that followed its head."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.parser = httptools.HttpRequestParser(self)
        self.events: deque[RequestHead | bytes] = deque()
        self.upgraded: bytes | None = None
        self._url: list[bytes] = []
        self._headers: list[tuple[bytes, bytes]] = []
        self._size = 0

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url, self._headers, self._size = [], [], 0

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._grow(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._grow(len(name) + len(value))

    def _grow(self, n: int) -> None:
        self._size += n
        if self._size > HEAD_LIMIT:
            raise HeadTooLarge()

    def on_headers_complete(self) -> None:
        p = self.parser
        self.events.append(RequestHead(p.get_method().decode(), b"".join(self._url), self._headers,
                                       p.should_keep_alive(), p.should_upgrade()))

    def on_body(self, body: bytes) -> None:
        self.events.append(body)

    def on_message_complete(self) -> None:
        self.events.append(END)

    async def next(self) -> RequestHead | bytes | None:
        """The next event, or None when the client closed (or the connection was upgraded)."""
        while not self.events:
            if self.upgraded is not None:
                return None
            data = await self.reader.read(65536)
            if not data:
                return None
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade as up:
                self.upgraded = data[up.args[0]:]
        return self.events.popleft()

    def body_buffered(self) -> bool:
        """Whether the current request's whole body (up to END) has already been read."""
        return END in self.events


class HeadTooLarge(Exception):
    pass


class Refused(Exception):
    """The router answers the request itself (401, 502, 503, 504...)."""

    def __init__(self, status: int, text: str, extra: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(text)
        self.status, self.text, self.extra = status, text, extra


class UpstreamConn:
    """One connection to a replica, with a response parser that follows it across requests."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = httptools.HttpResponseParser(self)
        self.idle_since = 0.0
        self.head_only = False
        self.begin(head_only=False)

    def begin(self, *, head_only: bool) -> None:
        if self.head_only:  # the parser still waits for the body a HEAD answer announced
            self.parser = httptools.HttpResponseParser(self)
        self.head_only = head_only
        self.status = 0
        self.headed = False  # the head of the final (not 1xx) response was parsed
        self.complete = False
        self.upgraded = False
        self.reusable = True
        self.framed = False  # Content-Length or chunked: the end is known without a close
        self.close_after = False  # the response says Connection: close

    def on_header(self, name: bytes, value: bytes) -> None:
        low = name.lower()
        if low in (b"content-length", b"transfer-encoding"):
            self.framed = True
        elif low == b"connection" and b"close" in value.lower():
            self.close_after = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.framed = self.close_after = False  # an interim answer; the final one follows
            return
        self.status, self.headed = status, True
        if self.head_only or status in (204, 304):
            self.complete = True

    def on_message_complete(self) -> None:
        if self.headed:
            self.complete = True
            if not self.parser.should_keep_alive():
                self.reusable = False

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.upgraded = self.complete = True
            self.reusable = False

    def usable(self, now: float, max_idle: float) -> bool:
        return (not self.reader.at_eof() and not self.writer.is_closing()
                and now - self.idle_since < max_idle)

    def abort(self) -> None:
        self.reusable = False
        self.writer.transport.abort()
