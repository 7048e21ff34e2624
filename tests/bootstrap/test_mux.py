"""bootstrap/mux.py: many links over one stream, the first host's program run for real (a child
process whose standard input and output are the stream, as an SSH exec channel's are), to real
TCP listeners on loopback."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from skyward.bootstrap.muxlink import Mux, MuxUnavailable, batch


class _Pipes:
    """A child's standard input and output as the socket-like stream the client's Mux reads."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc, self._in, self._out = proc, proc.stdin.fileno(), proc.stdout.fileno()

    writes = 0

    def sendall(self, data: bytes | memoryview) -> None:
        self.writes += 1
        view = memoryview(data).cast("B")
        while view.nbytes:
            view = view[os.write(self._in, view) :]

    def recv(self, n: int) -> bytes:
        return os.read(self._out, n)

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except OSError:
            pass


def _start(argv: list[str]) -> _Pipes:
    return _Pipes(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))


def _end(pipes: _Pipes) -> int:
    pipes.close()
    try:
        code = pipes.proc.wait(10)
    except subprocess.TimeoutExpired:
        pipes.proc.kill()
        code = pipes.proc.wait()
    assert pipes.proc.stdout is not None
    pipes.proc.stdout.close()
    return code


@pytest.fixture
def mux() -> Iterator[tuple[Mux, _Pipes]]:
    pipes = _start([sys.executable, "-m", "skyward.bootstrap.mux"])
    m = Mux(pipes, "the test's first host")
    try:
        yield m, pipes
    finally:
        code = _end(pipes)
        m._thread.join(10)
        assert code == 0, "the multiplexer ends cleanly when its input does"


class _Agents:
    """A loopback listener whose connections run ``serve(conn)`` each on a thread of their own."""

    def __init__(self, serve) -> None:  # type: ignore[no-untyped-def]
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self.conns: list[socket.socket] = []
        self._serve = serve
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._accepting.join(5)
        for c in self.conns:  # (a test that failed half-way left some open: their threads end now)
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        for t in self.threads:
            t.join(10)
        for c in self.conns:
            c.close()


@pytest.fixture
def echo() -> Iterator[_Agents]:
    def serve(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # (shut down by the fixture's end)
            while data := conn.recv(1 << 16):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)

    agents = _Agents(serve)
    try:
        yield agents
    finally:
        agents.close()


def _read(link, n: int) -> bytes:  # type: ignore[no-untyped-def]
    buf = bytearray(n)
    got = 0
    while got < n:
        r = link.recv_into(memoryview(buf)[got:], n - got)
        assert r, f"the link ended after {got} of {n} bytes"
        got += r
    return bytes(buf)


def test_links_carry_their_own_bytes_both_ways(mux: tuple[Mux, _Pipes], echo: _Agents) -> None:
    m, _ = mux
    links = [m.open("127.0.0.1", echo.port) for _ in range(8)]
    big = os.urandom(5 << 20)  # a large value beside small ones: each link gets its own back, whole
    errors: list[BaseException] = []

    def talk(i: int) -> None:
        try:
            link = links[i]
            if i == 0:
                link.sendall(big)
                assert _read(link, len(big)) == big
            for k in range(50):
                msg = f"link {i} message {k}".encode()
                link.sendmsg([msg[:3], memoryview(msg[3:])])
                assert _read(link, len(msg)) == msg
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=talk, args=(i,)) for i in range(len(links))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for link in links:
        link.shutdown(socket.SHUT_WR)  # the agent sees the end, and closes its side: the link reads 0
        assert link.recv_into(bytearray(10)) == 0
        link.close()


def test_frames_a_thread_sends_in_a_batch_leave_in_one_write(mux: tuple[Mux, _Pipes], echo: _Agents) -> None:
    """A CONFIGURE to every node, a task to all of them: one write (a few SSH packets), not one
    per node. A link opened inside the block is not held back (its handshake needs answers)."""
    m, pipes = mux
    links = [m.open("127.0.0.1", echo.port) for _ in range(10)]
    before = pipes.writes
    with batch():
        for i, link in enumerate(links):
            link.sendall(b"node %02d" % i)
        assert pipes.writes == before  # (held until the block ends)
    assert pipes.writes == before + 1
    assert [_read(link, 7) for link in links] == [b"node %02d" % i for i in range(10)]
    with batch():
        late = m.open("127.0.0.1", echo.port)
        late.sendall(b"late")
        assert _read(late, 4) == b"late"  # answered inside the block
    for link in [*links, late]:
        link.close()


def test_refused_and_unknown_addresses_say_why_and_others_go_on(mux: tuple[Mux, _Pipes], echo: _Agents) -> None:
    m, _ = mux
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # (nothing listens there now)
    with pytest.raises(ConnectionRefusedError, match=f"127.0.0.1:{port}.*[Rr]efused"):
        m.open("127.0.0.1", port)
    with pytest.raises(ConnectionRefusedError, match=r"no-such-host\.invalid"):
        m.open("no-such-host.invalid", 80)
    link = m.open("127.0.0.1", echo.port)
    link.sendall(b"still here")
    assert _read(link, 10) == b"still here"
    link.close()


def test_a_read_waits_no_longer_than_the_timeout(mux: tuple[Mux, _Pipes], echo: _Agents) -> None:
    m, _ = mux
    link = m.open("127.0.0.1", echo.port)
    link.settimeout(0.2)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        link.recv_into(bytearray(4))
    assert time.monotonic() - t0 < 5
    link.sendall(b"ping")
    assert link.recv(4, socket.MSG_PEEK) == b"ping"  # (peeked: still there to read)
    assert _read(link, 4) == b"ping"
    link.close()
    with pytest.raises(BrokenPipeError):
        link.sendall(b"after close")


def test_an_agent_that_stops_reading_holds_up_its_own_link_only(mux: tuple[Mux, _Pipes], echo: _Agents) -> None:
    """An agent that takes nothing (its host hung) while the client sends it far more than a
    link's window: that link's sender waits, the other links go on, and once the agent reads,
    everything arrives in order."""
    m, _ = mux
    go = threading.Event()
    received: list[bytes] = []

    def slow(conn: socket.socket) -> None:
        go.wait(60)
        chunks = []
        while data := conn.recv(1 << 20):
            chunks.append(data)
        received.append(b"".join(chunks))
        conn.close()

    agents = _Agents(slow)
    try:
        stuck = m.open("127.0.0.1", agents.port)
        payload = os.urandom(40 << 20)
        sender = threading.Thread(target=lambda: (stuck.sendall(payload), stuck.shutdown(socket.SHUT_WR)))
        sender.start()
        time.sleep(0.5)
        assert sender.is_alive()  # (waiting for its window)
        other = m.open("127.0.0.1", echo.port)
        for k in range(20):
            other.sendall(b"%05d" % k)
            assert _read(other, 5) == b"%05d" % k
        other.close()
        go.set()
        sender.join(60)
        assert not sender.is_alive()
        deadline = time.monotonic() + 30
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert received and received[0] == payload
        stuck.close()
    finally:
        go.set()
        agents.close()


def test_closing_the_stream_ends_the_program_and_every_link(echo: _Agents) -> None:
    pipes = _start([sys.executable, "-m", "skyward.bootstrap.mux"])
    m = Mux(pipes)
    try:
        link = m.open("127.0.0.1", echo.port)
        link.sendall(b"x")
        assert _read(link, 1) == b"x"
        m.close()  # (the client's channel closed: the first host's program reads the end of its input)
        assert pipes.proc.wait(10) == 0
        m._thread.join(10)
        assert link.recv_into(bytearray(4)) == 0  # the link ends with it
        assert not m.alive
        with pytest.raises(ConnectionResetError):
            m.open("127.0.0.1", echo.port)
        deadline = time.monotonic() + 10  # and the agent's side of the link is closed, not left open
        while any(t.is_alive() for t in echo.threads) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(t.is_alive() for t in echo.threads)
    finally:
        _end(pipes)


def test_a_host_without_the_multiplexer_is_told_apart() -> None:
    """An older skyward on the first host: ``python -m skyward.bootstrap.mux`` fails there, and
    the open says so (MuxUnavailable), so the client takes a channel per link instead."""
    pipes = _start([sys.executable, "-c", "import sys; print('No module named skyward.bootstrap.mux'); sys.exit(1)"])
    m = Mux(pipes)
    try:
        with pytest.raises(MuxUnavailable):
            m.open("127.0.0.1", 9)
    finally:
        _end(pipes)
        m._thread.join(10)
