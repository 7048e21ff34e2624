"""How this machine opens a stream to a port or a Unix socket on a node, in one fallback order.

1. **direct**: TCP straight to an address of the node that this machine reaches (``sky.SSH(direct=True)``:
   the agent's listener on the node's private address);
2. **a channel of the SSH connection**: direct-streamlocal to a Unix socket, direct-tcpip to a port
   (on the node's loopback, or, through a bastion such as a Slurm login node, on another machine's
   address);
3. **a relay**: where sshd forbids that forwarding, ``python -m skyward.bootstrap.relay TARGET`` on an
   exec channel of the same connection copies the stream's bytes to the target (frames or HTTP, it
   does not look), or, for a node that is a container here, on the runtime's ``exec``.

The providers say which of these reach their nodes (``Cluster.open_stream``); the pool's channels to
the agents, ``skyward notebook``'s forwarder and a router in front of served replicas all open their
streams through them.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from skyward.errors import ProviderError

if TYPE_CHECKING:
    import paramiko

    from .remote import Remote

log = logging.getLogger("skyward.ssh")  # as the SSH connections they ride on

# A port (on the node's loopback, or on ``host`` from a bastion) or a Unix socket's path on the node.
Target = int | str


class Stream(Protocol):
    """A byte stream both ways, as much of a socket as its users need (a socket, an SSH channel)."""

    def recv(self, n: int) -> bytes: ...
    def sendall(self, data: bytes) -> None: ...
    def shutdown(self, how: int) -> None: ...
    def close(self) -> None: ...


def relay_command(python: str, target: Target, host: str | None = None) -> str:
    """The command that relays stdin/stdout to ``target`` (``host:port`` from a bastion)."""
    where = f"{host}:{target}" if host is not None and isinstance(target, int) else str(target)
    return f"{shlex.quote(python)} -m skyward.bootstrap.relay {shlex.quote(where)}"


def channel(remote: Remote, target: Target, host: str = "127.0.0.1") -> Stream:
    """Step 2: a direct-streamlocal channel to a socket, a direct-tcpip channel to ``host:port``.
    Raises paramiko.ChannelException when sshd refuses it."""
    if isinstance(target, str):
        return remote.streamlocal(target)
    return remote.tunnel(target, host=host)


def prohibited(exc: paramiko.ChannelException) -> bool:
    """Whether sshd refused a channel by its configuration (forwarding forbidden), not because
    nothing listens at the target."""
    import paramiko

    return bool(exc.code == paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED)


def through_ssh(remote: Remote | Callable[[], Remote], target: Target, *, python: str,
                direct: tuple[str, int] | None = None, who: str = "") -> Stream:
    """Steps 1 to 3 for a node reached on its own SSH connection: ``direct`` first when given,
    then a channel, then a relay run by ``python`` on the node ("": none, the refusal is the
    error). Each stream tries again from the top: a relay is only as costly as a channel.
    ``who`` listens there, for the messages ("agent": "the agent's socket ..."). ``remote``
    may be what logs into the node, called only when the direct way does not answer (an
    attached pool's node reached directly is not logged into)."""
    import paramiko

    what = f"socket {target}" if isinstance(target, str) else f"port {target}"
    what = f"{who}'s {what}" if who else what
    if direct is not None:
        try:
            return socket.create_connection(direct, timeout=5)
        except OSError as exc:
            log.info("%s:%d: no direct connection to the %s there (%s); using the SSH tunnel",
                     *direct, who or "node", exc)
    if callable(remote):
        remote = remote()
    try:
        return channel(remote, target)
    except paramiko.ChannelException as exc:
        if not python:
            raise ProviderError(f"{remote.label}: cannot reach the {what}: {exc}") from None
        log.info("%s: forwarding to the %s refused (%s); relaying over an exec channel", remote.label, what, exc)
        return remote.relay(relay_command(python, target))


def through_exec(argv: list[str]) -> Stream:
    """Step 3 through a program here (``argv``: a runtime's ``exec`` into the node, then the relay's
    command line): its stdin and stdout are one end of a socket pair, the stream the other end.
    Closing the stream ends the program; a thread reaps it."""
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(argv, stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        ours.close()
        raise ProviderError(f"cannot run {argv[0]!r} to reach the node ({exc}); is it installed?") from None
    finally:
        theirs.close()
    return _ProcessStream(ours, proc)


class _ProcessStream:
    def __init__(self, sock: socket.socket, proc: subprocess.Popen[bytes]) -> None:
        self._sock, self._proc = sock, proc
        threading.Thread(target=proc.wait, name="skyward-relay-reaper", daemon=True).start()

    def recv(self, n: int) -> bytes:
        return self._sock.recv(n)

    def sendall(self, data: Any) -> None:
        self._sock.sendall(data)

    def shutdown(self, how: int) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(how)

    def close(self) -> None:
        self._sock.close()
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.terminate()
