"""What a pool asks of each SSH host, counted where it goes on the wire (paramiko's own calls),
per host and per phase of the caller's choosing. Shared by tests/ssh/test_round_trips.py and
benchmarks/ssh.py.

Each of these waits for the host at least once (a round trip):

* ``connections``: an SSH login (TCP, key exchange, authentication: several round trips each);
* ``sessions``: a session channel opened (for a command, or sftp);
* ``commands``: a command started on a session (exec, its own request and reply), and then the
  wait for what it prints and its exit;
* ``tunnels``: a channel to the agent (direct-streamlocal to its Unix socket, or direct-tcpip);
* ``answers``: within a command, the host waiting for the client's answer to what it printed
  (``Remote.run``'s ``answer``: files a node lacks).

    with Wire() as wire:
        with wire.phase("enter"):
            ...
    wire.of("10.0.0.5", "enter") -> {"connections": 1, "sessions": 1, "commands": 1, "tunnels": 1}
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

KINDS = ("connections", "sessions", "commands", "tunnels", "answers")


def _peer(transport: Any) -> str:
    try:
        return str(transport.getpeername()[0])
    except Exception:
        return "?"


class Wire:
    """Counts while entered (the patches are process-wide: one Wire at a time)."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], Counter[str]] = {}
        self._lock = threading.Lock()
        self._phase = ""
        self._undo: list[tuple[Any, str, Any]] = []

    def _count(self, transport: Any, kind: str) -> None:
        with self._lock:
            self._counts.setdefault((_peer(transport), self._phase), Counter())[kind] += 1

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = before

    def of(self, host: str, phase: str) -> dict[str, int]:
        with self._lock:
            got = self._counts.get((host, phase), Counter())
            return {k: got[k] for k in KINDS}

    def phases(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(p for _, p in self._counts))

    def hosts(self) -> list[str]:
        with self._lock:
            return sorted({h for h, _ in self._counts})

    def _patch(self, owner: Any, name: str, wrap: Any) -> None:
        original = getattr(owner, name)
        self._undo.append((owner, name, original))
        setattr(owner, name, wrap(original))

    def __enter__(self) -> Wire:
        import paramiko

        from skyward.bootstrap import remote

        wire = self

        def connection(original: Any) -> Any:
            def start_client(transport: Any, *args: Any, **kwargs: Any) -> Any:
                wire._count(transport, "connections")
                return original(transport, *args, **kwargs)

            return start_client

        def session(original: Any) -> Any:
            def open_session(transport: Any, *args: Any, **kwargs: Any) -> Any:
                wire._count(transport, "sessions")
                return original(transport, *args, **kwargs)

            return open_session

        def command(original: Any) -> Any:
            def exec_command(channel: Any, *args: Any, **kwargs: Any) -> Any:
                wire._count(channel.get_transport(), "commands")
                return original(channel, *args, **kwargs)

            return exec_command

        def channel(original: Any) -> Any:
            def open_channel(transport: Any, kind: str, *args: Any, **kwargs: Any) -> Any:
                if kind == "direct-tcpip":  # (open_session comes through here too: counted above)
                    wire._count(transport, "tunnels")
                return original(transport, kind, *args, **kwargs)

            return open_channel

        def streamlocal(original: Any) -> Any:
            def open_streamlocal(transport: Any, *args: Any, **kwargs: Any) -> Any:
                wire._count(transport, "tunnels")
                return original(transport, *args, **kwargs)

            return open_streamlocal

        def run(original: Any) -> Any:
            def run_command(remote_: Any, *args: Any, answer: Any = None, **kwargs: Any) -> Any:
                if answer is None:
                    return original(remote_, *args, **kwargs)

                def counted(line: str) -> Any:
                    parts = answer(line)
                    if parts:  # (an empty answer only closes stdin: the host waits for nothing)
                        wire._count(remote_.transport, "answers")
                    return parts

                return original(remote_, *args, answer=counted, **kwargs)

            return run_command

        self._patch(remote.Remote, "run", run)
        self._patch(paramiko.Transport, "start_client", connection)
        self._patch(paramiko.Transport, "open_session", session)
        self._patch(paramiko.Channel, "exec_command", command)
        self._patch(paramiko.Transport, "open_channel", channel)
        self._patch(remote, "_open_streamlocal", streamlocal)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    def table(self, hosts: list[str] | None = None) -> list[str]:
        """One line per phase: the counts per host, or one figure when every host has the same."""
        hosts = hosts or self.hosts()
        lines = []
        for phase in self.phases():
            per = [self.of(h, phase) for h in hosts]
            if all(p == per[0] for p in per):
                what = ", ".join(f"{per[0][k]} {k}" for k in KINDS)
                lines.append(f"{phase}: {what} per host")
            else:
                lines.append(
                    f"{phase}: "
                    + "; ".join(
                        f"{h}: " + ", ".join(f"{p[k]} {k}" for k in KINDS)
                        for h, p in zip(hosts, per, strict=True)
                    )
                )
        return lines
