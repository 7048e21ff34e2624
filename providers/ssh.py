"""sky.SSH(hosts=[...]): machines you already have, reached over SSH.

This is also the last mile of every cloud provider: a stack's outputs become `SSHHost`s and an
`SSHCluster` bootstraps them exactly like SSH hosts. For each node, in parallel, while the client
prepares what the nodes get (the shipment):

1. connect (Fabric, retried while the host boots; host key recorded on first use or given), or
   take the connection an earlier pool of this process left (Remote.park);
2. one command (script.node_up) does the rest: the node's folders; what it lacks of the uv
   binary, the wheelhouse (skyward's own wheel, always) and the `includes` archive, sent back
   on the same channel; the bootstrap script rendered from the final Image, one event per
   phase; the agent started detached (token handed over on that command's stdin, never on a
   command line), its start-up line read back;
3. reach the agent through a direct-streamlocal channel of the same SSH connection.

A warm host costs the login and that one command (tests/ssh/test_round_trips.py counts them).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import ipaddress
import itertools
import json
import logging
import math
import os
import random
import re
import secrets
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

# What every node gets is shared with sky.Slurm through bootstrap/ (a provider never imports another).
from skyward.bootstrap.shipment import Shipment as _Shipment
from skyward.bootstrap.shipment import facts as _facts
from skyward.bootstrap.shipment import phase_command as _phase_command
from skyward.bootstrap.shipment import volume_plan as _volume_plan  # noqa: F401  (tests import it from here)
from skyward.errors import BootstrapError, ConfigError, ProviderError
from skyward.observe import events as ev
from skyward.records import pkglock, resolver

from .base import Cluster, NodeEndpoint, ProviderConfig, SSHShell, require_kind
from .nodetable import NodeTable

if TYPE_CHECKING:
    from skyward.bootstrap.remote import Remote
    from skyward.bootstrap.routes import Stream, Target
    from skyward.spec import Image, Options, Spec

log = logging.getLogger("skyward.ssh")
Install = Literal["wheelhouse", "index"]
_AGENT_START_TIMEOUT = 30
_REJOIN_WAIT = 20.0  # for a connection to a pool host, to reach a lost link's agent again (_rejoin)


# Seconds a cloud node may take from "running" to accepting the pool's key over SSH.
CLOUD_SSH_TIMEOUT = 600.0


@dataclass(frozen=True, slots=True)
class SSHHost:
    """One machine to bootstrap: where to log in, and how the other nodes reach it."""

    address: str  # where the client connects (a name from ~/.ssh/config works too)
    port: int | None = None  # None: ~/.ssh/config, else 22
    user: str | None = None  # None: ~/.ssh/config, else the local user name
    key: str | None = None  # private key file; None: ~/.ssh/config, the agent, ~/.ssh/id_*
    private_ip: str | None = None  # the address other nodes use (default: the one we connect to)
    hostname: str | None = None
    host_key: str | None = None  # "ssh-ed25519 AAAA...": known in advance, the only one accepted
    jump: str | None = None  # "[user@]bastion[:port]": reached through this host (None: ~/.ssh/config)

    def __post_init__(self) -> None:
        _check_port(self.port, f"sky.SSH: port {self.port!r} of host {self.address!r}")
        if self.jump is not None:
            parse_jump(self.jump, f"sky.SSHHost(jump={self.jump!r})")

    @classmethod
    def parse(cls, text: str) -> SSHHost:
        """``[user@]host[:port]`` (``[v6addr]:port`` for IPv6)."""
        m = re.fullmatch(r"(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:@\s]+))(?::(?P<port>\d+))?", text)
        if not m:
            raise ConfigError(
                f"sky.SSH(hosts=[{text!r}]): not a host; write 'host', 'user@host' or 'user@host:port'."
            )
        port = int(m["port"]) if m["port"] else None
        return cls(address=m["v6"] or m["host"], port=port, user=m["user"])


def parse_jump(text: object, label: str) -> SSHHost:
    """A jump host, ``[user@]host[:port]``: checked where it is given, not at connect time."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{label}: a jump host is written 'user@bastion' or 'user@bastion:2222'.")
    try:
        return SSHHost.parse(text.strip())
    except ConfigError:
        raise ConfigError(
            f"{label}: not a jump host; write 'bastion', 'user@bastion' or 'user@bastion:2222' "
            f"(several hops: put ProxyJump in ~/.ssh/config)."
        ) from None


def _check_port(port: object, label: str) -> None:
    """A TCP port is 1..65535; anything else would only fail later, at connect time."""
    if port is None:
        return
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(
            f"{label} is not a TCP port: ports go from 1 to 65535 "
            f"(sshd listens on 22 unless configured otherwise). Write e.g. 'me@10.0.0.1:2222'."
        )


@dataclass(frozen=True, slots=True)
class SSH(ProviderConfig):
    """Machines you have: ``sky.SSH(hosts=["10.0.0.5", "gpu-box", "me@10.0.0.7:2222"])``.

    ``user``, ``key`` and ``port`` apply to hosts that do not set their own (``~/.ssh/config``
    is honoured for names defined there). ``install``: ``"wheelhouse"`` (default: the client
    builds wheels for everything the nodes need and uploads them, so nodes need no index and
    get exactly the client's versions) or ``"index"`` (nodes install ``Image.pip`` from their
    own package index; skyward's wheel and uv are still shipped). ``jump``: a bastion,
    ``"user@bastion:port"``, that every host is reached through (``ProxyJump`` in
    ``~/.ssh/config`` works too, per host); the agents' tunnels go through it. ``known_hosts``:
    the file where host keys, the jump host's included, are recorded on first contact and
    checked after (default ``SKYWARD_HOME/known_hosts``). ``direct=True``: on hosts whose
    address is private (10/8, 172.16/12, 192.168/16, fc00::/7, loopback) and not behind a jump
    host, the client talks to the agents over plain TCP on that address instead of through
    the SSH tunnel (about 4x the payload throughput); the connection is checked with the
    pool's token but not encrypted, so use it on networks you trust. A host where the direct
    connection fails keeps the tunnel. ``fanout=True``: the client logs into the first host
    only, and that host starts the others with OpenSSH, signing with the client's key through a
    forwarded ssh-agent (the key itself never leaves the client): a large fleet costs the client
    one login instead of one per host (see providers/ssh_fanout.py for which hosts qualify; the
    others get the client's own login). The agents it starts listen on their hosts' private
    addresses (links checked with the pool's token, not encrypted: the network between the
    hosts is trusted, as it is for the nodes' collections); the client reaches them there with
    ``direct=True``, else through the first host's SSH connection.
    """

    hosts: Sequence[str | SSHHost] = ()
    user: str | None = None
    key: str | None = None
    port: int | None = None
    install: Install = "wheelhouse"
    jump: str | None = None
    known_hosts: str | None = None
    direct: bool = False
    fanout: bool = False
    kind: ClassVar[str] = "ssh"
    _parsed: tuple[SSHHost, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        if isinstance(self.hosts, str):
            raise ConfigError(f"sky.SSH(hosts={self.hosts!r}): hosts is a list; write hosts=[{self.hosts!r}].")
        if not self.hosts:
            raise ConfigError("sky.SSH(hosts=[]): give at least one host, e.g. hosts=['10.0.0.5'].")
        if self.install not in ("wheelhouse", "index"):
            raise ConfigError(f"sky.SSH(install={self.install!r}) is not valid: use 'wheelhouse' or 'index'.")
        if not isinstance(self.direct, bool):
            raise ConfigError(f"sky.SSH(direct={self.direct!r}) is not valid: use True or False.")
        if not isinstance(self.fanout, bool):
            raise ConfigError(f"sky.SSH(fanout={self.fanout!r}) is not valid: use True or False.")
        _check_port(self.port, f"sky.SSH(port={self.port!r})")
        if self.key is not None and not Path(self.key).expanduser().is_file():
            raise ConfigError(f"sky.SSH(key={self.key!r}): no such file; give the path of a private key.")
        if self.jump is not None:
            parse_jump(self.jump, f"sky.SSH(jump={self.jump!r})")
        if self.known_hosts is not None:
            folder = Path(self.known_hosts).expanduser().parent
            if not isinstance(self.known_hosts, str | os.PathLike) or not folder.is_dir():
                raise ConfigError(
                    f"sky.SSH(known_hosts={self.known_hosts!r}): the folder {folder} does not exist; give "
                    f"the path of a known_hosts file in an existing folder (it is created on first use).")
        parsed = []
        for h in self.hosts:
            host = SSHHost.parse(h) if isinstance(h, str) else h
            if not isinstance(host, SSHHost):
                raise ConfigError(f"sky.SSH(hosts=[..., {h!r}]): a host is a string or sky.SSHHost(...).")
            parsed.append(SSHHost(
                address=host.address, port=host.port or self.port, user=host.user or self.user,
                key=host.key or self.key, private_ip=host.private_ip, hostname=host.hostname,
                host_key=host.host_key, jump=host.jump or self.jump,
            ))
        object.__setattr__(self, "hosts", tuple(self.hosts))
        object.__setattr__(self, "_parsed", tuple(parsed))

    def check(self, spec: Spec) -> str | None:
        want = spec.node_spec.max or spec.node_spec.desired
        if want > len(self._parsed):
            return f"{want} node(s) asked for and sky.SSH has {len(self._parsed)} host(s)"
        if spec.volumes:
            from skyward.volumes import Volume

            if not all(isinstance(v, Volume) for v in spec.volumes):
                return "sky.Disk applies to cloud providers only (SSH hosts keep their own disks)"
            if any(v.storage is None for v in spec.volumes):
                return ("SSH hosts have no object store of their own: give each sky.Volume a storage=, "
                        "e.g. sky.storage.S3(region='us-east-1')")
        return None

    def hourly_cost(self, spec: Spec) -> float | None:
        return 0.0  # machines you already have

    def create(self, spec: Spec, pool_id: str, options: Options | None = None, name: str | None = None,
               pin: tuple[pkglock.Package, ...] | None = None) -> SSHCluster:
        cluster = SSHCluster(spec, pool_id, self._parsed, options=options, install=self.install,
                             known_hosts=self.known_hosts, direct=self.direct, pin=pin, fanout=self.fanout)
        cluster.named = name is not None
        return cluster

    # -- named pools (see ProviderConfig) --------------------------------------------------------
    def attach(self, description: dict[str, Any]) -> SSHCluster:
        return SSHCluster.from_description(description)

    def destroy(self, description: dict[str, Any]) -> None:
        SSHCluster.from_description(description).close()

    def alive(self, description: dict[str, Any]) -> bool | None:
        """Not known without connecting: the registry judges SSH pools by their ttl."""
        return None

    def probe(self, description: dict[str, Any]) -> bool | None:
        """Ask the hosts whether any agent of a described pool still runs (None: none answered)."""
        cluster = SSHCluster.from_description(description)
        try:
            return cluster.alive()
        finally:
            cluster.detach()


@dataclass
class _Node:
    index: int
    host: SSHHost
    remote: Remote | None = None
    agent_pid: int | None = None
    agent_port: int | None = None  # on the node's loopback (agents of earlier versions)
    agent_socket: str = ""  # the agent's Unix socket in the node's pool folder (reached through sshd)
    agent_id: str = ""  # the agent's identity, from its start-up line (NodeEndpoint.agent_id)
    direct_port: int | None = None  # on the node's private address (sky.SSH(direct=True))
    direct_host: str = ""  # that address, as the client reached it (its ~/.ssh/config applied)
    endpoint: NodeEndpoint | None = None
    home: str = ""  # skyward's caches on the node (the login user's home: maybe shared by hosts)
    agent_python: str = ""  # the agent's interpreter, relative to home (for the relay fallback)
    pool_dir: str = ""  # this node's folder of the pool, on node-local disk (script.NODE_DIRS)
    opening: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    fan: Any = None  # how the first node logs into this one (ssh_fanout.Dest), once worked out
    # The node whose login started this one (fan-out): its agent listens on the private address
    # too, and without direct=True the client reaches it through that node's SSH connection.
    fanned_by: _Node | None = None
    rejoined: bool = False  # the same agent as a lost node's, reached again (SSHCluster._rejoin)


class _UpReader:
    """What a node's start (script.node_up) prints, read as it comes: its phases (events), its
    folders, its facts, what it lacks of the shipment (``answer``: sent back on the same channel,
    read as it is sent: 20 MB a fresh node), and at the end whether it started (``check``). The
    client's own login reads one; a start made by the pool's first node (fan-out) another."""

    def __init__(self, cluster: SSHCluster, node: _Node, ship: _Shipment) -> None:
        from skyward.bootstrap.progress import PhaseReader

        self.cluster, self.node, self.ship = cluster, node, ship
        self.facts: dict[str, str] = {}
        self.started: dict[str, float] = {}
        self.current = ""  # the phase running: "connect", "upload", a script phase, "agent"
        self.seen: set[str] = set()
        # Each step its own limit: the uploads none (as large as the wheelhouse), the script
        # bootstrap_timeout, the agent's start _AGENT_START_TIMEOUT (the node waits that long).
        self.limit = time.monotonic() + cluster._ssh_timeout + _AGENT_START_TIMEOUT
        self.progress = PhaseReader(node.index, cluster._phase, apt=cluster.apt_versions,
                                    lock=lambda: cluster.package_lock)
        self.current = "connect"

    def on_line(self, line: str) -> None:
        node, cluster = self.node, self.cluster
        before = self.progress.current
        if self.progress.feed(line):
            if self.progress.current != before:  # a phase started: a failure now is reported in it
                self.current = self.progress.current
            return
        if line.startswith(("@@sky ", "@@pool ")):  # known at once: a failure later cleans this folder up
            key, _, value = line[2:].partition(" ")
            if key == "sky":
                node.home = value.strip()
            else:
                node.pool_dir = node.pool_dir or value.strip()  # a node restarted in place keeps its folder
            return
        if line.startswith("@@need"):
            self.seen.add("need")
            self.limit = math.inf
            cluster._phase(node.index, "upload", "started")
            self.started["upload"], self.current = time.monotonic(), "upload"
            return
        if line == "@@received":
            self.seen.add("received")
            self.limit = time.monotonic() + cluster._bootstrap_timeout
            cluster._phase(node.index, "upload", "done", time.monotonic() - self.started.get("upload", time.monotonic()))
            self.current = ""
            return
        if line == "@@skyward ready":
            self.seen.add("ready")
            self.limit = time.monotonic() + _AGENT_START_TIMEOUT + 10
            self.current = "agent"
            return
        if line.startswith("@@skyward pid "):
            self.facts["script"] = line  # (what stops the script when it runs out of time)
            return
        if line.startswith("@@") and not line.startswith("@@skyward"):
            self.facts.update(_facts(line))  # (kept here: the output's head is not kept)
        elif line.strip():
            log.debug("node %d: %s", node.index, line)

    def answer(self, line: str) -> Iterable[bytes] | None:
        """What the node lacks (``@@need``), sent on the same channel as it is read (the files
        are not all read into memory first); nothing (and no wait on the node) when it lacks nothing."""
        from skyward.bootstrap.remote import tar_archive

        if not line.startswith("@@need"):
            return None
        ship = self.ship
        shared = [(p, *ship.files[p]) for p in line[len("@@need"):].split() if p in ship.files]
        if not shared:
            return []
        size_shared, shared_parts = tar_archive(shared)
        return itertools.chain([f"{size_shared}\n".encode()], shared_parts)

    def timed_out(self, exc: BootstrapError) -> BootstrapError:
        phase = self.current or "bootstrap"
        cluster = self.cluster
        why = (f"did not report its port within {_AGENT_START_TIMEOUT} s" if phase == "agent" else
               "did not answer (timed out)" if phase == "connect" else
               f"did not finish within bootstrap_timeout={cluster._bootstrap_timeout:g} s")
        return BootstrapError(
            host=exc.host, phase=phase, command=_phase_command(self.ship.script, phase), exit_code=None,
            output=[line for line in exc.output if not line.startswith("@@")], why=why,
        )

    def check(self, code: int, lines: list[str], label: str, user: str | None) -> None:
        """Raise what went wrong, if the node did not start its agent."""
        from skyward.bootstrap.script import sudo_advice

        ship = self.ship
        refused = self.facts.get("sudo")
        if refused is not None and refused != "ok":
            user = user or "the login user"
            raise ProviderError(
                f"{label}: Image(apt={list(ship.apt)!r}) installs system packages, which needs root; "
                f"{user} is not root and sudo -n will not run `apt-get install` of them for {user} there "
                f"({refused.strip()}). {sudo_advice(user, ship.apt)}"
            )
        if code != 0 or "ready" not in self.seen:
            seen, current = self.seen, self.current
            phase = ("connect" if "need" not in seen else "upload" if "received" not in seen
                     else current if current not in ("", "agent") else "bootstrap")
            raise BootstrapError(
                host=label, phase=phase,
                command=(_phase_command(ship.script, phase) if phase not in ("connect", "upload")
                         else "tar -x" if phase == "upload" else "bash -s (the node's folders)"),
                exit_code=code, output=[line for line in lines if not line.startswith("@@")][-30:],
            )


class SSHCluster(Cluster):
    """Nodes reached over SSH. ``grow``/``shrink``/``on_close`` let a cloud provider add hosts
    beyond ``hosts``, release them, and destroy its stack at the end."""

    def __init__(
        self,
        spec: Spec,
        pool_id: str,
        hosts: Sequence[SSHHost],
        *,
        options: Options | None = None,
        install: Install = "wheelhouse",
        grow: Callable[[int], list[SSHHost]] | None = None,
        shrink: Callable[[list[SSHHost]], None] | None = None,
        on_close: Callable[[], None] | None = None,
        kind: str = "ssh",
        describe_extra: Callable[[], dict[str, Any]] | None = None,
        known_hosts: str | None = None,
        direct: bool = False,
        pin: tuple[pkglock.Package, ...] | None = None,
        fanout: bool = False,
    ) -> None:
        self.spec = spec
        self._fanout = fanout
        self._known_hosts = known_hosts
        self._direct = direct
        self.pool_id = pool_id
        self.token = secrets.token_urlsafe(32)
        self.head_port = random.randrange(20000, 30000)  # the address of torch/jax rendezvous
        self.interface = "eth0"
        self.spill_dir = None
        # A named pool's node folders are never swept (hold_pool's .kept): it may be attached again
        # after its agents died, and restarts them in those folders; `skyward down` removes them.
        self.named = False
        self._free = list(hosts)
        self._install = install
        self._grow, self._shrink, self._on_close = grow, shrink, on_close
        # A cloud provider's pools: its kind in the description, plus what reopens its stack.
        self._kind, self._describe_extra = kind, describe_extra
        self.table: NodeTable[_Node] = NodeTable()
        self._lock = self.table.lock
        self._ship: _Shipment | None = None
        o = options
        # A fresh cloud instance is "running" minutes before sshd has its key (GPU images boot
        # slowly, cloud-init installs the planned host key and login user late): clouds get a
        # longer budget by default, and a refused login or another host key counts as "not
        # ready yet" inside it (see Remote(booting=True)).
        self._ssh_timeout = float(o.ssh_timeout) if o is not None and o.ssh_timeout else (
            60.0 if kind == "ssh" else CLOUD_SSH_TIMEOUT)
        self._bootstrap_timeout = float(
            o.bootstrap_timeout if o is not None and o.bootstrap_timeout else spec.image.bootstrap_timeout
        )
        self._ttl = spec.ttl
        self._pin = pin  # reproducing a pool: install its recorded packages
        self.node_architecture: str | None = None  # cloud nodes: the offer's (lock resolution)
        self.apt_versions: dict[str, str] = {}  # what apt installed on the first node to report

    @property
    def _nodes(self) -> dict[int, _Node]:
        """The nodes claimed or handed out (the table's, under ``_lock``)."""
        return self.table.nodes

    # -- Cluster API -------------------------------------------------------------------------
    def start(self, count: int) -> list[NodeEndpoint]:
        return self.table.start(count, reconnect=self._reconnect, begin=self._begin, release=self._release,
                                workers=32, log=log)

    def start_each(self, count: int) -> Iterator[NodeEndpoint | BaseException]:
        """Each node as soon as it is bootstrapped (Nodes(min=): slow hosts join later)."""
        return self.table.start_each(count, reconnect=self._reconnect, begin=self._begin, release=self._release,
                                     workers=32)

    def _begin(self, count: int) -> tuple[list[_Node], Callable[[_Node], NodeEndpoint]]:
        """``count`` unused hosts (a cloud's stack grows for them), connected to while the
        shipment is built."""
        nodes = self._claim(count)
        ready = self._prepare_meanwhile()
        fan = self._fan_out(nodes, ready)
        if fan is None:
            return nodes, lambda n: self._bring_up(n, None, ready)

        def up(node: _Node) -> NodeEndpoint:
            from .ssh_fanout import Fallback

            if node.index not in fan.futures:
                return self._bring_up(node, None, ready)
            try:
                return fan.endpoint(node)
            except Fallback as why:
                if node is fan.first:
                    raise
                log.info("node %d (%s): logging in from the client (%s)", node.index, node.host.address, why)
                node.fanned_by = None  # (its agent is reached as the client's own logins' are)
                return self._bring_up(node, None, ready)

        return nodes, up

    def _fan_out(self, nodes: list[_Node], ready: Future[None]) -> Any:
        """sky.SSH(fanout=True): the first of ``nodes`` starts those it can (ssh_fanout.FanOut),
        or None where it would start none."""
        if not self._fanout or len(nodes) < 2:
            return None
        from .ssh_fanout import Dest, FanOut, destination

        first, rest = nodes[0], {}
        for node in nodes[1:]:
            dest = destination(self, node)
            if isinstance(dest, Dest):
                rest[node.index] = (node, dest)
            else:
                log.info("node %d (%s): the client logs in itself: %s", node.index, node.host.address, dest)
        if not rest:
            return None
        return FanOut(self, first, rest, self._bring_up, ready)

    # What ssh_fanout uses of this module, through the cluster (it does not import this module).
    agent_start_timeout = _AGENT_START_TIMEOUT

    def up_reader(self, node: _Node) -> _UpReader:
        assert self._ship is not None
        return _UpReader(self, node, self._ship)

    @staticmethod
    def direct_address(host: SSHHost, address: str) -> str | None:
        return direct_address(host, address)

    def _fanned_endpoint(self, node: _Node, address: str, port: int | None, pid: int,
                         facts: dict[str, str]) -> NodeEndpoint:
        """A node the first node started: reached on its direct port (with direct=True
        straight, else through the first node's connection), logged into when needed."""
        h = node.host
        node.agent_pid, node.agent_port = pid, port
        node.direct_port = int(facts["direct_port"]) if facts.get("direct_port") else None
        node.direct_host = address if node.direct_port else ""
        login = functools.partial(self._logged_in, node)
        if self._direct or not node.direct_port:
            connect = functools.partial(_connect_agent, login, node.agent_socket or node.agent_port, node_python(node),
                                        (address, node.direct_port) if node.direct_port else None)
        else:
            connect = functools.partial(_relayed_agent, node, address, login)
        node.endpoint = NodeEndpoint(
            index=node.index,
            private_ip=h.private_ip or facts.get("ip") or address,
            public_ip=h.address if h.private_ip and h.private_ip != h.address else None,
            hostname=h.hostname or facts.get("hostname") or h.address,
            connect=connect,
            agent_id=node.agent_id,
        )
        return node.endpoint

    def stop(self, endpoints: list[NodeEndpoint]) -> None:
        """Release these nodes (a pool shrinking, or asleep at zero). Their hosts become unused
        again: a plain SSH pool's next growth or wake takes them; a cloud's stack drops them."""
        nodes = self.table.held(e.index for e in endpoints)
        self._release(nodes)
        if self._grow is None:
            with self._lock:
                self._free.extend(n.host for n in nodes if n.host not in self._free)

    def close(self) -> None:
        with self._lock:
            stale = self._stale_nodes()
        nodes = [*self.table.clear(), *stale]
        try:
            # No shrink first: a cloud's on_close destroys the stack, instances and all, in one go.
            self._release(nodes, shrink=False)
        finally:
            if self._on_close is not None:
                self._on_close()

    # -- preparing what every node gets ------------------------------------------------------
    def _prepare(self) -> None:
        from skyward.bootstrap import shipment

        with self._lock:
            if self._ship is not None:
                return
            image, ops = self._final_image()
            self._ship, self.package_lock = shipment.build(
                self.spec, image, ops, pool_id=self.pool_id, install=self._install, kind=self._kind,
                pin=self._pin, platform=self._platform(), reuse_lock=True, uv_lz4=True,
                on_phase=lambda node, phase, status, seconds: self._phase(node, phase, status, seconds))

    def _prepare_meanwhile(self) -> Future[None]:
        """``_prepare`` on a thread of its own: the hosts are connected to while the shipment is
        built (resolving the packages is a uv process and the index's answers; logging in is
        the hosts' and the network's time). Nothing runs on a host before it is ready."""
        ready: Future[None] = Future()
        if self._ship is not None:
            ready.set_result(None)
            return ready

        def prepare() -> None:
            try:
                self._prepare()
            except BaseException as exc:
                ready.set_exception(exc)
            else:
                ready.set_result(None)

        threading.Thread(target=prepare, name="skyward-ssh-prepare", daemon=True).start()
        return ready

    def _platform(self) -> str | None:
        """uv's --python-platform for these nodes: wheelhouse nodes share the client's (None)."""
        if self._install == "wheelhouse":
            return None
        return resolver.node_platform(self.node_architecture)

    def _final_image(self) -> tuple[Image, tuple[str, ...]]:
        if not self.spec.plugins:
            return self.spec.image, ()
        from skyward.plugins.compose import prepare

        return prepare(self.spec, self)

    # -- one node ----------------------------------------------------------------------------
    def _bring_up(self, node: _Node, remote: Remote | None = None, ready: Future[None] | None = None) -> NodeEndpoint:
        """Connect (unless ``remote``), then one command does the rest (script.node_up): the
        node's folders, what it lacks of the shipment (sent back on the same channel), the
        bootstrap script and the agent's start. A warm host costs the login and that one command."""
        h = node.host
        remote = remote or self._open(node)
        if ready is not None:
            try:
                ready.result()
            except BaseException:  # the shipment could not be made: nothing ran on this host
                remote.close()
                node.remote = None
                raise
        ship = self._ship
        assert ship is not None
        node.agent_python = ship.agent_python
        port, pid, facts = self._node_up(node, remote, ship)
        node.agent_pid, node.agent_port = pid, port
        node.direct_port = int(facts["direct_port"]) if facts.get("direct_port") else None
        if node.index == 0 or self.interface == "eth0":
            self.interface = facts.get("interface") or self.interface
        node.endpoint = NodeEndpoint(
            index=node.index,
            private_ip=h.private_ip or facts.get("ip") or remote.host,
            public_ip=h.address if h.private_ip and h.private_ip != h.address else None,
            hostname=h.hostname or facts.get("hostname") or h.address,
            connect=_agent_connector(remote, node),
            agent_id=node.agent_id,
        )
        return node.endpoint

    def _node_up(self, node: _Node, remote: Remote, ship: _Shipment) -> tuple[int | None, int, dict[str, str]]:
        command, stdin = self._up_command(node, remote.host, ship)
        up = _UpReader(self, node, ship)
        try:
            code, out = remote.run(command, stdin=stdin, check=False, on_line=up.on_line, answer=up.answer,
                                   deadline=lambda: up.limit, phase="bootstrap")
        except BootstrapError as exc:  # timed out
            self._kill_script(remote, [up.facts.get("script", ""), *exc.output])
            raise up.timed_out(exc) from None
        up.check(code, out.splitlines(), remote.label, remote.target.user)
        return self._agent_hello(node, remote, up.facts)

    def _up_command(self, node: _Node, address: str, ship: _Shipment) -> tuple[str, bytes]:
        """The command that starts ``node`` (reached at ``address``) and what goes on its stdin
        with the script at once: the pool's secret (a line the agent's start takes: never on a
        command line or in an environment block) and this node's own files."""
        from skyward.bootstrap.remote import tar_archive
        from skyward.bootstrap.script import bash_on_stdin, node_up
        from skyward.bootstrap.shipment import UV_GZ, UV_LZ4

        # Caches into the (maybe shared) home; this node's own files into its pool folder.
        mine: list[tuple[str, Path | bytes, int]] = []
        if ship.includes is not None:
            mine.append(("includes.tar", ship.includes, 0o600))
        if ship.volumes_conf is not None:  # the volumes' credentials: a 0600 file, never in the script
            mine.append(("rclone.conf", ship.volumes_conf, 0o600))
        lz4_or_gz = (UV_LZ4, UV_GZ) if UV_LZ4 in ship.files else None  # (wheelhouse mode)
        text = node_up(self.pool_id, node.index, sudo=ship.apt, files=ship.sizes, script=ship.script,
                       then=self._agent_start(node, address), lz4_or_gz=lz4_or_gz, kept=self.named)
        keep = f"SKYWARD_KEEP_POOL={shlex.quote(node.pool_dir)}" if node.pool_dir else ""
        size_mine, mine_parts = tar_archive(mine) if mine else (0, iter(()))
        stdin = b"".join([text.encode(), (self.token + "\n").encode(), f"{size_mine}\n".encode(), *mine_parts])
        return bash_on_stdin(text, keep), stdin

    def _kill_script(self, remote: Remote, output: list[str]) -> None:
        for line in output:
            if line.startswith("@@skyward pid "):
                pid = line.split()[-1]
                remote.run(f"kill -TERM -- -{pid} 2>/dev/null; sleep 0.5; kill -KILL -- -{pid} 2>/dev/null; true",
                           check=False)

    def _start_agent(self, node: _Node, remote: Remote) -> tuple[int | None, int, dict[str, str]]:
        """Start the agent in the folder a bootstrap left (a node restarted in place): one command."""
        where = f"SKY={shlex.quote(node.home)}; POOL={shlex.quote(node.pool_dir)}\n"
        _, out = remote.run(f"bash -c {shlex.quote(where + self._agent_start(node, remote.host))}",
                            stdin=(self.token + "\n").encode(), timeout=_AGENT_START_TIMEOUT + 10, phase="agent")
        return self._agent_hello(node, remote, _facts(out))

    def _agent_start(self, node: _Node, address: str) -> str:
        """Bash that starts the agent (SKY and POOL set, the token in the shell variable
        SKYWARD_AGENT_TOKEN, where node_up read it, or else the next line of stdin) and
        prints its start-up line and the node's facts (``@@port``, ``@@hostname``, ``@@interface``,
        ``@@ip``). The start-up line is read off a pipe (the agent's stdout: a process substitution)
        as soon as the agent writes it (no polling, no FIFO to make and remove), and the facts are
        gathered while the agent starts."""
        peer = shlex.quote(node.host.private_ip or address)
        direct = direct_address(node.host, address) if self._direct or node.fanned_by else None
        direct_arg = f"--direct {shlex.quote(direct)} " if direct else ""
        # PYTHONPATH: the includes when they were shipped (the folder says so, also to a pool
        # attached from its description), and the node's folder of packages `skyward install`
        # adds while the pool runs (SKYWARD_SITE; there from the start, so running workers find them).
        return f"""set -e
[ -n "${{SKYWARD_AGENT_TOKEN:-}}" ] || IFS= read -r SKYWARD_AGENT_TOKEN  # (node_up read it already)
export SKYWARD_AGENT_TOKEN
unset SKYWARD_SKY SKYWARD_RUN SKYWARD_POOL SKYWARD_KEEP_POOL  # (the bootstrap's; not the agent's)
cd "$POOL"; . ./env.sh
[ -d site ] || mkdir -p site
PP="$POOL/site"; if [ -d "$POOL/includes" ]; then PP="$POOL/includes:$PP"; fi
export PYTHONPATH="$PP${{PYTHONPATH:+:$PYTHONPATH}}" SKYWARD_SITE="$POOL/site" SKYWARD_UV="$SKY/bin/uv"
# The agent's Unix socket in this 0700 folder: no other user of the node can connect to it (the
# agent puts it in a short folder of its own where this path is too long for a Unix socket).
exec {{hello_fd}}< <(exec setsid "$SKY/{node.agent_python}" -m skyward.bootstrap.agent_start --ttl {self._ttl} \\
  --log agent.log --socket "$POOL/agent.sock" {direct_arg}--orphan-cleanup "$POOL" --sweep "${{POOL%/*}}" </dev/null 2>>agent.log)
unset SKYWARD_AGENT_TOKEN
route=$(ip -o route get {peer} 2>/dev/null </dev/null) || route=""
echo "@@hostname $HOSTNAME"
dev=' dev ([^ ]+)'; src=' src ([^ ]+)'
if [[ $route =~ $dev ]]; then echo "@@interface ${{BASH_REMATCH[1]}}"; else echo "@@interface "; fi
if [[ $route =~ $src ]]; then echo "@@ip ${{BASH_REMATCH[1]}}"; else echo "@@ip "; fi
IFS= read -r -t {_AGENT_START_TIMEOUT} -u "$hello_fd" hello || hello=""
exec {{hello_fd}}<&-
echo "@@port $hello"
"""

    def _agent_hello(self, node: _Node, remote: Remote | None, facts: dict[str, str]) -> tuple[int | None, int, dict[str, str]]:
        """The agent's start-up line (``@@port``): its socket or port, its pid, its direct port.
        ``remote``: the node's login (None: started by the first node, sky.SSH(fanout=True))."""
        address = remote.host if remote is not None else node.host.address
        label = remote.label if remote is not None else f"node {node.index} ({node.host.address})"
        direct = direct_address(node.host, address) if self._direct or node.fanned_by else None
        try:
            hello = json.loads(facts.get("port", ""))
            if hello.get("direct"):
                facts["direct_port"] = str(int(hello["direct"]))
            elif direct:
                log.info("%s: the agent cannot be reached directly (%s); using the SSH tunnel",
                         label, hello.get("direct_error", "no direct listener"))
            node.agent_socket = str(hello.get("unix") or "")
            node.agent_id = str(hello.get("id") or "")
            if hello.get("unix_error"):
                log.warning("%s: the agent listens on a loopback TCP port, which other users of the node "
                            "can reach: %s", label, hello["unix_error"])
            port = None if node.agent_socket else int(hello["port"])
            return port, int(hello["pid"]), facts
        except (ValueError, KeyError, TypeError):
            log_file = f"{node.pool_dir}/agent.log"
            tail = ""
            if remote is not None:
                _, tail = remote.run(f"tail -n 20 {shlex.quote(log_file)} 2>/dev/null; true", check=False)
            else:
                tail = f"(its log: {log_file} on {node.host.address})"
            raise BootstrapError(host=label, phase="agent", command="python -m skyward.bootstrap.agent_start",
                                 exit_code=None, output=tail.splitlines(),
                                 why=f"did not report its port within {_AGENT_START_TIMEOUT} s") from None

    def _release(self, nodes: list[_Node], shrink: bool = True) -> None:
        """Stop the agents (and everything they started) and remove the pools' folders; then,
        with ``shrink``, tell a cloud's stack that their hosts are no longer needed."""

        def one(node: _Node) -> None:
            if node.remote is None and node.agent_pid is not None:  # described, never reconnected
                try:
                    self._open(node, retry_for=min(10.0, self._ssh_timeout))
                except Exception as exc:  # a dead host runs nothing
                    log.warning("could not reach node %d (%s) to stop it: %s; if it is up, its agent "
                                "stops by itself after ttl=%gs", node.index, node.host.address, exc, self._ttl)
                    return
            remote = node.remote
            if remote is None or remote.conn is None or not remote.conn.is_connected:
                return
            try:
                remote.run(self._release_command(node), check=False, timeout=20 if not self.spec.volumes else 3600)
            except Exception as exc:
                log.warning("could not clean up %s: %s (its agent stops by itself after ttl)", remote.label, exc)
                remote.close()
            except BaseException:
                remote.close()
                raise
            else:
                # Machines you have: the next pool of this process to this host takes the
                # connection (no login). A cloud's instances go with their stack.
                if self._kind == "ssh":
                    remote.park()
                else:
                    remote.close()

        nodes = self._release_through_first(nodes)
        self.table.forget(nodes)
        if nodes:
            with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
                list(pool.map(one, nodes))
        if shrink and self._shrink is not None:
            self._shrink([n.host for n in nodes])

    def _release_command(self, node: _Node) -> str:
        pid = node.agent_pid
        kill = (f"kill -TERM -- -{pid} 2>/dev/null; for _ in $(seq 1 50); do kill -0 {pid} 2>/dev/null "
                f"|| break; sleep 0.1; done; kill -KILL -- -{pid} 2>/dev/null; ") if pid else ""
        # This node's folder only: another node's (a shared home, a shared /var/tmp) or
        # another pool's is never touched. A node described by an older skyward had its
        # folder at HOME/pools/<pool id>.
        folder = (shlex.quote(node.pool_dir) if node.pool_dir else
                  f'"${{SKYWARD_NODE_HOME:-$HOME/.skyward}}/pools/{self.pool_id}"')
        # sky.Volume: wait for the uploads of read-write volumes, then unmount (mounts.py).
        unmount = f'if [ -f {folder}/unmount.sh ]; then bash {folder}/unmount.sh; fi; '
        return f'{kill}{unmount}rm -rf {folder}; true'

    def _release_through_first(self, nodes: list[_Node]) -> list[_Node]:
        """sky.SSH(fanout=True): the nodes the client never logged into are released by a node
        it did log into (ssh_fanout.run_on_rest), as they were started; returns those left to
        release the usual way (a login each): the rest, and any that node could not reach."""
        fanned = [n for n in nodes if n.remote is None and n.agent_pid is not None and n.pool_dir
                  and n.fanned_by is not None]
        if not self._fanout or not fanned:
            return nodes
        from .ssh_fanout import Dest, destination, run_on_rest

        via = fanned[0].fanned_by
        assert via is not None
        fanned = [n for n in fanned if n.fanned_by is via]
        if not (via.home and via.agent_python):
            return nodes
        with via.opening:
            if via.remote is None:  # a described pool (`skyward down`): one login, not one per node
                try:
                    self._open(via, retry_for=min(10.0, self._ssh_timeout))
                except Exception as exc:
                    log.info("node %d cannot be reached to release the others (%s); logging into each",
                             via.index, exc)
                    return nodes
        if via.remote is None or via.remote.conn is None or not via.remote.conn.is_connected:
            return nodes
        jobs = []
        for node in fanned:
            dest = destination(self, node)
            if isinstance(dest, Dest):
                jobs.append((node, dest, self._release_command(node)))
        try:
            codes = run_on_rest(via.remote, via, jobs, timeout=60 if not self.spec.volumes else 3600)
        except Exception as exc:
            log.info("node %d could not release the others (%s); the client logs into each", via.index, exc)
            return nodes
        done = {n.index for n, _, _ in jobs if codes.get(n.index) == 0}
        if done:
            self.table.forget([n for n in nodes if n.index in done])
        return [n for n in nodes if n.index not in done]

    def node_lost(self, index: int) -> None:
        """Drop the SSH connection of a node the pool lost: cleaning up over a connection to a
        host that vanished would only hang. Its agent stops when its lease (ttl) runs out."""
        with self._lock:
            node = self._nodes.get(index)
        if node is not None and node.remote is not None:
            log.warning("node %d (%s) was lost; its agent stops by itself within ttl=%gs if the host "
                        "is still up", index, node.host.address, self._ttl)
            threading.Thread(target=node.remote.close, name="skyward-ssh-drop", daemon=True).start()

    # -- healing (skyward.core.healing) -------------------------------------------------------------
    # A cloud provider sets this: a lost host's replacement from its stack (one update), and
    # why the old one went away when the cloud took it back (a spot reclaim), else None.
    replace_host: Callable[[SSHHost], tuple[SSHHost, str | None]] | None = None

    def _claim(self, count: int) -> list[_Node]:
        with self._lock:
            if len(self._free) < count and self._grow is not None:
                self._free.extend(self._grow(count - len(self._free)))
            if len(self._free) < count:
                raise ProviderError(
                    f"{count} more node(s) asked for and only {len(self._free)} unused host(s) are "
                    f"left; add hosts to sky.SSH(hosts=[...]) or ask for fewer nodes."
                )
            return self.table.claim_locked(count, lambda index: _Node(index, self._free.pop(0)))

    def replace(self, lost: NodeEndpoint) -> NodeEndpoint:
        """The lost node's host again when it answers (its agent restarted in the folder the
        bootstrap left, or the host bootstrapped again), else the next spare host (hosts beyond
        ``nodes``, in order), else, on a cloud, a new instance from one stack update. With
        neither spares nor a stack, the host is waited for (``ssh_timeout``) each attempt."""
        with self._lock:
            old = self._nodes.get(lost.index)
            if old is None:
                raise ProviderError(f"node {lost.index} is not one of this pool's nodes any more")
            (node,) = self.table.claim_locked(1, lambda index: _Node(index, old.host))
            elsewhere = bool(self._free) or self.replace_host is not None
        try:
            rejoined = self._rejoin(node, old)
        except BaseException:
            self.table.forget([node])
            raise
        if rejoined is not None:
            self._swap(old, node)
            return rejoined
        try:  # (a node that does not come up leaves the table again)
            self._prepare()
        except BaseException:
            self.table.forget([node])
            raise
        try:
            remote = self._open(node, retry_for=0.0 if elsewhere else None,
                                connect_timeout=3.0 if elsewhere else None)
        except Exception as exc:
            self.table.forget([node])
            if node.remote is not None:
                node.remote.close()
            if not elsewhere:
                raise
            log.warning("node %d (%s) does not answer (%s); replacing it with another host",
                        old.index, old.host.address, exc)
            return self._replace_elsewhere(old)
        except BaseException:
            self.table.forget([node])
            raise
        try:
            endpoint = self._restart(node, old, remote)
        except BaseException:
            self.table.forget([node])
            remote.close()
            raise
        self._swap(old, node)
        return endpoint

    def _rejoin(self, node: _Node, old: _Node) -> NodeEndpoint | None:
        """``old``'s agent again, as ``node``, where only the link to it was lost: a node the
        first node started (fan-out without direct=True), whose link rode that node's SSH
        connection. When that connection breaks, every such link goes with it while the agents
        run on; each is reached again through a connection the client holds to a node of the
        pool (the first node's, once its own replacement has logged in again), with no login to
        its host and no new agent. None when that is not the case or the agent does not answer
        there (the node is restarted or replaced as any lost node is)."""
        if (self._direct or old.fanned_by is None or old.rejoined or old.remote is not None
                or not (old.direct_host and old.direct_port)):
            return None
        # The first node's own replacement logs in again meanwhile (about a second). A host that
        # is gone is not waited for long: the old way (a login each) is the fallback.
        deadline = time.monotonic() + min(_REJOIN_WAIT, self._ssh_timeout)
        while (via := self._carrier(old)) is None:
            if time.monotonic() >= deadline or old.index not in self._nodes:
                log.info("node %d: no connection of the pool's to reach its agent through; restarting it",
                         old.index)
                return None
            time.sleep(0.2)
        assert via.remote is not None
        try:
            first = _through(via, old.direct_host, old.direct_port)
        except Exception as exc:  # (paramiko.ChannelException: nothing listens there any more)
            log.info("node %d: its agent does not answer through node %d (%s); restarting it",
                     old.index, via.index, exc)
            return None
        for name in ("home", "agent_python", "pool_dir", "agent_pid", "agent_port", "agent_socket",
                     "agent_id", "direct_port", "direct_host", "fan"):
            setattr(node, name, getattr(old, name))
        node.fanned_by, node.rejoined = via, True
        relayed = functools.partial(_relayed_agent, node, old.direct_host, functools.partial(self._logged_in, node))
        opened = [first]

        def connect() -> Any:  # the channel that found the agent, then new ones
            return opened.pop() if opened else relayed()

        h = node.host
        node.endpoint = (dataclasses.replace(old.endpoint, index=node.index, connect=connect) if old.endpoint else
                         NodeEndpoint(index=node.index, private_ip=h.private_ip or old.direct_host, public_ip=None,
                                      hostname=h.hostname or h.address, connect=connect, agent_id=old.agent_id))
        log.info("node %d: its agent is reached again through node %d, as node %d", old.index, via.index, node.index)
        return node.endpoint

    def _carrier(self, old: _Node) -> _Node | None:
        """A node of the pool whose SSH connection the client holds (the host that started
        ``old`` first, then the lowest index), to carry a link to ``old``'s agent."""
        with self._lock:
            live = [n for n in self._nodes.values() if n is not old and n.remote is not None
                    and n.remote.conn is not None and n.remote.conn.is_connected]
        start = old.fanned_by.host if old.fanned_by is not None else None
        return min(live, key=lambda n: (n.host is not start, n.index), default=None)

    def _restart(self, node: _Node, old: _Node, remote: Remote) -> NodeEndpoint:
        """The same host: stop what is left of the old agent, then start a new one -- straight
        from the pool's folder when it is intact (a warm host: about a second), else after the
        whole bootstrap again."""
        _kill_agent(remote, old.agent_pid)
        if old.home and old.agent_python and old.pool_dir:
            node.home, node.agent_python, node.pool_dir = old.home, old.agent_python, old.pool_dir
            try:
                port, pid, facts = self._start_agent(node, remote)
            except Exception as exc:
                log.info("node %d: restarting the agent in place failed (%s); bootstrapping again", node.index, exc)
            else:
                node.agent_pid, node.agent_port = pid, port
                node.direct_port = int(facts["direct_port"]) if facts.get("direct_port") else None
                h = node.host
                node.endpoint = NodeEndpoint(
                    index=node.index,
                    private_ip=h.private_ip or facts.get("ip") or remote.host,
                    public_ip=h.address if h.private_ip and h.private_ip != h.address else None,
                    hostname=h.hostname or facts.get("hostname") or h.address,
                    connect=_agent_connector(remote, node),
                    agent_id=node.agent_id,
                )
                return node.endpoint
        node.pool_dir = node.pool_dir or old.pool_dir  # bootstrapped again: the same folder
        return self._bring_up(node, remote)

    def _replace_elsewhere(self, old: _Node) -> NodeEndpoint:
        preempted = None
        with self._lock:
            spare = self._free.pop(0) if self._free else None
        if spare is None:
            assert self.replace_host is not None
            spare, preempted = self.replace_host(old.host)  # the old instance leaves the stack
        with self._lock:
            (node,) = self.table.claim_locked(1, lambda index: _Node(index, spare))
            stale = self._stale.pop((spare.address, spare.port), None)
        try:
            remote = self._open(node)
            _kill_agent(remote, stale)  # this host was lost once; its old agent may be back
            endpoint = self._bring_up(node, remote)
        except BaseException:
            self._release([node])
            with self._lock:
                if self.replace_host is None:
                    self._free.append(spare)  # maybe later
            raise
        self._swap(old, node)
        if self.replace_host is None:
            with self._lock:  # the lost host becomes the last spare (its old agent noted)
                self._free.append(old.host)
                if old.agent_pid:
                    self._stale[(old.host.address, old.host.port)] = old.agent_pid
        if preempted:
            self._preempted[old.index] = preempted
        return endpoint

    def _swap(self, old: _Node, new: _Node) -> None:
        with self._lock:
            self._nodes.pop(old.index, None)
            self._nodes[new.index] = new
        if old.remote is not None and old.remote is not new.remote:
            threading.Thread(target=old.remote.close, name="skyward-ssh-drop", daemon=True).start()

    def preempted(self, index: int) -> str | None:
        return self._preempted.pop(index, None)

    @property
    def _stale(self) -> dict[tuple[str, int | None], int]:
        """Hosts lost once and kept as spares: the pid of the agent they may still run."""
        return self.__dict__.setdefault("_stale_agents", {})

    @property
    def _preempted(self) -> dict[int, str]:
        return self.__dict__.setdefault("_preempted_nodes", {})

    def _stale_nodes(self) -> list[_Node]:
        """Stale agents as nodes ``_release`` can stop (closing the pool stops them too)."""
        free = {(h.address, h.port): h for h in self._free}
        return [_Node(-1 - i, free[key], agent_pid=pid) for i, (key, pid) in enumerate(self._stale.items())
                if key in free]

    # -- named pools (see Cluster.describe / ProviderConfig.attach) ----------------------------
    def describe(self) -> dict[str, Any]:
        import cloudpickle

        with self._lock:
            nodes = self.table.all_locked()
            free = list(self._free)
        return {
            "provider": self._kind,
            "pool_id": self.pool_id,
            "token": self.token,
            "head_port": self.head_port,
            "interface": self.interface,
            "ttl": self._ttl,
            "install": self._install,
            "ssh_timeout": self._ssh_timeout,
            "known_hosts": self._known_hosts,
            "direct": self._direct,
            "fanout": self._fanout,
            "next": self.table.next,
            # New nodes of an attached pool (a resize) are bootstrapped from the same spec.
            "spec": base64.b64encode(cloudpickle.dumps(self.spec)).decode(),
            # A resize of an attached pool installs what the first nodes got, not a new resolution.
            "pin": (self.package_lock or {}).get("packages") if self._pin is None else [p.to_json() for p in self._pin],
            "node_architecture": self.node_architecture,
            "free": [_host_record(h) for h in free],
            "nodes": [
                {
                    "index": n.index,
                    "private_ip": n.endpoint.private_ip if n.endpoint else n.host.private_ip,
                    "public_ip": n.endpoint.public_ip if n.endpoint else None,
                    "hostname": n.endpoint.hostname if n.endpoint else n.host.hostname,
                    "host": _host_record(n.host),
                    "agent_pid": n.agent_pid,
                    "agent_port": n.agent_port,
                    "agent_socket": n.agent_socket,
                    "agent_id": n.agent_id,
                    "direct_port": n.direct_port,
                    "direct_host": n.direct_host,
                    # fan-out: the node that started it, through which it is reached and released
                    "relay_via": n.fanned_by.index if n.fanned_by is not None else None,
                    "agent_python": n.agent_python,
                    "log": f"{n.pool_dir}/agent.log" if n.pool_dir else None,
                    "home": n.home,
                    "pool_dir": n.pool_dir,
                }
                for n in nodes
            ],
            **(self._describe_extra() if self._describe_extra is not None else {}),
        }

    @classmethod
    def from_description(
        cls,
        description: dict[str, Any],
        *,
        kind: str = "ssh",
        grow: Callable[[int], list[SSHHost]] | None = None,
        shrink: Callable[[list[SSHHost]], None] | None = None,
        on_close: Callable[[], None] | None = None,
        describe_extra: Callable[[], dict[str, Any]] | None = None,
    ) -> SSHCluster:
        """The nodes another process started; connects to nothing until ``start``. A cloud
        provider passes its ``kind`` and the hooks of its reopened stack (as in ``__init__``)."""
        import cloudpickle

        require_kind(description, kind)
        spec = cloudpickle.loads(base64.b64decode(description["spec"]))
        self = cls(spec, description["pool_id"], [SSHHost(**h) for h in description.get("free", [])],
                   install=description.get("install", "wheelhouse"), grow=grow, shrink=shrink, on_close=on_close,
                   kind=kind, describe_extra=describe_extra, known_hosts=description.get("known_hosts"),
                   direct=bool(description.get("direct", False)),
                   fanout=bool(description.get("fanout", False)))
        self.token = description["token"]
        self.named = True  # (a description is a named pool's)
        self.head_port = int(description["head_port"])
        self.interface = description.get("interface", "eth0")
        self._ssh_timeout = float(description.get("ssh_timeout", 60.0))
        self._ttl = description["ttl"]
        pin = description.get("pin")
        self._pin = None if pin is None else tuple(pkglock.Package.from_json(p) for p in pin)
        self.node_architecture = description.get("node_architecture")
        self.table.restore([
            _Node(int(n["index"]), SSHHost(**n["host"]), agent_pid=n.get("agent_pid"),
                  agent_port=n.get("agent_port"), agent_socket=n.get("agent_socket") or "",
                  agent_id=n.get("agent_id") or "",
                  direct_port=n.get("direct_port"), direct_host=n.get("direct_host") or "",
                  home=n.get("home") or "", agent_python=n.get("agent_python") or "",
                  pool_dir=n.get("pool_dir") or "",
                  endpoint=NodeEndpoint(index=int(n["index"]), private_ip=n["private_ip"], public_ip=n.get("public_ip"),
                                        hostname=n.get("hostname") or n["host"]["address"], connect=_unconnected,
                                        agent_id=n.get("agent_id") or ""))
            for n in description["nodes"]
        ], int(description["next"]) if "next" in description else len(description["nodes"]))
        by_index = {n.index: n for n in self.table.all()}
        for n in description["nodes"]:
            via = n.get("relay_via")
            if via is not None and int(via) in by_index and int(via) != int(n["index"]):
                by_index[int(n["index"])].fanned_by = by_index[int(via)]
        return self

    def _open(self, node: _Node, retry_for: float | None = None, connect_timeout: float | None = None) -> Remote:
        from skyward.bootstrap.remote import Remote, Target

        h = node.host
        remote = Remote(Target(h.address, h.port, h.user, h.key, h.host_key, jump=h.jump,
                               known_hosts=self._known_hosts),
                        connect_timeout=connect_timeout or min(10.0, self._ssh_timeout),
                        retry_for=self._ssh_timeout if retry_for is None else retry_for,
                        label=f"node {node.index} ({h.address})", booting=self._kind != "ssh" and retry_for is None)
        node.remote = remote
        remote.open()
        return remote

    def _reconnect(self, nodes: list[_Node]) -> list[NodeEndpoint]:
        """Hand out described nodes: one SSH connection each, tunnels to their running agents;
        a node whose agent answers on its direct port (sky.SSH(direct=True)) is handed out on
        that connection and logged into only when something needs its SSH (``skyward ssh``,
        ``cp``, a fallback, its release): attaching costs it no login, so ``skyward exec`` and
        ``status`` of a large pool spend a TCP connection per node instead of a login and a
        command (issue 65)."""

        def one(node: _Node) -> NodeEndpoint | Exception:
            assert node.endpoint is not None and (node.agent_port is not None or node.agent_socket)
            first = self._direct_first(node) or self._relayed_first(node)
            if first is not None:  # the agent listens: it runs (its handshake proves whose it is)
                self.table.add(node)
                node.endpoint = dataclasses.replace(node.endpoint, connect=_lazy_connector(self, node, first))
                return node.endpoint
            try:
                remote = self._logged_in(node)  # (maybe made already: the node others are reached through)
            except Exception as exc:  # each node on its own: the others are still worth having
                return exc
            self.table.add(node)  # a dead agent's too: its replacement restarts it there
            if node.agent_pid:  # the host answers; does its agent still run? (one command)
                code, _ = remote.run(f"kill -0 {int(node.agent_pid)} 2>/dev/null", check=False, timeout=10)
                if code != 0:
                    return ProviderError(f"its agent (pid {node.agent_pid}) no longer runs on "
                                         f"{node.host.address}; the host answers")
            node.endpoint = dataclasses.replace(node.endpoint, connect=_agent_connector(remote, node))
            return node.endpoint

        with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
            answers = list(pool.map(one, nodes))
        reached = [a for a in answers if isinstance(a, NodeEndpoint)]
        failed = [(n, a) for n, a in zip(nodes, answers, strict=True) if isinstance(a, Exception)]
        for node, exc in failed:
            self.table.mark_unreachable(node.index, str(exc))
        if not reached and failed:
            raise failed[0][1]
        return reached

    def _direct_first(self, node: _Node) -> socket.socket | None:
        """A described node's agent reached on its direct port, without SSH: the connection
        (the agent's listener speaks first: it waits for the pool's channel to take it), or
        None where there is no direct port or nothing answers there (the SSH way then)."""
        if not (self._direct and node.direct_host and node.direct_port):
            return None  # (a description of an older version has no direct_host: the SSH way)
        try:
            return socket.create_connection((node.direct_host, node.direct_port),
                                            timeout=min(5.0, self._ssh_timeout))
        except OSError as exc:
            log.info("node %d (%s): no answer on the agent's direct port %d (%s); through SSH",
                     node.index, node.host.address, node.direct_port, exc)
            return None

    def _relayed_first(self, node: _Node) -> Any:
        """A described node that the pool's first node started (fan-out, without direct=True):
        a channel to its agent through that node's login, made once for all of them; None
        where that node cannot be logged into or nothing answers (the node's own login then)."""
        via = node.fanned_by
        if self._direct or via is None or not (node.direct_host and node.direct_port):
            return None
        try:
            return self._logged_in(via).tunnel(node.direct_port, host=node.direct_host)
        except Exception as exc:
            log.info("node %d (%s): its agent cannot be reached through node %d (%s); logging in",
                     node.index, node.host.address, via.index, exc)
            return None

    def _logged_in(self, node: _Node) -> Remote:
        """The node's SSH connection, logged into now if it was handed out without one (a
        described node whose agent answered on its direct port)."""
        with node.opening:
            if node.remote is not None:
                return node.remote
            try:
                return self._open(node)
            except BaseException:
                if node.remote is not None:  # (a failed login: the next caller tries again)
                    node.remote.close()
                    node.remote = None
                raise

    def remote(self, index: int) -> Remote:
        """The SSH connection node ``index``'s agent tunnel rides on (its pinned host key, its
        jump host): ``skyward ssh`` and ``skyward cp`` open their sessions on it."""
        remote = self._connected(index).remote
        assert remote is not None
        return remote

    def _connected(self, index: int) -> _Node:
        with self._lock:
            node = self._nodes.get(index)
        if node is not None and node.remote is None and node.agent_pid is not None:
            self._logged_in(node)  # a described node handed out on its direct port (_reconnect)
        if node is None or node.remote is None or node.remote.conn is None:
            raise ProviderError(f"node {index} of this pool is not connected")
        return node

    def open_stream(self, index: int, target: Target) -> Stream:
        """A channel of the node's own SSH connection to ``target`` (on its loopback), or a relay
        run by the pool's Python where the node's sshd forbids forwarding."""
        from skyward.bootstrap.routes import through_ssh

        node = self._connected(index)
        assert node.remote is not None
        return through_ssh(node.remote, target, python=node_python(node) or "python3")

    def shell(self, index: int) -> SSHShell:
        """Sessions on the node's own SSH connection (its pinned host key, its jump host)."""
        return SSHShell(self.remote(index))

    def detach(self) -> None:
        for n in self.table.clear():
            if n.remote is not None:
                n.remote.close()

    def alive(self) -> bool | None:
        """Whether any described agent still runs (None: no host could be asked). The first
        that does answers it: a running pool of a thousand nodes costs one node's question (on
        its direct port where it has one: no login), a pool that ended one per node."""
        asked = False
        for node in self.table.all():
            first = self._direct_first(node)
            if first is not None:
                first.close()
                return True
            try:
                remote = node.remote or self._open(node, retry_for=3.0)
                code, _ = remote.run(f"kill -0 {int(node.agent_pid or 0)} 2>/dev/null", check=False, timeout=10)
            except Exception:  # unreachable: cannot tell
                continue
            if code == 0:
                return True
            asked = True
        return False if asked else None

    def _phase(self, node: int, phase: str, status: Any, seconds: float | None = None) -> None:
        ev.bus.emit(ev.BootstrapPhase(pool=self.pool_id, node=node, phase=phase, status=status, seconds=seconds))


# The name the cloud providers use for the hosts a stack made.
Host = SSHHost


def _kill_agent(remote: Remote, pid: int | None) -> None:
    """Stop an agent of this pool left on a host (and what it started), if it still runs."""
    if pid:
        remote.run(f"kill -TERM -- -{int(pid)} 2>/dev/null; for _ in $(seq 1 30); do kill -0 {int(pid)} "
                   f"2>/dev/null || break; sleep 0.1; done; kill -KILL -- -{int(pid)} 2>/dev/null; true",
                   check=False, timeout=20)


def _host_record(h: SSHHost) -> dict[str, Any]:
    return {f.name: getattr(h, f.name) for f in dataclasses.fields(h)}


def _unconnected() -> Any:
    raise ProviderError("internal: a described node was used before it was reconnected")


def _agent_connector(remote: Remote, node: _Node) -> Callable[[], Any]:
    assert node.agent_port is not None or node.agent_socket
    python = node_python(node)
    address = direct_address(node.host, remote.host) if node.direct_port else None
    node.direct_host = address or ""  # (described: an attach reaches the agent there without a login)
    direct = (address, node.direct_port) if address and node.direct_port else None
    return functools.partial(_connect_agent, remote, node.agent_socket or node.agent_port, python, direct)


def _lazy_connector(cluster: SSHCluster, node: _Node, first: socket.socket) -> Callable[[], Any]:
    """Streams to a described node's agent that answered on its direct port: ``first`` (that
    connection) for the first, while the agent still waits for its HELLO (a pool of many nodes
    may come to it later); others direct again, and through SSH (a login then) when the direct
    port no longer answers."""
    from skyward.bootstrap.handshake import FIRST_BYTE

    taken = [(first, time.monotonic() + FIRST_BYTE * 0.75)]

    def connect() -> Any:
        try:
            sock, fresh_until = taken.pop()
        except IndexError:  # (taken already)
            pass
        else:
            if time.monotonic() < fresh_until:
                return sock
            sock.close()
        assert node.direct_port is not None
        login = functools.partial(cluster._logged_in, node)
        if node.fanned_by is not None and not cluster._direct:
            return _relayed_agent(node, node.direct_host, login)
        return _connect_agent(login, node.agent_socket or node.agent_port, node_python(node),
                              (node.direct_host, node.direct_port))

    return connect


def node_python(node: _Node) -> str:
    """The agent's interpreter on the node (the relay's fallback), or "" when not known."""
    return f"{node.home}/{node.agent_python}" if node.home and node.agent_python else ""


def direct_address(host: SSHHost, address: str) -> str | None:
    """The address the agent listens on for direct connections (sky.SSH(direct=True)), or None
    where there is none: the host is reached through a jump host, or the address the client
    connects to (``address``, resolved) is not private."""
    if host.jump:
        return None
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.getaddrinfo(address, None, proto=socket.IPPROTO_TCP)[0][4][0])
        except (OSError, ValueError, IndexError):
            return None
    if not (ip.is_private or ip.is_loopback) or ip.is_unspecified or ip.is_link_local:
        return None
    return str(ip)


def _connect_agent(remote: Remote | Callable[[], Remote], port: int | str | None, python: str,
                   direct: tuple[str, int] | None = None) -> Any:
    """A stream to the agent (skyward.bootstrap.routes): straight over TCP on the node's private
    address when the agent listens there (sky.SSH(direct=True)); else through the SSH connection
    to its Unix socket (``port``: its path) or its loopback port (an agent of an earlier version),
    or a relay where the node's sshd forbids that forwarding."""
    from skyward.bootstrap.routes import through_ssh

    assert port is not None
    return through_ssh(remote, port, python=python, direct=direct, who="agent")


def _through(via: _Node, host: str, port: int) -> Any:
    """A stream to host:port through ``via``'s SSH connection (Remote.reach: its multiplexer,
    whose errors go to mux.log in ``via``'s pool folder)."""
    assert via.remote is not None
    return via.remote.reach(port, host, node_python(via), f"{via.pool_dir}/mux.log" if via.pool_dir else "")


def _relayed_agent(node: _Node, address: str, login: Callable[[], Remote]) -> Any:
    """A stream to the agent of a node the first node started (sky.SSH(fanout=True) without
    direct=True): a link of the first node's multiplexer (one channel of its SSH connection
    carries every node's link: Remote.reach), else a direct-tcpip channel of that connection, to
    the agent's listener on ``address`` (sealed: no SSH carries the hop between the two hosts);
    the node's own login (its Unix socket) when that connection is gone or the link is refused."""
    from skyward.bootstrap.routes import through_ssh

    via = node.fanned_by
    remote = via.remote if via is not None else None
    if (via is not None and remote is not None and remote.conn is not None and remote.conn.is_connected
            and node.direct_port):
        try:
            return _through(via, address, node.direct_port)
        except Exception as exc:  # (paramiko.ChannelException, a transport that just closed)
            log.info("node %d: the agent cannot be reached through node %d's connection (%s); logging in",
                     node.index, via.index if via is not None else -1, exc)
    target = node.agent_socket or node.agent_port
    assert target is not None
    return through_ssh(login, target, python=node_python(node), who="agent")


def _run_dir(pool_dir: str) -> str:
    """RUN from a node's pool folder (RUN/pools/<pool>-<node>)."""
    return pool_dir.rsplit("/pools/", 1)[0]
