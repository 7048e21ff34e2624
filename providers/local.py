"""sky.Local(): the nodes are agent processes on this machine.

Each node gets its own working directory under one temporary root per pool. The nodes run
the client's interpreter with the client's import path, so everything importable here is
importable there; only Image.pip requirements that are not already met are installed, into a
cached overlay that goes first on the nodes' PYTHONPATH. The agents are forked from one fork
server per pool (local_fork.py: the warm one building its sky.Compute started, where it fits),
or each started as its own interpreter where none can run.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from skyward.bootstrap import sweep
from skyward.bootstrap.procs import wait_gone
from skyward.errors import ConfigError, ProviderError, SkywardError

from .base import Cluster, HereShell, NodeEndpoint, ProviderConfig, require_kind
from .local_fork import ForkedAgent, ForkServer, client_paths, take_warm
from .local_procs import process_running
from .local_procs import start_time as _start_time
from .nodetable import NodeTable

if TYPE_CHECKING:
    import logging
    from collections.abc import Callable, Iterator

    from skyward.bootstrap.routes import Stream, Target
    from skyward.records.pkglock import Package
    from skyward.spec import Image, Options, Spec

    from .local_gpus import Assigned, GpuClaims

_START_TIMEOUT = 30.0
Agent = subprocess.Popen[bytes] | ForkedAgent  # a node's agent process, as this module holds it


@dataclass(frozen=True, slots=True)
class Local(ProviderConfig):
    """Run the pool's nodes as processes on this machine.

    ``workdir``: where the per-pool folder of node working directories is made (default: the
    system temp dir). It is removed when the pool closes.

    With ``accelerator=``, each node gets GPUs of its own through its ``CUDA_VISIBLE_DEVICES``
    (those ``nvidia-smi -L`` lists, within this process's ``CUDA_VISIBLE_DEVICES`` when set),
    claimed for the whole machine so that no two nodes, of this pool or another, share one; a
    fractional count (``A100(count=0.5)``) shares one on purpose. Asking for more than the
    machine has fails before any node starts. See ``local_gpus.py``.
    """

    workdir: str | None = None
    kind: ClassVar[str] = "local"

    def check(self, spec: Spec) -> str | None:
        image = spec.image
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if image.python not in ("auto", here) and not here.startswith(image.python + "."):
            return (
                f"Local nodes run this interpreter (Python {here}), and Image(python={image.python!r}) "
                f"asks for another; use python='auto' with Local, or a provider that builds environments."
            )
        if spec.volumes:
            from skyward.bootstrap.mounts import fuse_problem
            from skyward.volumes import Volume

            if not all(isinstance(v, Volume) for v in spec.volumes):
                return "Local nodes use this machine's disks; sky.Disk applies to cloud providers only"
            if any(v.storage is None for v in spec.volumes):
                return ("Local pools have no object store of their own: give each sky.Volume a storage=, "
                        "e.g. sky.storage.S3(region='us-east-1')")
            problem = fuse_problem()
            if problem:
                return f"sky.Volume mounts buckets with FUSE and {problem}"
        if spec.accelerator is not None:
            from .local_gpus import shortfall, usable_gpus

            acc = spec.accelerator
            have = len(usable_gpus())
            if have == 0:
                return (
                    f"Local was asked for accelerator {acc} and this machine has no NVIDIA GPU that "
                    f"Local may hand out (none listed by nvidia-smi -L, or CUDA_VISIBLE_DEVICES hides "
                    f"them); drop accelerator= to run on the CPU, or use a cloud provider."
                )
            nodes = spec.node_spec.desired or 1  # (a pool born asleep starts one on its first task)
            problem = shortfall(float(getattr(acc, "count", 1)), nodes, have)
            if problem:
                return f"Local was asked for accelerator {acc}: {problem}"
        return None

    def hourly_cost(self, spec: Spec) -> float | None:
        return 0.0

    def create(self, spec: Spec, pool_id: str, options: Options | None = None, name: str | None = None,
               pin: tuple[Package, ...] | None = None) -> LocalCluster:
        return LocalCluster.new(self, spec, pool_id, pin=pin, named=name is not None)

    def launch(self, spec: Spec, pool_id: str) -> LocalCluster | None:
        # Only the plain case: plugins, volumes and packages to install have steps of their
        # own that may fail or print, which the pool reports in order (create).
        image = spec.image
        if spec.plugins or spec.volumes or image.pip or image.includes or image.apt or image.shell_vars:
            return None
        desired = spec.node_spec.desired
        if desired <= 0:  # a pool born asleep starts its first node on its first task
            return None
        cluster = LocalCluster.new(self, spec, pool_id)
        try:
            cluster.launch(desired)
        except BaseException:
            cluster.close()
            raise
        return cluster

    # -- named pools (see ProviderConfig for the contract) -------------------------------------
    def attach(self, description: dict[str, Any]) -> LocalCluster:
        return LocalCluster.from_description(description)

    def destroy(self, description: dict[str, Any]) -> None:
        cluster = LocalCluster.from_description(description)
        cluster.ask_to_shut_down()
        cluster.close()

    def alive(self, description: dict[str, Any]) -> bool | None:
        return any(process_running(n["pid"], n.get("started")) for n in description["nodes"])

    def nodes_alive(self, description: dict[str, Any]) -> list[bool | None]:
        return [process_running(n["pid"], n.get("started")) for n in description["nodes"]]


def _log() -> logging.Logger:
    """This module's logger. (logging loads when needed: a Local pool's nodes start before the
    client has loaded it, see ``Local.launch``.)"""
    import logging

    return logging.getLogger("skyward.local")


def _token() -> str:
    """What secrets.token_urlsafe(32) returns, without the secrets module's imports (hmac,
    hashlib, random: 5 ms of every Local pool's start)."""
    return base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalCluster(Cluster):
    """A pool's agents, processes of this machine. ``new`` makes a pool's folders and environment;
    ``from_description`` takes another process's pool as it describes it; both build the cluster
    through ``__init__`` from what they have."""

    def __init__(self, *, token: str, head_port: int, ttl: float, root: Path, spill_dir: Path | None,
                 env: dict[str, str] | None = None, interface: str = "lo", sockets: str | None = None,
                 unmount: Any = None, gpus: GpuClaims | None = None) -> None:
        self.token = token
        self.head_port = head_port
        self.interface = interface
        self._ttl = ttl
        self._root = root
        self.spill_dir = spill_dir
        self._held = [sweep.hold(root), None if spill_dir is None else sweep.hold(spill_dir)]
        self._procs: dict[int, Agent] = {}
        self._sockets = sockets  # see _socket_path
        self._forks: ForkServer | Literal[False] | None = None  # started on the first node
        # A warm server's agents (local_fork.py): what goes first on their import path, and
        # their whole environment sent with each; None: a server of the pool's own.
        self._warm_path: list[str] | None = None
        self._own_packages = False  # Image.pip installed for this pool
        self._launched: list[tuple[int, Agent]] = []  # started, not yet handed out
        # Each node as describe() reports it (the table's, by index): claimed as {"index": i}
        # when its agent is forked, the rest once its agent said hello (``_up``). Those this
        # process did not start (an attached pool) are waited for and stopped by pid, as they
        # are not our children.
        self.table: NodeTable[dict[str, Any]] = NodeTable(index_of=lambda n: int(n["index"]))
        self._lock = self.table.lock
        self._env: dict[str, str] = env if env is not None else {}
        self._mounts: Any = None  # the pool's volumes, mounted by this process (one per pool, shared by its nodes)
        self._unmount = unmount  # the volumes of the process that made the pool (a described one)
        self._pin: tuple[Package, ...] | None = None  # reproducing a pool: its recorded packages
        # The node's own GPUs (local_gpus.py), taken before each node starts.
        self._gpus = gpus
        self._assigned: dict[int, Assigned] = {}

    @classmethod
    def new(cls, config: Local, spec: Spec, pool_id: str, *, pin: tuple[Package, ...] | None = None,
            named: bool = False) -> LocalCluster:
        """A new pool's cluster: its folders, its nodes' environment, its volumes; no node yet."""
        sweep_folders(config.workdir)  # of pools whose processes were all killed
        root = Path(tempfile.mkdtemp(prefix=f"skyward-{pool_id}-", dir=config.workdir))
        gpus: GpuClaims | None = None
        if spec.accelerator is not None:
            from .local_gpus import GpuClaims

            gpus = GpuClaims(pool_id, float(getattr(spec.accelerator, "count", 1)))
        self = cls(token=_token(), head_port=_free_port(), ttl=spec.ttl, root=root,
                   spill_dir=_spill_dir(pool_id, root), gpus=gpus)
        if named:  # a named pool's folders go with `skyward down`, never with a sweep (it may sleep with no process)
            for folder in {self._root, self.spill_dir}:
                if folder is not None:
                    (folder / sweep.KEPT).touch()
        self.spec = spec
        try:
            self._pin = pin
            image, ops = spec.image, tuple[str, ...]()  # (the pool registers the image's secrets itself)
            if spec.plugins:  # the plugin machinery loads only for pools that have plugins
                from skyward.plugins.compose import prepare

                image, ops = prepare(spec, self)  # plugin transforms see this cluster
            self._env = self._environment(image)
            self._run_ops(ops)
            self._mounts = _mount_volumes(spec, pool_id, self._root)
        except BaseException:
            self._remove_dirs()
            raise
        return self

    def _run_ops(self, ops: tuple[str, ...]) -> None:
        """Plugin bootstrap ops: all nodes share this machine, so they run once, here, in the
        pool's folder with the nodes' environment; a failing op stops the pool."""
        for op in ops:
            proc = subprocess.run(["bash", "-c", op], cwd=self._root, env=self._env,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
                raise ProviderError(
                    f"a plugin bootstrap op failed on Local (exit code {proc.returncode}): {op!r}\n"
                    f"{tail}\nLocal runs plugin ops on this machine as it is; install what the op "
                    f"needs here, or leave that plugin out for Local pools."
                )

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> LocalCluster:
        """The cluster another process started (``describe()`` of it); starts nothing."""
        require_kind(description, "local")
        spill = description.get("spill_dir")
        gpus = description.get("gpus")
        claims: GpuClaims | None = None
        if gpus:  # its nodes' GPUs: a resize takes free ones, a stop frees theirs
            from .local_gpus import GpuClaims

            claims = GpuClaims(gpus["pool"], float(gpus["count"]))
        self = cls(token=description["token"], head_port=int(description["head_port"]), ttl=description["ttl"],
                   root=Path(description["root"]), spill_dir=Path(spill) if spill else None,
                   # New nodes (a resize of an attached pool) get the environment the pool was made with.
                   env={**os.environ, **description.get("env", {})},
                   interface=description.get("interface", "lo"), sockets=description.get("sockets"),
                   unmount=description.get("unmount"), gpus=claims)
        self.table.restore([dict(n) for n in description["nodes"]], int(description["next"]))
        if claims is not None:
            from fractions import Fraction

            from .local_gpus import Assigned

            for node in description["nodes"]:
                got = node.get("gpus")
                if got:
                    self._assigned[int(node["index"])] = Assigned(
                        tuple(got["visible"]), tuple(got["names"]), Fraction(got["share"]))
        return self

    def describe(self) -> dict[str, Any]:
        with self._lock:
            nodes = [dict(n) for n in self.table.all_locked() if _up(n)]
        return {
            "provider": "local",
            "token": self.token,
            "head_port": self.head_port,
            "interface": self.interface,
            "ttl": self._ttl,
            "root": str(self._root),
            "sockets": self._sockets,
            "spill_dir": str(self.spill_dir) if self.spill_dir is not None else None,
            "next": self.table.next,
            "env": {k: v for k, v in self._env.items() if os.environ.get(k) != v},
            "nodes": nodes,
            "gpus": None if self._gpus is None else {"pool": self._gpus.pool_id, "count": float(self._gpus.share)},
            "unmount": self._mounts.describe() if self._mounts is not None else self._unmount,
        }

    def detach(self) -> None:
        with self._lock:
            _DETACHED.extend(self._procs.values())  # no "still running" warnings at exit
            if self._forks:  # it stays until its agents have exited
                self._forks.detach()
                _DETACHED.append(self._forks.proc)
                self._forks = None
            if self._mounts is not None:  # the volumes stay mounted for the pool's other users
                self._unmount = self._mounts.describe()
                _DETACHED.extend(self._mounts.procs)
                self._mounts = None
            self._procs.clear()
            self.table.clear_locked()
            self._gpus = None  # the agents hold their GPUs' claims as long as they run
            held, self._held = self._held, []  # and the pool's folders
            for fd in held:
                sweep.release(fd)
        if self.spill_dir is not None:  # the pool lives on; this program's segments go
            from skyward.bootstrap import shm

            shm.forget(self.spill_dir)

    # -- reaching a node: it is this machine -------------------------------------------------------
    def open_stream(self, index: int, target: Target) -> Stream:
        """Direct: ``target`` on this machine (a loopback port, or a Unix socket's path)."""
        sock = _connect(target if isinstance(target, int) else None, target if isinstance(target, str) else None, 10)
        sock.settimeout(None)
        return sock

    def shell(self, index: int) -> HereShell:
        return HereShell()

    def ask_to_shut_down(self) -> None:
        """Tell every described agent to stop (it then stops its workers); best effort."""
        from skyward.bootstrap.channel import NodeChannel

        for node in self.table.all():
            if not _up(node) or not process_running(node["pid"], node.get("started")):
                continue
            try:
                sock = _connect(node.get("port"), node.get("unix"), 5)
                NodeChannel(sock, node=node["index"], token=self.token, ttl=self._ttl,
                            on_output=lambda *_: None).close(shutdown_agent=True)
            except (OSError, SkywardError):
                pass  # close() stops it by pid

    # -- environment -------------------------------------------------------------------------
    def _environment(self, image: Image) -> dict[str, str]:
        from skyward.records import pkglock, resolver

        from .local_env import locked, overlay

        if image.apt:
            _log().warning("Local nodes use this machine as it is: Image(apt=%s) is not installed.", list(image.apt))
        paths: list[str] = []
        indexes = [ix.url for ix in image.pip_indexes]
        packages, install = locked(image.pip, indexes, self._pin)
        if install:
            paths.append(str(overlay([p.line(pkglock.all_hashed(install)) for p in install], indexes, exact=True)))
        # The record's lock: what the nodes import for Image.pip, and what this machine has of Image.apt.
        self.package_lock = pkglock.describe(packages, python=".".join(map(str, sys.version_info[:3])), platform=None, indexes=indexes,
                                  resolver=resolver.uv_version(), apt=resolver.apt_versions(image.apt), pinned_from=self._pin is not None)
        if image.includes:
            paths.append(str(self._copy_includes(image.includes, image.excludes)))
        # The client's own import path (script folder, cwd, PYTHONPATH), so code importable
        # here is importable on the nodes; the interpreter adds its own site-packages itself.
        paths += [entry for entry in client_paths() if entry not in paths]
        self._own_packages = bool(install)  # (its nodes cannot be forked from a warm server)
        # Packages `skyward install` adds while the pool runs: one folder for the pool's nodes
        # (they share this machine), first on their path, there from the start so that workers
        # already running find what lands in it.
        site = self._root / "site"
        site.mkdir(exist_ok=True)
        paths.insert(0, str(site))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["SKYWARD_SITE"] = str(site)
        with contextlib.suppress(ProviderError):
            env["SKYWARD_UV"] = resolver.uv_binary()
        for name in ("SKYWARD_GPUS", "SKYWARD_GPU_SHARE", "SKYWARD_NODE_GPUS"):
            env.pop(name, None)  # a node's own (its GPUs), never this process's (a pool in a task)
        env.update(image.env)
        for name, command in image.shell_vars.items():
            env[name] = _shell_value(name, command, env)
        return env

    def _copy_includes(self, includes: tuple[str, ...], excludes: tuple[str, ...]) -> Path:
        dest = self._root / "includes"
        dest.mkdir()
        import shutil

        ignore = shutil.ignore_patterns(*excludes) if excludes else None
        for item in includes:
            src = Path(item).expanduser().resolve()
            if not src.exists():
                raise ConfigError(
                    f"Image(includes=[{item!r}]): {src} does not exist. Includes are paths (folders "
                    f"or .py files) relative to the directory you run from ({os.getcwd()})."
                )
            if src.is_dir():
                shutil.copytree(src, dest / src.name, ignore=ignore)
            else:
                shutil.copy2(src, dest / src.name)
        return dest

    # -- nodes -------------------------------------------------------------------------------
    def start(self, count: int) -> list[NodeEndpoint]:
        return self.table.start(count, reconnect=self._reconnect, together=self._begin, release=self._release)

    def start_each(self, count: int) -> Iterator[NodeEndpoint | BaseException]:
        """As ``start``: a start's agents are forked at once and greet in turn, within milliseconds."""
        return self.table.start_each(count, reconnect=self._reconnect, together=self._begin, release=self._release)

    def _reconnect(self, nodes: list[dict[str, Any]]) -> list[NodeEndpoint]:
        """Hand out described nodes whose agent still runs, each judged on its own: one dead agent
        leaves the others usable (the pool replaces it with a new node)."""
        live = []
        for node in nodes:
            self.table.add(node)  # a dead one's too: close() and `skyward down` stop what is left of it
            if process_running(node["pid"], node.get("started")):
                live.append(node)
            else:
                self.table.mark_unreachable(node["index"], _not_running(node))
        if not live:
            why = "; ".join(_not_running(n) for n in nodes)
            raise ProviderError(
                f"none of the {len(nodes)} Local node(s) of this pool runs any more ({why}). "
                f"`skyward down` removes its record; `skyward up` starts it again."
            )
        return [_endpoint(n["index"], n.get("port"), n.get("unix")) for n in live]

    def _begin(self, count: int) -> tuple[list[dict[str, Any]], Callable[[list[dict[str, Any]]], list[NodeEndpoint]]]:
        """``count`` agents: those ``launch`` forked ahead first, then new ones, forked now (their
        GPUs taken first, all or none); they come up as each says hello, in index order."""
        with self._lock:
            launched, self._launched = self._launched[:count], self._launched[count:]
            nodes = [self.table.nodes[i] for i, _ in launched] + self._fork_locked(count - len(launched))
        return nodes, self._greet

    def launch(self, count: int) -> None:
        """Start ``count`` agents now without waiting for them: ``start`` takes them first."""
        with self._lock:
            self._launched += [(n["index"], self._procs[n["index"]]) for n in self._fork_locked(count)]

    def _fork_locked(self, count: int) -> list[dict[str, Any]]:
        """``count`` new nodes claimed in the table (the caller holds its lock), each agent forked."""
        first = self.table.next
        self._take_gpus(list(range(first, first + count)))  # all or none, before any of them starts

        def fork(index: int) -> dict[str, Any]:
            self._spawn(index)
            return {"index": index}

        return self.table.claim_locked(count, fork)

    def _greet(self, nodes: list[dict[str, Any]]) -> list[NodeEndpoint]:
        """Each forked agent's hello, in turn: where it listens, its pid; its record is complete."""
        endpoints = []
        for node in nodes:
            i = node["index"]
            proc = self._procs[i]
            port, unix = self._handshake(i, proc)
            with self._lock:
                node.update({
                    "private_ip": "127.0.0.1", "public_ip": None,
                    "hostname": socket.gethostname(), "port": port, "unix": unix, "pid": proc.pid,
                    "started": _start_time(proc.pid),
                    "log": str(self._root / f"node-{i}" / "agent.log"),
                })
                if i in self._assigned:
                    node["gpus"] = self._assigned[i].describe()
            if self._gpus is not None and i in self._assigned:
                self._gpus.bind(i, proc.pid)  # held by the agent from now on: free when it exits
            endpoints.append(_endpoint(i, port, unix))
        return endpoints

    def _take_gpus(self, indices: list[int]) -> None:
        """Each new node's own GPUs (an accelerator= pool), or ProviderError before any starts."""
        if self._gpus is not None and indices:
            taken = self._gpus.take(indices)
            self._assigned.update(taken)
            for i, got in taken.items():
                _log().debug("Local node %d gets GPU(s) %s (share %s)", i, ",".join(got.visible), got.share)

    def _free_gpus(self, indices: list[int] | None) -> None:
        """These nodes' GPUs (every node's: None) go back, for this pool and any other."""
        if self._gpus is None:
            return
        with self._lock:
            for i in list(self._assigned) if indices is None else indices:
                self._assigned.pop(i, None)
        try:
            self._gpus.free(indices)
        except OSError as exc:  # (their agents are gone: the claims are stale and free anyway)
            _log().warning("could not free the GPUs of Local nodes %s: %s", indices, exc)

    def replace(self, lost: NodeEndpoint) -> NodeEndpoint:
        """With GPUs: the lost node stops first, so that its GPUs are there for its replacement
        (on a machine whose GPUs the pool holds them all). Without: as every provider."""
        if self._gpus is None:
            return super().replace(lost)
        try:
            self.stop([lost])
        except Exception:  # the lost node's leftovers must not undo its replacement
            _log().exception("stopping lost node %d failed", lost.index)
        return self.start(1)[0]

    def _spawn(self, index: int) -> Agent:
        node_dir = self._root / f"node-{index}"
        node_dir.mkdir(mode=0o700, exist_ok=True)
        log_path = node_dir / "agent.log"
        # If the client dies without closing the pool, the agents' lease watchdog removes the
        # pool's folders too (whichever agent gets there first; the others find them gone).
        args = ["--ttl", str(self._ttl), "--log", str(log_path), "--orphan-cleanup", str(self._root),
                # Same host: a Unix socket in the node's 0700 folder, and no TCP port at all (no
                # other user can connect; the round trip costs a third less than TCP loopback).
                "--unix", self._socket_path(node_dir)]
        if self._sockets is not None:
            args += ["--orphan-cleanup", self._sockets]
        if self.spill_dir is not None:
            args += ["--orphan-cleanup", str(self.spill_dir)]
        env = dict(self._env, SKYWARD_AGENT_TOKEN=self.token)
        own = self._assigned[index].env() if index in self._assigned else {}  # its GPUs
        proc: Agent | None = None
        if self._forks is not False:  # forked from the pool's fork server (local_fork.py)...
            try:
                if self._forks is None:
                    warm = None if self._own_packages else take_warm(env)
                    if warm is not None:
                        self._forks, extra = warm
                        self._warm_path = [str(self._root), *extra]  # (as a server of its own has it)
                    else:
                        self._forks = ForkServer(env, self._root)
                warm_path = self._warm_path
                proc = self._forks.fork(args, node_dir, log_path, env=own,
                                        environ=env if warm_path is not None else None, path=warm_path)
            except OSError as exc:  # ...or, where it cannot run, a new interpreter as before
                _log().warning("the Local fork server is not available (%s); each node starts its own interpreter", exc)
                dead, self._forks = self._forks, False
                if dead:
                    dead.close(timeout=1)
        if proc is None:
            with open(log_path, "ab") as log_file:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "skyward.bootstrap.agent_start", *args], cwd=node_dir,
                    env={**env, **own}, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=log_file, start_new_session=True,
                )
        self._procs[index] = proc
        return proc

    def _socket_path(self, node_dir: Path) -> str:
        """Where a node's agent listens (its lanes and the collections beside it): in the
        node's folder, or, when that path is too long for a Unix socket (a deep
        ``Local(workdir=...)``), in a short 0700 folder of the pool's own in the system's temp
        folder, removed with the pool."""
        path = node_dir / "agent.sock"
        if len(os.fsencode(str(path))) <= _UNIX_PATH_MAX - 16:  # room for lane-N.sock beside it
            return str(path)
        if self._sockets is None:
            self._sockets = tempfile.mkdtemp(prefix="sky-")  # 0700
        folder = os.path.join(self._sockets, node_dir.name.removeprefix("node-"))
        os.makedirs(folder, mode=0o700, exist_ok=True)
        return os.path.join(folder, "agent.sock")

    def _handshake(self, index: int, proc: Agent) -> tuple[int | None, str | None]:
        """The agent's Unix socket path (and TCP port: agents of older versions) from its hello."""
        if isinstance(proc, ForkedAgent):
            line = proc.hello(_START_TIMEOUT)
        else:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], _START_TIMEOUT)
            line = proc.stdout.readline() if ready else b""
            proc.stdout.close()
        try:
            hello = json.loads(line)
            if "error" in hello:
                raise ProviderError(f"the agent for Local node {index} could not listen: {hello['error']}")
            if not hello.get("unix") and "port" not in hello:
                raise KeyError("unix")
            return (int(hello["port"]) if "port" in hello else None), hello.get("unix")
        except (ValueError, KeyError):
            logs = [self._root / f"node-{index}" / "agent.log"]
            tails = []
            for log_file in logs:
                tail = log_file.read_text(errors="replace").strip().splitlines()[-20:] if log_file.exists() else []
                tails.append(f"its log ({log_file}) ends with:\n" + "\n".join(tail))
            if isinstance(proc, ForkedAgent):
                said = proc.server.errors().strip().splitlines()[-20:]
                tails.append(f"the fork server's log ({proc.server.log or 'unnamed'}) ends with:\n" + "\n".join(said))
            code = proc.poll()
            raise ProviderError(
                f"the agent for Local node {index} did not start"
                f"{f' (exit code {code})' if not isinstance(proc, ForkedAgent) else ''}; " + "\n".join(tails)
            ) from None

    def stop(self, endpoints: list[NodeEndpoint]) -> None:
        self._release(self.table.held(e.index for e in endpoints))

    def _release(self, nodes: list[dict[str, Any]]) -> None:
        """These nodes' agents stop (ours are reaped, others stopped by pid) and their GPUs go back."""
        with self._lock:
            procs = [self._procs.pop(n["index"]) for n in nodes if n["index"] in self._procs]
        self.table.forget(nodes)
        _reap(procs)
        ours = {p.pid for p in procs}
        _stop_foreign([n for n in nodes if _up(n) and n["pid"] not in ours])
        self._free_gpus([n["index"] for n in nodes])

    def close(self) -> None:
        with self._lock:
            procs = list(self._procs.values())
            self._procs.clear()
            ours = {p.pid for p in procs}
            foreign = [n for n in self.table.clear_locked() if _up(n) and n["pid"] not in ours]
            forks, self._forks = self._forks, None
        try:
            _reap(procs)
            _stop_foreign(foreign)
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting politely, but still clean up
            _reap(procs, grace=0)
            _stop_foreign(foreign, grace=0)
            raise
        finally:
            try:
                self._free_gpus(None)
                if forks:  # its agents are gone: it exits
                    forks.close()
                self._unmount_volumes()
            finally:
                self._remove_dirs()

    def _unmount_volumes(self) -> None:
        mounts, self._mounts = self._mounts, None
        if mounts is not None:
            mounts.close()
        elif self._unmount:  # a described pool's volumes (skyward down)
            from skyward.bootstrap.mounts import run_unmount

            run_unmount(self._unmount)

    def _remove_dirs(self) -> None:
        # (shutil and shm load here, not at the top: the nodes start before them, see launch)
        import shutil

        from skyward.bootstrap import shm

        for fd in self._held:
            sweep.release(fd)
        shutil.rmtree(self._root, ignore_errors=True)
        if self._sockets:
            shutil.rmtree(self._sockets, ignore_errors=True)
        if self.spill_dir is not None:
            shm.forget(self.spill_dir)  # this process's mappings of the pool's segments
            shutil.rmtree(self.spill_dir, ignore_errors=True)


_DETACHED: list[Agent] = []


def _up(node: dict[str, Any]) -> bool:
    """Has this node's agent said hello (a node claimed at its fork has only its index)?"""
    return "pid" in node


def _not_running(node: dict[str, Any]) -> str:
    """Why a described Local node cannot be reached: its agent is gone, and what its log says."""
    last = ""
    with contextlib.suppress(OSError):
        lines = Path(node.get("log") or "").read_text(errors="replace").strip().splitlines()
        last = lines[-1] if lines else ""
    said = f"; its log ends with {last!r}" if last else ""
    return (f"Local node {node['index']}: its agent (pid {node['pid']}) is not running (it exited or "
            f"was killed{said})")


def _mount_volumes(spec: Spec, pool_id: str, root: Path) -> Any:
    """The pool's sky.Volume buckets, mounted on this machine before any node starts."""
    if not spec.volumes:
        return None  # (without loading the mounts' module: most pools have none)
    from skyward.bootstrap.mounts import LocalMounts, volumes_of
    from skyward.observe import events as ev

    volumes = volumes_of(spec)
    if not volumes:
        return None

    def phase(status: Any, seconds: float | None) -> None:
        ev.bus.emit(ev.BootstrapPhase(pool=pool_id, node=-1, phase="volumes", status=status, seconds=seconds))

    return LocalMounts(volumes, root, on_phase=phase)


def _endpoint(index: int, port: int | None, unix: str | None = None) -> NodeEndpoint:
    return NodeEndpoint(
        index=index,
        private_ip="127.0.0.1",
        public_ip=None,
        hostname=socket.gethostname(),
        connect=functools.partial(_connect, port, unix, 10),
    )


def _connect(port: int | None, unix: str | None, timeout: float) -> socket.socket:
    """A connection to a Local agent: its Unix socket (TCP loopback only for a pool that an
    older version started with a port)."""
    if unix:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(unix)
            return sock
        except OSError:
            sock.close()
            if port is None:
                raise
    if port is None:
        raise ConnectionRefusedError(f"the Local agent has no socket to connect to ({unix!r})")
    return socket.create_connection(("127.0.0.1", port), timeout)


_UNIX_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, 104 on macOS







def _stop_foreign(nodes: list[dict[str, Any]], grace: float = 5.0) -> None:
    """Stop agents this process did not start (they were asked to shut down already): wait,
    then SIGTERM, then SIGKILL their process groups. They are not our children, so their
    exit is watched through /proc; whoever is their parent now reaps them."""
    deadline = time.monotonic() + grace
    for sig in (None, signal.SIGTERM, signal.SIGKILL) if grace else (signal.SIGKILL,):
        alive = [n for n in nodes if process_running(n["pid"], n.get("started"))]
        if not alive:
            return
        for n in alive:
            if sig is not None:
                try:
                    os.killpg(n["pid"], sig)  # agents lead their own session and group
                except OSError:
                    pass
        for n in alive:
            wait_gone(n["pid"], max(0.0, deadline - time.monotonic()))
        deadline = time.monotonic() + 2.0


SHM = Path("/dev/shm")  # where Local pools make their shared-memory folder (tests point it elsewhere)


def sweep_folders(workdir: str | None = None) -> list[Path]:
    """Remove the folders of Local pools whose processes are all gone, killed before they
    could (``skyward-<id>-*`` in the temp folder, or ``workdir``, and in shared memory):
    those whose lock no client or agent holds (bootstrap/sweep.py), this user's only."""
    return sweep.local_pools(workdir, SHM)


def _spill_dir(pool_id: str, fallback: Path) -> Path:
    """Shared memory when the machine has it (a copy into RAM, no socket hops), else disk."""
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        return Path(tempfile.mkdtemp(prefix=f"skyward-{pool_id}-", dir=SHM))
    path = fallback / "spill"
    path.mkdir(mode=0o700)
    return path


def _reap(procs: list[Agent], grace: float = 5.0) -> None:
    """Wait for agents that were told to stop; SIGTERM, then SIGKILL the stragglers."""
    deadline = time.monotonic() + grace
    for sig in (None, signal.SIGTERM, signal.SIGKILL) if grace else (signal.SIGKILL,):
        alive = [p for p in procs if p.poll() is None]
        if not alive:
            return
        for p in alive:
            if sig is not None:
                try:
                    os.killpg(p.pid, sig)
                except OSError:
                    pass
        for p in alive:
            _wait_exit(p, max(0.1, deadline - time.monotonic()))
        deadline = time.monotonic() + 2.0
    for p in procs:
        p.wait()


def _wait_exit(proc: Agent, timeout: float) -> None:
    """Wait up to ``timeout`` s for ``proc`` to exit, woken by its exit (procs.wait_gone)
    instead of Popen.wait's polling, whose sleeps add tens of milliseconds to every pool's
    close; then reap it if it is our child."""
    wait_gone(proc.pid, timeout)
    proc.poll()


def _shell_value(name: str, command: str, env: dict[str, str]) -> str:
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise ConfigError(
            f"Image(shell_vars={{{name!r}: {command!r}}}): the command failed with exit code "
            f"{proc.returncode}: {proc.stderr.strip()[-500:]}"
        )
    return proc.stdout.strip()
