"""An agent's frames to every client (METRIC, OUTPUT, LANE_LOST: ``Agent._broadcast``) reach a
client only after its WELCOME.

A client joined the agent's list before its WELCOME was sent, so a METRIC broadcast at that
moment went out first, and the client refuses a handshake whose first frame after its HELLO is
not a WELCOME (on a sealed link it was also sent plain). The race is forced here, not waited
for: an agent in this process, whose writer broadcasts a METRIC just before each WELCOME.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import pytest

from skyward.bootstrap import agent as agent_module
from skyward.bootstrap.frames import Frame, FrameReader, FrameWriter, Kind
from skyward.bootstrap.handshake import AGENT, Gate, derive, prove, read_welcome

pytestmark = pytest.mark.timeout(60)
TOKEN = "the-pool-secret"


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_a_broadcast_while_a_client_is_welcomed_reaches_it_only_after_its_welcome(
        monkeypatch: pytest.MonkeyPatch, sealed: bool) -> None:
    agent = agent_module.Agent(TOKEN, ttl=0)

    def during_welcome(n: int) -> None:  # a METRIC from the collector thread, at the worst moment
        agent._broadcast(Frame(Kind.METRIC, 0, b'["during the WELCOME of client %d"]' % n))

    welcomes = iter(range(1 << 30))

    class Writer(FrameWriter):
        """The agent's writer, which broadcasts just before it sends a WELCOME (either way)."""

        def seal(self, key: bytes, first: Frame | None = None) -> None:
            if first is not None and first.kind == Kind.WELCOME:
                during_welcome(next(welcomes))
            super().seal(key, first)

        def send_parts(self, kind: int, *args: Any, **kwargs: Any) -> None:
            if kind == Kind.WELCOME:
                during_welcome(next(welcomes))
            super().send_parts(kind, *args, **kwargs)

    monkeypatch.setattr(agent_module, "FrameWriter", Writer)
    listener = socket.create_server(("127.0.0.1", 0))
    if sealed:  # as `--direct` makes it: every later frame on this listener's links is sealed
        agent.sealed_at = {listener.getsockname()[:2]}
    key = derive(TOKEN, AGENT)
    clients: list[tuple[socket.socket, FrameReader]] = []
    serving: list[threading.Thread] = []
    try:
        with listener:
            for n in range(3):  # each joins while the earlier ones are in the list
                sock = socket.create_connection(listener.getsockname()[:2])
                clients.append((sock, FrameReader(sock)))
                theirs, peer = listener.accept()
                gate = Gate()
                assert gate.enter(theirs, peer)
                t = threading.Thread(target=agent._serve_conn, args=(theirs, gate), daemon=True)
                serving.append(t)
                t.start()
                check = prove(sock, key, {}, timeout=10)
                facts, raw = read_welcome(sock, f"client {n}'s agent", timeout=10)  # Refused: another frame came first
                assert check(facts) and check.sealed == sealed == facts["sealed"]
                if sealed:
                    clients[-1][1].seal(check.keys(raw)[1])
                deadline = time.monotonic() + 10
                while len(agent.conns) < n + 1:  # (it joins just after the WELCOME is out)
                    assert time.monotonic() < deadline, "the agent never added the client to its list"
                    time.sleep(0.005)
        agent._broadcast(Frame(Kind.METRIC, 0, b'["after"]'))
        for n, (sock, reader) in enumerate(clients):
            sock.settimeout(10)
            got: list[str] = []
            while not got or got[-1] != '["after"]':
                frame = reader.read()
                assert frame.kind == Kind.METRIC, frame.kind
                got.append(bytes(frame.body).decode())
            # what was broadcast after its WELCOME, and nothing from before it
            assert got == [f'["during the WELCOME of client {later}"]' for later in range(n + 1, 3)] + ['["after"]']
    finally:
        for sock, _ in clients:
            with contextlib.suppress(OSError):
                sock.close()
        for t in serving:
            t.join(10)
        agent.stopping.set()
    assert not any(t.is_alive() for t in serving) and agent.conns == []
