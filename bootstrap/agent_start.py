"""The agent's process start: its command line, its listeners and its start-up line, written
before the agent's own modules (the frames, the handshake, pickling, shared memory: two thirds
of its start) are imported. Whoever started it reads the line and connects while those import:
the connection waits in the listener's queue, and the handshake begins once the agent serves.

``python -m skyward.bootstrap.agent`` comes here first (agent.py hands over before its imports).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from typing import Any

from .listeners import SHORT_FOLDER, SHORT_PREFIX, direct_listener, short_folder, unix_listener


class _Args:
    """The agent's command line (see ``_parse_args``)."""

    def __init__(self) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self.ttl = 600.0
        self.log: str | None = None  # file for the agent's own log lines
        self.orphan_cleanup: list[str] = []  # folders to remove when the lease expires
        # SSH and Slurm nodes: the folder of the node's pool folders ($RUN/pools), where those of
        # pools whose processes are all gone are removed at the start (sweep.py)
        self.sweep: str | None = None
        self.unix: str | None = None  # also listen on this Unix socket (Local pools)
        # SSH, cloud and Slurm nodes: listen on this Unix socket in the node's 0700 pool folder
        # instead of a loopback port (the client reaches it through sshd: no other user can).
        self.socket: str | None = None
        self.direct: str | None = None  # also listen on this private address (sky.SSH(direct=True))
        self.fork_server = False  # fork this machine's agents on request instead (zygote.py)


_OPTIONS = {"--host": "host", "--port": "port", "--ttl": "ttl", "--log": "log",
            "--orphan-cleanup": "orphan_cleanup", "--unix": "unix", "--direct": "direct",
            "--socket": "socket", "--sweep": "sweep"}


def _parse_args(argv: list[str]) -> _Args:
    """``--host H --port P --ttl S --log FILE --orphan-cleanup DIR (repeatable) --unix PATH
    --socket PATH --direct ADDRESS --sweep DIR``, each as ``--name value`` or ``--name=value``, or ``--fork-server``
    alone (zygote.py). The agent's only callers are skyward's providers, so a plain loop does
    (argparse costs every node's start 6 ms)."""
    args = _Args()
    i = 0
    while i < len(argv):
        if argv[i] == "--fork-server":
            args.fork_server = True
            i += 1
            continue
        name, eq, value = argv[i].partition("=")
        attr = _OPTIONS.get(name)
        if attr is None:
            raise SystemExit(f"skyward agent: unknown option {argv[i]!r}; it takes "
                             f"{', '.join(_OPTIONS)} and --fork-server")
        if not eq:
            i += 1
            if i == len(argv):
                raise SystemExit(f"skyward agent: {name} needs a value")
            value = argv[i]
        i += 1
        try:
            if attr == "orphan_cleanup":
                args.orphan_cleanup.append(value)
            else:
                setattr(args, attr, int(value) if attr == "port" else float(value) if attr == "ttl" else value)
        except ValueError:
            raise SystemExit(f"skyward agent: {name} takes a number, got {value!r}") from None
    return args


def _say(hello: dict[str, Any]) -> None:
    """The start-up line on stdout. One write: a fork server's agents share one pipe
    (zygote.py), so a line must not be split."""
    sys.stdout.flush()
    os.write(1, json.dumps(hello).encode() + b"\n")


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    # The token out of the process's environment block (/proc/PID/environ, which every forked
    # agent and worker copies): os.environ keeps it until taken below. (A forked agent finds
    # it scrubbed already.)
    from .envblock import scrub

    scrub("SKYWARD_AGENT_TOKEN")
    if args.fork_server:  # (the token stays in os.environ: each forked agent takes it)
        from .zygote import preload, serve

        preload()
        serve(main)
        return
    token = os.environ.pop("SKYWARD_AGENT_TOKEN", "")
    if not token:
        raise SystemExit("skyward agent: SKYWARD_AGENT_TOKEN is not set; refusing to serve")

    # "id": who this agent is, made here and said in the start-up line, which only whoever
    # started it reads (a pipe, an SSH session); its WELCOME says it again, so a client that
    # reaches another agent of the same pool (a relay in between) sees that it is not this one.
    hello: dict[str, Any] = {"pid": os.getpid(), "id": os.urandom(12).hex()}
    listeners: list[socket.socket] = []
    unix_path = args.unix or args.socket
    # A node reached over SSH (--socket) whose folder's path is too long for Unix sockets (a
    # deep home, a long host name): its sockets go to a short folder of its own instead, and a
    # loopback port (which every user of the node can reach) only where none can be made.
    short, tcp_why = None, ""
    if args.socket and not args.unix and len(os.fsencode(os.path.dirname(os.path.abspath(args.socket)))) > SHORT_FOLDER:
        short, why = short_folder()
        if short is not None:
            unix_path = args.socket = os.path.join(short, os.path.basename(args.socket))
        else:
            tcp_why = (f"the path {os.path.abspath(args.socket)!r} is too long for a Unix socket and "
                       f"no short folder could be made ({why})")
            hello["unix_error"] = tcp_why
            unix_path = args.socket = None
    # A Local node (its clients are on this host), or a node reached over SSH (--socket): no
    # TCP port at all, only a Unix socket in a folder of this user's alone.
    if unix_path:
        unix = unix_listener(unix_path)
        if isinstance(unix, str):
            _say(dict(hello, error=unix))
            raise SystemExit(f"skyward agent: {unix}")
        hello["unix"] = unix_path
        listeners.append(unix)
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((args.host, args.port))
        listener.listen(16)
        hello["port"] = listener.getsockname()[1]
        listeners.append(listener)
    direct = direct_listener(args.direct) if args.direct else None
    if isinstance(direct, str):
        hello["direct_error"] = direct
    elif direct is not None:
        hello["direct"] = direct.getsockname()[1]
        listeners.append(direct)
    _say(hello)
    # After the handshake, stdout/stderr go to the log (or nowhere): whoever started us may
    # stop reading, and a write to a closed pipe must never kill the agent.
    target = os.open(args.log or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client decides; Ctrl-C is its to handle
    # The start-up line is out: whoever waits for it connects while the agent's modules import.
    from .agent import Agent, _log
    from .sweep import LOCK, hold, sweep

    for folder in args.orphan_cleanup:  # the pool's folders stay while this agent lives (sweep.py)
        if os.path.exists(os.path.join(folder, LOCK)):
            hold(folder)
    if short is not None:  # held as long as this agent lives; those of agents killed outright go
        hold(short)
        for gone in sweep(os.path.dirname(short), SHORT_PREFIX + "*"):
            _log(f"removed {gone}: a socket folder whose agent is gone")
        _log(f"the pool folder's path is too long for a Unix socket: the agent's sockets are in {short}")
    elif tcp_why:
        _log(f"listening on a loopback TCP port, which every user of this node can reach: {tcp_why}")
    if args.sweep:  # other pools' folders on this node whose processes were all killed (after our hold)
        for gone in sweep(args.sweep, "[!.]*-*"):
            _log(f"removed {gone}: a pool folder whose processes are all gone")
    agent = Agent(token, args.ttl, args.orphan_cleanup + ([short] if short else []), identity=hello["id"])
    if args.unix:
        agent.lane_dir = os.path.dirname(os.path.abspath(args.unix))
    elif args.socket:
        agent.socket_dir = os.path.dirname(os.path.abspath(args.socket))
    signal.signal(signal.SIGTERM, lambda *_: agent.shutdown("SIGTERM"))
    where = unix_path if unix_path else f"{args.host}:{hello['port']}"
    _log(f"serving on {where}, ttl {args.ttl:g} s")
    agent.prestart(listeners)
    if isinstance(direct, socket.socket):
        _log(f"serving directly on {args.direct}:{hello['direct']} too (key-checked, frames authenticated, not encrypted)")
    elif isinstance(direct, str):
        _log(f"not serving directly: {direct}")
    try:
        agent.serve(*listeners)
    finally:
        if unix_path:
            with contextlib.suppress(OSError):
                os.unlink(unix_path)
        if short is not None:
            import shutil

            shutil.rmtree(short, ignore_errors=True)
    _log("stopped")


if __name__ == "__main__":
    main()
