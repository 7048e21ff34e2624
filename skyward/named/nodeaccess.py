"""A running named pool's nodes as places to run processes (``skyward ssh``, ``skyward cp``).

Each node is reached the way the pool reaches it. A Local node is this machine: a ``bash`` in
the node's working directory. An SSH node (and a cloud node, which is an SSH node of a stack)
is a session on the very SSH connection its agent's tunnel rides on, so the pool's pinned host
keys and its jump host apply, and nothing else is trusted. While a command runs, the pool is
attached like any client: its lease is renewed (a long shell does not let it expire) and
``skyward ls`` shows it in use.

What a shell gets is what the pool's tasks get: the node's working directory (the agent's, as
its handshake reports it), the pool's environment variables (``Image.env``, ``shell_vars``; on
SSH nodes the node's ``env.sh``), the shipped ``includes`` on ``PYTHONPATH``, and the node's
Python first on ``PATH`` (on SSH nodes the pool's virtualenv, activated).

The pool is attached for a look (``agentcalls.attached``: each node's channel, whose handshake
says its working directory); the provider says how a command reaches the node
(``pool.cluster.shell(index)``: this machine, the container runtime's ``exec``, or sessions of an
SSH connection) and how a stream reaches a port on it (``pool.cluster.open_stream``). A Slurm
node is reached through the login node: a session there runs ``srun --overlap`` into the node's
job, so the command runs on the node, inside the job, as its tasks do; a compute node is never
logged in to.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigError, ProviderError
from ..providers.base import Cluster, ExecShell, HereShell, SSHShell
from .groupviews import node_count

if TYPE_CHECKING:
    import paramiko

    from ..bootstrap.remote import Remote
    from ..bootstrap.routes import Stream, Target

q = shlex.quote
_WINDOW = 64 << 20  # SSH channel window: copies stream many MB per round trip
_CHUNK = 1 << 20


class Process(Protocol):
    """A command running on a node, its stdin and stdout as pipes (stderr is collected)."""

    def write(self, data: bytes | memoryview) -> None: ...
    def close_stdin(self) -> None: ...
    def read(self) -> bytes: ...  # what has arrived on stdout, any size; b"" at the end
    def wait(self) -> int: ...
    def kill(self) -> None: ...
    def interrupt(self) -> None: ...  # from another thread: make it end (its reader sees the end)
    @property
    def stderr(self) -> str: ...


@dataclass
class Node(abc.ABC):
    """One node of a named pool: ``rank`` is its position in the pool (``--node N``)."""

    pool: str
    rank: int
    index: int
    hostname: str
    cwd: str
    # The provider's way to a port or socket on the node (Cluster.open_stream, for this node).
    opener: Callable[[Target], Stream] | None = field(default=None, repr=False, kw_only=True)

    @property
    def label(self) -> str:
        return f"node {self.rank} ({self.hostname})"

    def open_stream(self, target: Target) -> Stream:
        """A stream to ``target`` on the node (a port on its loopback, or a Unix socket's path),
        the way the pool reaches it."""
        if self.opener is None:
            raise ProviderError(f"{self.label} of pool {self.pool!r}: its provider opens no streams to it.")
        return self.opener(target)

    @abc.abstractmethod
    def activate(self) -> str:
        """Shell code that enters the node's working directory with the pool's environment."""

    @abc.abstractmethod
    def start(self, script: str) -> Process:
        """Run ``script`` with bash on the node, stdin/stdout as pipes."""

    @abc.abstractmethod
    def attach(self, script: str) -> int:
        """Run ``script`` with bash on the node, attached to this terminal (or to this process's
        stdin/stdout/stderr when they are not one); its exit status."""

    def run(self, script: str) -> tuple[int, str, str]:
        """``script`` to the end: exit status, stdout, stderr."""
        proc = self.start(script)
        code, out = finish(proc)
        return code, out.decode(errors="replace"), proc.stderr


def finish(proc: Process) -> tuple[int, bytes]:
    """Close ``proc``'s stdin, read its stdout to the end and wait: (exit status, stdout). It is
    killed if anything fails meanwhile (Ctrl-C included)."""
    try:
        proc.close_stdin()
        out = bytearray()
        while chunk := proc.read():
            out += chunk
        return proc.wait(), bytes(out)
    except BaseException:
        proc.kill()
        raise


# -- Local nodes: this machine ----------------------------------------------------------------------
@dataclass
class LocalNode(Node):
    env: dict[str, str] = field(default_factory=dict)  # the pool's variables (record: cluster.env)

    def _environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def activate(self) -> str:
        # Local nodes run the client's interpreter (skyward's own, here).
        bindir = os.path.dirname(sys.executable)
        return (f"cd -- {q(self.cwd)} || exit 1\n"
                f"export PATH={q(bindir)}\"${{PATH:+:$PATH}}\"\n")

    def start(self, script: str) -> Process:
        return _PopenProcess(["bash", "-c", script], self._environ())

    def attach(self, script: str) -> int:
        # The variables go in the environment, not on a command line other users can read.
        return _wait_in_foreground(subprocess.Popen(["bash", "-c", script], env=self._environ()))


def _wait_in_foreground(proc: subprocess.Popen[bytes]) -> int:
    """Wait for a shell that has the terminal: its Ctrl-C / Ctrl-\\ / Ctrl-Z are the shell's, so
    this process ignores them meanwhile (only once the child started: an ignored signal would be
    ignored by the child too). Its exit status as a shell says it."""
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP)}
    try:
        code = proc.wait()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


class _PopenProcess:
    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        # A session of its own: the terminal's Ctrl-C is skyward's, which then interrupts it.
        self._p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True)
        self._err = bytearray()
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        assert self._p.stderr is not None
        while chunk := os.read(self._p.stderr.fileno(), 65536):
            self._err += chunk

    def write(self, data: bytes | memoryview) -> None:
        assert self._p.stdin is not None
        self._p.stdin.write(data)
        self._p.stdin.flush()  # written means sent, as on an SSH channel (a token line must not wait)

    def close_stdin(self) -> None:
        assert self._p.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._p.stdin.close()

    def read(self) -> bytes:
        assert self._p.stdout is not None
        return os.read(self._p.stdout.fileno(), _CHUNK)

    def wait(self) -> int:
        code = self._p.wait()
        self._reader.join()
        for pipe in (self._p.stdout, self._p.stderr):
            if pipe is not None:
                pipe.close()
        return 128 - code if code < 0 else code

    def kill(self) -> None:
        # End of input and output first: the command ends on its own (its cleanup traps run,
        # a tar stops at a truncated archive or a closed pipe); killed only if it does not.
        self.close_stdin()
        if self._p.stdout is not None:
            self._p.stdout.close()
        try:
            self._p.wait(5)
        except subprocess.TimeoutExpired:
            self._p.kill()
        self.wait()

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self._p.pid, signal.SIGTERM)

    @property
    def stderr(self) -> str:
        return self._err.decode(errors="replace")


# -- SSH nodes (and cloud nodes): sessions on the pool's SSH connection -------------------------------
@dataclass
class SSHNode(Node):
    remote: Remote | None = None
    venv: str | None = None  # the pool's virtualenv on the node
    # Slurm: the connection is the login node's, and this turns a command (and whether it runs on
    # a terminal) into the line that carries it into the node's job there (srun --overlap).
    wrap: Callable[[str, bool], str] | None = None

    def _command(self, script: str, tty: bool) -> str:
        command = f"bash -c {q(script)}"
        return self.wrap(command, tty) if self.wrap is not None else command

    @property
    def _transport(self) -> paramiko.Transport:
        assert self.remote is not None
        return self.remote.transport

    def activate(self) -> str:
        return _activate_pool_folder(self.cwd, self.venv)

    def start(self, script: str) -> Process:
        with self._session():
            return _ChannelProcess(self._transport, self._command(script, False))

    def attach(self, script: str) -> int:
        from .terminal import run_channel

        tty = os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())  # as run_channel decides
        with self._session():
            return run_channel(self._transport, self._command(script, tty))

    @contextlib.contextmanager
    def _session(self) -> Iterator[None]:
        """A session the SSH connection refused, or a connection that broke: this node's error."""
        import paramiko

        try:
            yield
        except BrokenPipeError:  # this side's stdout closed (`skyward ssh NAME -- cmd | head`)
            raise
        except (paramiko.SSHException, EOFError, ConnectionError) as exc:
            raise ProviderError(f"{self.label}: its SSH connection failed ({type(exc).__name__}: {exc}); "
                                f"`skyward status {self.pool}` shows whether it answers.") from None


def _activate_pool_folder(cwd: str, venv: str | None) -> str:
    """What the agent's start command does on a bootstrapped node (providers/ssh.py,
    providers/container_node.py), plus the venv on PATH."""
    lines = [f"cd -- {q(cwd)} || exit 1",
             "if [ -f ./env.sh ]; then . ./env.sh; fi",
             # the shipped includes, and the live folder `skyward install` fills
             'PP=""; if [ -d ./includes ]; then PP="$PWD/includes"; fi',
             'if [ -d ./site ]; then PP="${PP:+$PP:}$PWD/site"; export SKYWARD_SITE="$PWD/site"; fi',
             'if [ -n "$PP" ]; then export PYTHONPATH="$PP${PYTHONPATH:+:$PYTHONPATH}"; fi; unset PP']
    if venv:
        lines += [f"if [ -d {q(venv)} ]; then export VIRTUAL_ENV={q(venv)}; "
                  f'export PATH="$VIRTUAL_ENV/bin${{PATH:+:$PATH}}"; fi']
    return "\n".join(lines) + "\n"


# -- container nodes (sky.Container): a process in the node's container, through the runtime's exec ------
@dataclass
class ContainerNode(Node):
    argv: Callable[[bool], list[str]] | None = None  # the runtime's `exec` into the node (tty or not)
    venv: str | None = None

    def activate(self) -> str:
        return _activate_pool_folder(self.cwd, self.venv)

    def _argv(self, script: str, tty: bool) -> list[str]:
        assert self.argv is not None
        return [*self.argv(tty), "bash", "-c", script]

    def start(self, script: str) -> Process:
        return _PopenProcess(self._argv(script, False), dict(os.environ))

    def attach(self, script: str) -> int:
        tty = os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())
        return _wait_in_foreground(subprocess.Popen(self._argv(script, tty)))


class _ChannelProcess:
    def __init__(self, transport: paramiko.Transport, command: str) -> None:
        self._chan = transport.open_session(window_size=_WINDOW)
        self._chan.exec_command(command)
        self._err = bytearray()
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            while chunk := self._chan.recv_stderr(_WINDOW):
                self._err += chunk

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            sent = self._chan.send(view[:_CHUNK])
            if sent <= 0:
                raise BrokenPipeError("the node closed the SSH channel while receiving")
            view = view[sent:]

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self._chan.shutdown_write()

    def read(self) -> bytes:
        # Everything buffered at once: paramiko moves the rest of its buffer (up to the window,
        # 64 MB) on every read that takes less than all of it, which made small reads crawl.
        return bytes(self._chan.recv(_WINDOW))

    def wait(self) -> int:
        code = self._chan.recv_exit_status()
        self._reader.join(10)
        self._chan.close()
        return 255 if code < 0 else code  # no status: the command was killed by a signal

    def kill(self) -> None:
        self._chan.close()
        self._reader.join(10)

    def interrupt(self) -> None:
        self._chan.close()  # the node's command sees its input end, or its output go nowhere

    @property
    def stderr(self) -> str:
        return self._err.decode(errors="replace")


# -- opening a pool's nodes -----------------------------------------------------------------------------
def ranks_of(record: dict[str, Any], node: int | None) -> list[int]:
    """The ranks ``--node`` picks (all without it), checked against the pool's nodes."""
    name = record["name"]
    count = node_count(record)
    if node is None:
        return list(range(count))
    if 0 <= node < count:
        return [node]
    if count == 0:
        from .pools import status_of

        why = ("it is asleep; `skyward ssh`, `cp`, `exec` and `install` wake it unless --no-wake is given, "
               "with node 0") if status_of(record).asleep else \
            f"it is {status_of(record).state}; `skyward status {name}` says more"
        raise ConfigError(f"--node {node}: pool {name!r} has no node right now: {why}.")
    has = "node 0 only" if count == 1 else f"nodes 0 to {count - 1}"
    raise ConfigError(f"--node {node}: pool {name!r} has {has} (`skyward status {name}` lists them).")


@contextlib.contextmanager
def open_nodes(name: str, node: int | None, group: str | None = None) -> Iterator[tuple[dict[str, Any], list[Node]]]:
    """Attach to running pool ``name`` for a look (agentcalls.attached: no healing, no audit
    entry) and hand out its nodes (``node``: only that rank; None: every node; ``group``: of that
    group only, ``node`` being the rank within it: a pool of several groups needs it with
    ``node``). A node that cannot be reached is an error naming it: nothing runs on the others then."""
    from .agentcalls import attached
    from .groupviews import group_view, group_views, pool_rank
    from .pools import get

    first = get(name)
    views = group_views(first)
    if node is not None and group is None and len(views) > 1:  # the pool-wide rank: group after group
        group, node = pool_rank(first, views, node)
    ranks_of(group_view(first, group, ""), node)  # a wrong --node or --group fails before anything connects
    with attached(name, group) as (_pool, described):
        record = get(name)
        wanted = [found for found in described if node in (None, found.rank)]
        if not wanted:
            raise ProviderError(f"pool {name!r} has {len(described)} node(s) now; `skyward status {name}` "
                                f"lists them.")
        nodes: list[Node] = []
        views = group_views(record)
        for found in wanted:
            if found.channel is None:
                raise ProviderError(
                    f"{found.label} of pool {name!r} cannot be reached: {found.why}. `skyward status "
                    f"{name}` shows each node" + ("; --node picks one that answers." if len(wanted) > 1 else "."))
            view = views.get(found.group, record)
            nodes.append(_node(view, found.cluster, found.rank, found.description, found.channel.facts))
        yield record, nodes



def pool_nodes(pool: Any, ranks: list[int]) -> list[Node]:
    """Nodes ``ranks`` of a pool this process holds open (a plugin bringing files back before
    the pool closes), reached as ``open_nodes`` reaches a named pool's: on the pool's own
    connections, in each node's working directory."""
    described = pool.cluster.describe()
    by_index = {int(n["index"]): n for n in described.get("nodes", [])}
    record = {"name": pool.name or pool.id, "provider": described.get("provider"), "cluster": described}
    nodes: list[Node] = []
    for rank in ranks:
        channel = pool.members.wait_rank(rank)
        desc = by_index.get(channel.node, {"index": channel.node})
        nodes.append(_node(record, pool.cluster, rank, desc, channel.facts))
    return nodes


def _node(record: dict[str, Any], cluster: Cluster, rank: int, desc: dict[str, Any], facts: dict[str, Any]) -> Node:
    name, index = record["name"], int(desc["index"])
    host = str(facts.get("hostname") or desc.get("hostname") or "?")
    cwd = str(facts.get("cwd") or desc.get("pool_dir") or "")
    shell = cluster.shell(index)
    opener = functools.partial(cluster.open_stream, index)
    if isinstance(shell, HereShell):
        env = {str(k): str(v) for k, v in ((record.get("cluster") or {}).get("env") or {}).items()}
        return LocalNode(name, rank, index, host, cwd, env=env, opener=opener)
    home, python = desc.get("home") or "", desc.get("agent_python") or ""
    venv = os.path.dirname(os.path.dirname(f"{home}/{python}")) if home and python else None
    if isinstance(shell, ExecShell):
        return ContainerNode(name, rank, index, host, cwd, argv=shell.argv, venv=venv, opener=opener)
    if isinstance(shell, SSHShell):
        return SSHNode(name, rank, index, host, cwd, remote=shell.remote, venv=venv, wrap=shell.wrap, opener=opener)
    raise ProviderError(f"pool {name!r}: provider {record.get('provider')!r} gives no shell on its "
                        f"nodes in this version of skyward; `skyward exec {name} -- CMD` runs commands there.")
