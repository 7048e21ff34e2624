"""How the router opens a connection to a replica: through the pool's own way to its node.

``connector(cluster, index, path, openers)`` gives the router's ``connect``: each call opens a stream to the
replica's Unix socket on node ``index`` with ``Cluster.open_stream`` (a socket here on Local and
container nodes, a channel of the pool's SSH connection on SSH, Slurm and cloud nodes, or a relay
where sshd forbids that), and hands it to asyncio. A stream that is a socket is used as it is; any
other (an SSH channel) is carried through a socket pair by two threads that copy its bytes.
The router keeps the connections it opened and reuses them, so this runs once per connection,
not once per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyward.bootstrap.routes import Stream
    from skyward.providers.base import Cluster

_CHUNK = 1 << 16

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def _pump(src: Stream, dst: Stream, done: threading.Event) -> None:
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        if done.is_set():  # the other way ended first: both sides are finished with
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()
        done.set()


def bridged(stream: Stream) -> socket.socket:
    """A socket whose bytes are ``stream``'s, both ways (for a stream asyncio cannot use)."""
    mine, theirs = socket.socketpair()
    done = threading.Event()
    for src, dst in ((stream, mine), (mine, stream)):
        threading.Thread(target=_pump, args=(src, dst, done), name="skyward-serve-bridge", daemon=True).start()
    return theirs


def connector(cluster: Cluster, index: int, path: str, openers: Executor) -> Connect:
    """The ``connect`` of the replica listening on ``path`` on node ``index``. Streams open on
    ``openers`` (the endpoint's threads): opening one blocks, up to its timeout for an SSH node
    that was cut off, and a few such opens must not hold up those to healthy replicas, as they
    would in asyncio's default executor (cores + 4 threads)."""

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        stream = await loop.run_in_executor(openers, cluster.open_stream, index, path)
        sock = stream if isinstance(stream, socket.socket) else bridged(stream)
        sock.setblocking(False)
        return await asyncio.open_connection(sock=sock, limit=_CHUNK)

    return connect
