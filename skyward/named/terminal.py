"""This terminal, joined to a command on an SSH channel (``skyward ssh`` on SSH and cloud nodes).

On a terminal (stdin and stdout both one), the channel gets a pseudo-terminal of the same size
and type, this terminal goes to raw mode (every key, Ctrl-C included, goes to the node), and a
window resize is passed on. Otherwise (a pipe, a file, a script) there is no pseudo-terminal:
stdin is forwarded until it ends, the node's stdout and stderr come back separately. Either way
the command's exit status is returned (255 when it had none: killed by a signal).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko

_WINDOW = 64 << 20


def run_channel(transport: paramiko.Transport, command: str) -> int:
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    tty = os.isatty(stdin) and os.isatty(stdout)
    chan = transport.open_session(window_size=_WINDOW)
    try:
        if tty:
            cols, rows = os.get_terminal_size(stdout)
            chan.get_pty(term=os.environ.get("TERM", "xterm-256color"), width=cols, height=rows)
            chan.exec_command(command)
            with _raw(stdin), _resizes(chan, stdout):
                _pump_terminal(chan, stdin, stdout)
        else:
            chan.exec_command(command)
            _pump_pipes(chan, stdin, stdout, sys.stderr.fileno())
        code = chan.recv_exit_status()
    finally:
        chan.close()
    return 255 if code < 0 else code


def _pump_terminal(chan: paramiko.Channel, stdin: int, stdout: int) -> None:
    watch = [chan, stdin]
    while True:
        ready, _, _ = select.select(watch, [], [])
        if chan in ready:
            data = chan.recv(_WINDOW)  # all that arrived: a partial read moves paramiko's buffer
            if not data:
                return
            _write_all(stdout, data)
        if stdin in ready:
            keys = os.read(stdin, 4096)
            if keys:
                chan.sendall(keys)
            else:  # the terminal went away
                chan.shutdown_write()
                watch = [chan]


def _pump_pipes(chan: paramiko.Channel, stdin: int, stdout: int, stderr: int) -> None:
    # The thread reads its own copy of stdin's descriptor: it may still be blocked reading
    # when the command has ended, and a descriptor number the caller closes is soon another
    # file's.
    source = os.dup(stdin)

    def forward() -> None:
        try:
            with contextlib.suppress(OSError, EOFError):
                while data := os.read(source, 65536):
                    chan.sendall(data)
            with contextlib.suppress(OSError, EOFError):
                chan.shutdown_write()
        finally:
            os.close(source)

    threading.Thread(target=forward, name="skyward-ssh-stdin", daemon=True).start()
    while True:
        select.select([chan], [], [], 1.0)
        # Looked at before draining: everything the node sent comes before its EOF, so once
        # the EOF is seen, what is buffered is all there will be.
        ended = chan.eof_received or chan.closed
        while chan.recv_ready():
            _write_all(stdout, chan.recv(_WINDOW))
        while chan.recv_stderr_ready():
            _write_all(stderr, chan.recv_stderr(_WINDOW))
        if ended:
            return


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _resizes(chan: paramiko.Channel, fd: int) -> Iterator[None]:
    def resized(*_: object) -> None:
        with contextlib.suppress(OSError, EOFError):
            cols, rows = os.get_terminal_size(fd)
            chan.resize_pty(width=cols, height=rows)

    saved = signal.signal(signal.SIGWINCH, resized)
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, saved)
