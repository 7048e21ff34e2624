"""The agent's listening sockets: a Unix socket only its user can reach, or a private address
for clients that skip the SSH tunnel. Standard library only: the agent's start opens them before
its own modules import (agent_start.py), and the agent opens one per worker lane; closing a
socket and removing its file, for the agent and its supervisor."""

from __future__ import annotations

import contextlib
import os
import socket


def direct_listener(address: str) -> socket.socket | str:
    """A listener on ``address`` for clients that skip the SSH tunnel, or why there is none:
    only private addresses (RFC 1918, IPv6 unique-local, loopback) that this host has."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"{address!r} is not an IP address"
    if not (ip.is_private or ip.is_loopback) or ip.is_unspecified:
        return f"{address} is not a private address; the agent is reached through SSH only"
    try:
        sock = socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        return f"cannot listen on {address}: {exc}"
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, 0))
        sock.listen(16)
    except OSError as exc:
        sock.close()
        return f"cannot listen on {address} ({exc}): it is not an address of this host"
    return sock


def unix_listener(path: str, backlog: int = 16) -> socket.socket | str:
    """A listener on a Unix socket at ``path`` (only this user may connect), or why there is
    none: on a host without them, or a path too long for one (about 100 bytes)."""
    if not hasattr(socket, "AF_UNIX"):
        return "this platform has no Unix sockets"
    if len(os.fsencode(path)) > 100:
        return f"the path {path!r} is too long for a Unix socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        old = os.umask(0o077)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        return f"cannot listen on {path}: {exc}"
    return sock


# The longest folder a node's sockets may live in: its longest name (``lane-NNN.sock``) still
# fits a Unix socket's path (108 bytes on Linux, 104 on BSDs; 100 leaves room).
SHORT_FOLDER = 88
# Where a short folder of its own is made when the one given is too long, in this order.
SHORT_BASES = ("/tmp", "/var/tmp", "/dev/shm")
SHORT_PREFIX = "skyward-sock-"


def short_folder(bases: tuple[str, ...] = SHORT_BASES) -> tuple[str | None, str]:
    """A new folder of this user's alone (mode 0700, a name nobody had: as ``mktemp -d`` makes
    it) whose path is short enough for Unix sockets, for a node whose own folder's path is too
    long (a deep home, a long host name): ``(folder, "")``, or ``(None, why)`` where none of
    ``bases`` takes one. A stranger's file of that name is never used: the name is new."""
    why = []
    for base in bases:
        for _ in range(20):
            folder = os.path.join(base, SHORT_PREFIX + os.urandom(5).hex())
            if len(os.fsencode(folder)) > SHORT_FOLDER:
                why.append(f"{base} is too deep")
                break
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                continue
            except OSError as exc:
                why.append(f"{base}: {exc.strerror or exc}")
                break
            return folder, ""
    return None, "; ".join(why) or "no folder was free"


def close(sock: socket.socket) -> None:
    """Shut ``sock`` both ways, so its peer's read ends at once, and close it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def unlink(path: str | None) -> None:
    """Remove a socket's file, if there is one (``None``: there is none)."""
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
