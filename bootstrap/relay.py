"""stdin/stdout <-> 127.0.0.1:PORT, ADDRESS:PORT or a Unix socket, for nodes whose sshd forbids
forwarding.

The client starts ``python -m skyward.bootstrap.relay PORT`` (or ``... relay /PATH``, the
agent's Unix socket, or ``... relay ADDRESS:PORT`` on a Slurm login node, to a compute node's
agent) over an SSH exec channel and speaks the agent's frames on the channel;
this copies bytes both ways until either side ends.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

_CHUNK = 1 << 20


def _pump_in(sock: socket.socket) -> None:
    fd = sys.stdin.fileno()
    try:
        while data := os.read(fd, _CHUNK):
            sock.sendall(data)
    finally:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[0].startswith("/"):  # the agent's Unix socket (in a folder of this user's alone)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(args[0])
    else:  # PORT on loopback, or ADDRESS:PORT (a Slurm compute node's agent, from the login node)
        host, _, port = args[0].rpartition(":")
        sock = socket.create_connection((host or "127.0.0.1", int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=_pump_in, args=(sock,), daemon=True).start()
    out = sys.stdout.fileno()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := sock.recv_into(buf):
        written = 0
        while written < n:
            written += os.write(out, view[written:n])


if __name__ == "__main__":
    main()
