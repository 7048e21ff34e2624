"""Many links in one stream: the first host of a fan-out pool carries every other node's link.

A ``sky.SSH(fanout=True)`` pool that the client reaches only through SSH has its nodes' agents
behind the first host. With a direct-tcpip channel per link, each node cost the client a
channel's open and close, and each frame of each node was an SSH packet of its own, encrypted
or decrypted in the client's interpreter (issue 65: the client's CPU per node). Instead, the
client runs ``python -m skyward.bootstrap.mux`` on the first host once per SSH connection
(``serve``: standard library only, in the node's environment). Its standard input and output
carry every link, each piece tagged with its link's number. What several agents send at the
same moment leaves the first host in one write, so it reaches the client as fewer, fuller
packets; what the client sends to several nodes at once (a CONFIGURE to each, a task to all,
inside ``batch()``) leaves in one write the same way, and no channel is opened per node. The
client's end is bootstrap/muxlink.py.

The wire, both ways: ``HEADER`` (link, op, length), then ``length`` bytes.

* client -> first host: ``OPEN`` (``b"HOST PORT"``: connect to an agent's listener), ``DATA``,
  ``EOF`` (the client shut its sending side), ``CLOSE`` (forget the link).
* first host -> client: the line ``HELLO`` first, then ``OPENED``, ``REFUSED`` (why, as text),
  ``DATA``, ``EOF`` (the agent closed its side, or the connection failed), ``ACK`` (a count of
  the link's bytes handed to its agent: ``ACK_SIZE``).

The frames inside are the agent's own, sealed as on a direct connection: the first host relays
bytes it cannot read or change unnoticed (bootstrap/frames.py). Each link has a window, as an
SSH channel has: the client sends at most ``WINDOW`` bytes its agent has not taken yet (the
first host says what it took, every ``ACK_EVERY`` bytes), so an agent that stops reading (its
host gone) holds up its own link only, never the others, and the first host keeps at most a
window per link. Past ``OUT_HIGH`` bytes waiting for the client, no agent is read. The program
ends when its standard input does (the client closed the channel, or its connection ended),
closing every link.
"""

from __future__ import annotations

import collections
import errno
import itertools
import os
import socket
import struct
import sys
from typing import Any

HEADER = struct.Struct("!IBI")  # link, op, payload length
OPEN, DATA, EOF, CLOSE, OPENED, REFUSED, ACK = 1, 2, 3, 4, 5, 6, 7
ACK_SIZE = struct.Struct("!I")
HELLO = b"skyward-mux 1\n"
CHUNK = 1 << 18  # bytes read from an agent at a time (one DATA frame)
SEND_CHUNK = 1 << 18  # the client's DATA frames: a large value is interleaved with other links'
WINDOW = 4 << 20  # a link's bytes on their way to its agent, at most
ACK_EVERY = 1 << 20
OUT_HIGH = 4 << 20  # bytes waiting for the client: past this, no agent is read
PIPE_SIZE = 1 << 20
_IOV_MAX = 512
_READ, _WRITE = 1, 2  # selectors.EVENT_READ and EVENT_WRITE (selectors is loaded by the first host's end only)


# -- the first host's end -------------------------------------------------------------------------
class _Link:
    __slots__ = ("connecting", "eof_in", "id", "mask", "pending", "read_done", "sock", "taken")

    def __init__(self, link_id: int, sock: socket.socket) -> None:
        self.id, self.sock = link_id, sock
        self.pending: collections.deque[memoryview] = collections.deque()
        self.taken = 0  # bytes the agent took since the last ACK
        self.connecting = True
        self.eof_in = self.read_done = False
        self.mask = 0


class _Server:
    def __init__(self, fin: int, fout: int) -> None:
        import selectors

        self.fin, self.fout = fin, fout
        for fd in (fin, fout):
            _widen(fd)
            os.set_blocking(fd, False)
        self.sel = selectors.DefaultSelector()
        self.links: dict[int, _Link] = {}
        self.out: collections.deque[memoryview] = collections.deque([memoryview(HELLO)])
        self.out_size = len(HELLO)
        self.full = False  # out_size past OUT_HIGH: agents are not read
        self.inbuf = bytearray()
        self.in_open = True
        self.in_mask = self.out_mask = 0
        self._watch_io()

    def run(self) -> None:
        while self.in_open:
            for key, events in self.sel.select():
                what = key.data
                if what == "in":
                    self._read_in()
                elif what == "out":
                    self._write_out()
                elif isinstance(what, _Link) and self.links.get(what.id) is what:  # (not closed meanwhile)
                    self._on_link(what, events)
                if not self.in_open:
                    break
        for link in list(self.links.values()):
            self._drop(link)

    # standard input and output
    def _watch_io(self) -> None:
        self.in_mask = self._want(self.fin, "in", self.in_mask, _READ if self.in_open else 0)
        self.out_mask = self._want(self.fout, "out", self.out_mask, _WRITE if self.out else 0)

    def _want(self, target: Any, data: Any, mask: int, want: int) -> int:
        """Watch ``target`` for ``want`` (0: not at all) where it was watched for ``mask``."""
        if want != mask:
            if not mask:
                self.sel.register(target, want, data)
            elif not want:
                self.sel.unregister(target)
            else:
                self.sel.modify(target, want, data)
        return want

    def _read_in(self) -> None:
        try:
            data = os.read(self.fin, 1 << 18)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.in_open = False
            return
        buf = self.inbuf
        buf += data
        at, size = 0, len(buf)
        with memoryview(buf) as view:
            while size - at >= HEADER.size:
                link_id, op, n = HEADER.unpack_from(buf, at)
                if size - at - HEADER.size < n:
                    break
                start = at + HEADER.size
                self._op(link_id, op, bytes(view[start : start + n]))
                at = start + n
        del buf[:at]
        self._watch_io()

    def _write_out(self) -> None:
        try:
            sent = os.writev(self.fout, list(itertools.islice(self.out, _IOV_MAX)))
        except BlockingIOError:
            return
        except OSError:  # the client is gone
            self.in_open = False
            return
        self.out_size -= sent
        while sent:
            head = self.out[0]
            if sent >= head.nbytes:
                sent -= head.nbytes
                self.out.popleft()
            else:
                self.out[0] = head[sent:]
                sent = 0
        if self.full and self.out_size < OUT_HIGH // 2:
            self.full = False
            for link in self.links.values():
                self._watch(link)
        self._watch_io()

    def _emit(self, link_id: int, op: int, payload: bytes = b"") -> None:
        self.out.append(memoryview(HEADER.pack(link_id, op, len(payload)) + payload))
        self.out_size += HEADER.size + len(payload)
        if not self.full and self.out_size >= OUT_HIGH:
            self.full = True
            for link in self.links.values():
                self._watch(link)
        if not self.out_mask:
            self._watch_io()

    # the links
    def _op(self, link_id: int, op: int, payload: bytes) -> None:
        if op == OPEN:
            self._open(link_id, payload)
            return
        link = self.links.get(link_id)
        if link is None:  # (closed here: the client learns it from the EOF already sent)
            return
        if op == DATA:
            link.pending.append(memoryview(payload))
            if not link.connecting:
                self._flush(link)
            self._watch(link)
        elif op == EOF:
            link.eof_in = True
            if not link.pending and not link.connecting:
                _shut(link.sock, socket.SHUT_WR)
        elif op == CLOSE:
            self._drop(link)

    def _open(self, link_id: int, payload: bytes) -> None:
        try:
            host, port = payload.decode().rsplit(" ", 1)
            family, kind, proto, _, address = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, kind, proto)
        except (OSError, ValueError) as exc:
            self._emit(link_id, REFUSED, str(exc).encode())
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(link_id, sock)
        self.links[link_id] = link
        err = sock.connect_ex(address)
        if err == 0:
            self._connected(link)
        elif err not in (errno.EINPROGRESS, errno.EAGAIN, errno.EALREADY):  # (else: wait until writable)
            self._refuse(link, err)
            return
        self._watch(link)

    def _connected(self, link: _Link) -> None:
        link.connecting = False
        self._emit(link.id, OPENED)
        self._flush(link)

    def _refuse(self, link: _Link, err: int) -> None:
        self._emit(link.id, REFUSED, os.strerror(err).encode())
        self._drop(link)

    def _on_link(self, link: _Link, events: int) -> None:
        if events & _WRITE:
            if link.connecting:
                err = link.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._refuse(link, err)
                    return
                self._connected(link)
            else:
                self._flush(link)
        if events & _READ and not link.read_done:
            try:
                data = link.sock.recv(CHUNK)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data:
                self._emit(link.id, DATA, data)
            elif data is not None:
                link.read_done = True
                self._emit(link.id, EOF)
        if link.id in self.links:
            self._watch(link)

    def _flush(self, link: _Link) -> None:
        while link.pending:
            try:
                sent = link.sock.send(link.pending[0])
            except BlockingIOError:
                break
            except OSError:  # the agent's end reset: its read says so (EOF to the client)
                sent = sum(p.nbytes for p in link.pending)
                link.pending.clear()
            else:
                head = link.pending[0]
                if sent >= head.nbytes:
                    link.pending.popleft()
                else:
                    link.pending[0] = head[sent:]
            link.taken += sent
        if link.taken >= ACK_EVERY:
            self._emit(link.id, ACK, ACK_SIZE.pack(link.taken))
            link.taken = 0
        if not link.pending and link.eof_in:
            _shut(link.sock, socket.SHUT_WR)

    def _watch(self, link: _Link) -> None:
        want = (_READ if not link.read_done and not link.connecting and not self.full else 0) | \
            (_WRITE if link.connecting or link.pending else 0)
        link.mask = self._want(link.sock, link, link.mask, want)

    def _drop(self, link: _Link) -> None:
        self.links.pop(link.id, None)
        if link.mask:
            self.sel.unregister(link.sock)
            link.mask = 0
        link.sock.close()


def _widen(fd: int) -> None:
    """Give the pipe (or socket) between sshd and this program room for 1 MiB, where it held 64
    KiB: with the default, sshd could hand on only 64 KiB before this program ran again, and on
    busy cores the client's uploads through the first host ran at half the speed of a channel
    straight to the agent."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
        return
    except (OSError, ImportError):  # (not a pipe, or not Linux; over the system's limit: kept as is)
        pass
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIPE_SIZE)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_SIZE)
    except OSError:
        pass
    finally:
        sock.detach()


def _shut(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass


def serve(fin: int = 0, fout: int = 1) -> None:
    _Server(fin, fout).run()


def main() -> None:
    try:
        serve(sys.stdin.fileno(), sys.stdout.fileno())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
