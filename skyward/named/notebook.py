"""``skyward notebook NAME [--node N] [--marimo] [--open] [--port P]``: JupyterLab (or marimo)
on a node of a running named pool, in the pool's environment, served on a local port.

The server runs on the node the way a ``skyward ssh`` shell does (nodeaccess.py): in the node's
working directory, with the pool's environment (``Image.env``, the ``includes``, the pool's
virtualenv on SSH and cloud nodes, this machine's interpreter and the pool's overlay on Local
nodes), so its kernels import what the pool's tasks import and see the node's accelerators. When
the node lacks the server's package it is installed first, on every node, the way ``skyward
install`` does it (the pool's install mode: a wheelhouse sent from here for nodes with no index;
recorded in the pool's lock).

The server listens on the node's loopback only (notebookserver.py starts it there, with a token
that travels on its stdin). This command listens on this machine's loopback and carries each
connection to it through the pool's own connection: an SSH direct-tcpip channel on the node's
SSH connection (pinned host keys, the jump host), or a relay over an exec channel where the
node's sshd forbids forwarding; a Local node is this machine. It prints the local URL (with the
token: whoever has it has the server). ``--open`` gives the browser a 0600 page that posts a
one-time code to this command's forwarder (skyward.named.browser, as ``skyward dashboard
--open``), which logs the browser in to the server (the server's session cookie) and spends the
code: the token is never on a command line.

The forwarder (``Forwarder``) is skyward.named.forward's, which admits the user's connections only,
bounds them and streams both ways; the stream to the node's port is the provider's
(``Cluster.open_stream``).

Ctrl-C (or SIGTERM) stops the server on the node, kernels included; so does ``skyward down``
(the node-side launcher sees the pool's agent go); so does this command dying (the launcher's
stdin ends). While it runs, the command is a client of the pool, like a shell: its lease is
renewed, and an asleep pool woken for it sleeps again after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import secrets
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ProviderError
from . import forward
from .cliout import EXIT_OK, err
from .forward import LOGIN_PATH
from .nodeaccess import Node, Process, SSHNode, open_nodes

if TYPE_CHECKING:
    from ..bootstrap.routes import Stream

q = shlex.quote
_START_TIMEOUT = 240.0  # seconds the server may take to answer on the node (a cold start imports a lot)


@dataclass(frozen=True)
class Flavor:
    """A notebook server: its package and how its token logs a browser in."""

    kind: str  # what notebookserver.py starts
    title: str
    package: str  # the requirement installed on the nodes when missing
    module: str  # what must import on the node
    landing: str  # the page to show once logged in
    token_query: str  # the query parameter the server takes its token from

    def login_path(self, token: str) -> str:
        return f"{self.landing}?{self.token_query}={token}"


JUPYTER = Flavor("jupyter", "JupyterLab", "jupyterlab", "jupyterlab", "/lab", "token")
MARIMO = Flavor("marimo", "marimo", "marimo", "marimo", "/", "access_token")


def add_notebook(command: Callable[[str], argparse.ArgumentParser]) -> None:
    p = command("notebook")  # its help: _MODULE_COMMANDS of named/cli.py
    p.add_argument("name", help="the pool's name")
    p.add_argument("--node", type=int, default=0, help="the node's rank, 0 to nodes-1 (default 0; with "
                   "--group: its rank within the group)")
    p.add_argument("--group", help="a node of this group (a pool of several groups)")
    p.add_argument("--marimo", action="store_true", help="a marimo server instead of JupyterLab")
    p.add_argument("--open", action="store_true",
                   help="open it in a browser (logged in with a one-time code, never the token on a command line)")
    p.add_argument("--port", type=int, default=0, help="the local port to serve on (default 0: a free one)")
    p.add_argument("--no-wake", action="store_true",
                   help="refuse with an error when the pool is asleep, instead of waking it for the notebook")
    p.set_defaults(handler=cmd_notebook)


def cmd_notebook(args: argparse.Namespace) -> int:
    from ..records import audit
    from .wake import awake

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: a port goes from 0 to 65535 (0 picks a free one).")
    flavor = MARIMO if args.marimo else JUPYTER
    with _stops_on_sigterm(), awake(args.name, wake=not args.no_wake, command="skyward notebook", node=args.node):
        _ensure_installed(args.name, args.node, flavor)
        with open_nodes(args.name, args.node, args.group) as (record, nodes):
            node = nodes[0]
            started = time.time()
            reason = _serve(args, flavor, node, record)
    audit.append(args.name, "notebook", record.get("id", ""), node=node.rank, hostname=node.hostname,
                 server=flavor.kind, seconds=round(time.time() - started, 1), stopped=reason)
    return EXIT_OK


@contextlib.contextmanager
def _stops_on_sigterm() -> Iterator[None]:
    """SIGTERM ends the command like Ctrl-C: the server on the node is stopped on the way out."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    saved = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved)


# -- the server's package on the node ------------------------------------------------------------
def _ensure_installed(name: str, rank: int, flavor: Flavor) -> None:
    from .install import install

    with open_nodes(name, rank) as (_, nodes):
        code, _out, _err = nodes[0].run(nodes[0].activate() + f"exec python -c {q(f'import {flavor.module}')}")
    if code == 0:
        return
    err(f"{flavor.title} is not installed on pool {name!r}: installing {flavor.package} on its nodes, "
        f"as `skyward install {name} {flavor.package}` would (recorded in the pool's lock)")
    # What the install says goes to stderr: this command's stdout is the notebook's URL.
    with contextlib.redirect_stdout(sys.stderr):
        failed = install(name, (flavor.package,), timeout=900.0)
    if failed:
        raise ProviderError(f"pool {name!r}: {flavor.package} could not be installed on its nodes (see above); "
                            f"`skyward install {name} {flavor.package}` tries again and says why.")


# -- the server on the node ---------------------------------------------------------------------
def _launch_script(node: Node, flavor: Flavor, record: dict[str, Any]) -> str:
    described = ((record.get("cluster") or {}).get("nodes") or [])
    mine: dict[str, Any] = next((n for n in described if int(n.get("index", -1)) == node.index), {})
    agent = mine.get("agent_pid") if isinstance(node, SSHNode) else mine.get("pid")
    watch = f" --watch-pid {int(agent)}" if agent else ""
    # A node whose streams come from another machine (Slurm's login node) is reached on its
    # private address only, never its loopback: the server listens there, behind its token.
    address = mine.get("private_ip") if _serves_on_private_ip(record) else None
    host = f" --host {q(str(address))}" if address else ""
    return (f"{node.activate()}exec python -m skyward.named.notebookserver {flavor.kind} "
            f'--root "$PWD"{watch}{host}')


def _serves_on_private_ip(record: dict[str, Any]) -> bool:
    from ..providers import provider_class

    try:
        return provider_class(str(record.get("provider"))).serve_on_private_ip
    except (KeyError, ConfigError):  # (a record of a provider this version does not have)
        return False


class _Server:
    """The launcher on the node (notebookserver.py): its JSON lines, and stopping it."""

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.lines: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._ended = False  # the launcher's output ended (it exited)
        self._stopped = False
        self._reader = threading.Thread(target=self._read, name="skyward-notebook-server", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        pending = b""
        try:
            while chunk := self.proc.read():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    with contextlib.suppress(ValueError):
                        self.lines.put(json.loads(line))
        except (OSError, EOFError, ValueError):
            pass
        finally:
            self.lines.put(None)

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The launcher's next message (None: it ended); polls so that Ctrl-C gets through."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self.lines.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError from None
                continue
            self._ended = self._ended or message is None
            return message

    def stop(self) -> str | None:
        """End the launcher's stdin: it stops the server (and its kernels) and exits. Its last
        word (why it stopped), when it said one within 30 s. Once done, doing it again is nothing."""
        if self._stopped:
            return None
        self._stopped = True
        self.proc.close_stdin()
        said = None
        deadline = time.monotonic() + 30
        while not self._ended and time.monotonic() < deadline:
            try:
                message = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if message is None:
                self._ended = True
            elif "stopped" in message:
                said = str(message["stopped"])
        if not self._ended:
            self.proc.kill()
            return said
        self._reader.join(5)
        self.proc.wait()
        return said


def _serve(args: argparse.Namespace, flavor: Flavor, node: Node, record: dict[str, Any]) -> str:
    token = secrets.token_urlsafe(32)
    server = _Server(node.start(_launch_script(node, flavor, record)))
    page = None
    try:
        server.proc.write((token + "\n").encode())  # the token on the launcher's stdin, never argv
        try:
            first = server.next(_START_TIMEOUT)
        except TimeoutError:
            raise ProviderError(f"{node.label} of pool {args.name!r}: {flavor.title} did not answer within "
                                f"{_START_TIMEOUT:g} s; its log is in {node.cwd}/.skyward-notebook/.") from None
        if first is None or "port" not in first:
            said = (first or {}).get("error") or f"it ended: {server.proc.stderr.strip()[-2000:] or 'no output'}"
            tail = (first or {}).get("tail") or ""
            raise ProviderError(
                f"{node.label} of pool {args.name!r}: {flavor.title} did not start ({said})."
                + (f" Its log ({first.get('log')}) ends with:\n{tail.rstrip()}" if tail and first else ""))
        port = int(first["port"])
        with Forwarder(lambda: node.open_stream(port), flavor, token, args.port) as forwarder:
            url = forwarder.base + flavor.login_path(token)
            if args.json:
                # One line, as soon as it serves: a program reads it and goes on.
                print(json.dumps({"url": url, "name": args.name, "node": node.rank, "hostname": node.hostname,
                            "server": flavor.kind, "cwd": node.cwd, "log": first.get("log")}), flush=True)
            else:
                print(f"{flavor.title} on {node.label} of pool {args.name!r}, in {node.cwd}: {url}", flush=True)
            err(f"(the token in this URL opens the server to whoever has it; Ctrl-C stops the server on "
                f"{node.label})")
            sys.stdout.flush()
            if args.open:
                from ..paths import skyward_home
                from .browser import open_in_browser, write_open_page

                page = write_open_page(skyward_home() / "notebook", forwarder.base + LOGIN_PATH,
                                       forwarder.codes.issue(), what=flavor.title)
                open_in_browser(page)
            try:
                while True:
                    message = server.next(365 * 86400.0)
                    if message is None:  # the launcher ended without a word: killed with the pool?
                        why = ("the pool was stopped" if _pool_gone(args.name, record.get("id"))
                               else server.proc.stderr.strip() or "no reason given")
                        err(f"the {flavor.title} server on {node.label} stopped: {why}")
                        return why
                    if "stopped" in message:
                        why = str(message["stopped"])
                        err(f"the {flavor.title} server on {node.label} stopped: {why}")
                        return why
            except KeyboardInterrupt:
                err(f"stopping the {flavor.title} server on {node.label}")
                said = server.stop()
                err(f"stopped ({said})" if said else "stopped")
                return "Ctrl-C"
    finally:
        if page is not None:
            page.unlink(missing_ok=True)
        server.stop()


def _pool_gone(name: str, pool_id: Any, wait: float = 15.0) -> bool:
    """Whether pool ``name`` (``pool_id``) was stopped: `skyward down` stops the nodes' processes
    first and forgets the record after, so its record may go a moment later."""
    from .registry import read

    deadline = time.monotonic() + wait
    while True:
        current = read(name)
        if current is None or current.get("id") != pool_id:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


class Forwarder(forward.Forwarder):
    """This command's local port (skyward.named.forward): the user's connections, carried to the
    notebook server on the node through ``connect()``."""

    def __init__(self, connect: Callable[[], Stream], flavor: Flavor, token: str, port: int = 0) -> None:
        super().__init__(connect, flavor, token, port, purpose="notebook",
                         hint="the URL that `skyward notebook` printed")
