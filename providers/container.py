"""sky.Container(image=...): each node is a container on this machine, to try an Image for free.

The nodes are bootstrapped exactly as SSH and cloud nodes are (``skyward.bootstrap.shipment``:
the script rendered from the final Image, the client's wheelhouse, ``Image.apt`` through the
container's apt, the agent behind the pool-secret handshake); only the way in differs. No SSH:
the client runs the script with ``podman exec`` (or docker's, nerdctl's), and reaches the agent
on its Unix socket, in a 0700 folder of the host that is mounted into the container
(container_node.py). No port is published.

One container per node, on a bridge network of the pool's own (a free /24 of
``container_runtime.POOL_SUBNETS``) or on ``network=``; the nodes reach each other there (torch's
rendezvous, the collections on the head). ``vcpus=`` and ``memory_gb=`` become the runtime's
``--cpus`` and ``--memory``, ``accelerator=`` its ``--device nvidia.com/gpu=...`` (CDI; docker:
``--gpus``).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import os
import queue
import random
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from skyward.bootstrap.shipment import Shipment
from skyward.bootstrap.shipment import facts as _facts
from skyward.bootstrap.shipment import phase_command as _phase_command
from skyward.containers import DockerImage
from skyward.errors import BootstrapError, ConfigError, ProviderError, SkywardError
from skyward.observe import events as ev
from skyward.records import pkglock, resolver

from . import container_node as node_sh
from .base import Cluster, ExecShell, NodeEndpoint, ProviderConfig, require_kind
from .container_runtime import LABEL, Runtime
from .nodetable import NodeTable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from skyward.bootstrap.routes import Stream, Target
    from skyward.spec import Image, Options, Spec

log = logging.getLogger("skyward.container")
Install = Literal["wheelhouse", "index"]
BINARIES = ("podman", "docker", "nerdctl")
_AGENT_START_TIMEOUT = 30
_UNIX_PATH_MAX = 100  # sun_path holds 108 bytes on Linux


def default_image() -> str:
    """``SKYWARD_CONTAINER_IMAGE`` when set (a machine whose runtime reaches no registry: its local
    base, so that code written as ``sky.Container()`` runs unchanged), else the client's Python in
    Debian: the nodes then take the client's wheels as they are."""
    return os.environ.get("SKYWARD_CONTAINER_IMAGE") or (
        f"docker.io/library/python:{sys.version_info.major}.{sys.version_info.minor}-slim"
    )


@dataclass(frozen=True, slots=True)
class Container(ProviderConfig):
    """Nodes as containers on this machine: ``sky.Container(image="debian-with-python:12")``.

    ``image``: the base every node starts from, a tag or a ``sky.DockerImage`` (``sky.containers``'
    helpers; kept as its tag), default ``SKYWARD_CONTAINER_IMAGE`` when set, else the official
    ``python`` image of the client's version; it needs bash and a Python of the client's version (``install="index"``:
    any Python, or none, when the containers reach a package index). ``binary``: the runtime,
    ``"podman"`` (default: no daemon, rootless or root), ``"docker"`` or ``"nerdctl"``, or a path
    to one of them. ``network``: an existing network to put the nodes on (default: a network of
    the pool's own, removed with it). ``install``: as for sky.SSH (``"wheelhouse"``: the client
    ships every wheel; ``"index"``: nodes install ``Image.pip`` from their index).
    """

    image: str | DockerImage | None = None
    binary: str = "podman"
    network: str | None = None
    install: Install = "wheelhouse"
    kind: ClassVar[str] = "container"

    def __post_init__(self) -> None:
        if isinstance(self.image, DockerImage):  # sky.containers.cuda("12.9"), DockerImage.of(...)
            object.__setattr__(self, "image", str(self.image))
        if self.image is not None and (not isinstance(self.image, str) or not self.image.strip()):
            raise ConfigError(
                f"sky.Container(image={self.image!r}): give an image name, e.g. "
                f"image='docker.io/library/python:3.12-slim' or image=sky.containers.ubuntu('24.04')."
            )
        if (
            not isinstance(self.binary, str)
            or not self.binary
            or (os.path.basename(self.binary) not in BINARIES and "/" not in self.binary)
        ):
            raise ConfigError(
                f"sky.Container(binary={self.binary!r}) is not valid: use 'podman', 'docker', "
                f"'nerdctl' or the path of one of them."
            )
        if self.network is not None and (
            not isinstance(self.network, str) or not self.network.strip()
        ):
            raise ConfigError(
                f"sky.Container(network={self.network!r}): give the name of an existing network."
            )
        if self.install not in ("wheelhouse", "index"):
            raise ConfigError(
                f"sky.Container(install={self.install!r}) is not valid: use 'wheelhouse' or 'index'."
            )

    def check(self, spec: Spec) -> str | None:
        if spec.volumes:
            from skyward.volumes import Volume

            if not all(isinstance(v, Volume) for v in spec.volumes):
                return (
                    "sky.Disk applies to cloud providers only (containers use this machine's disks)"
                )
            if any(v.storage is None for v in spec.volumes):
                return (
                    "containers have no object store of their own: give each sky.Volume a storage=, "
                    "e.g. sky.storage.S3(region='us-east-1')"
                )
        if spec.accelerator is not None and _gpu_runtime(Runtime(self.binary)) is None:
            return (
                f"sky.Container was asked for accelerator {spec.accelerator} and {self.binary} has no "
                f"GPU to hand out here (no CDI spec for nvidia.com/gpu in /etc/cdi or /var/run/cdi, "
                f"and for docker no nvidia runtime); generate one with `nvidia-ctk cdi generate "
                f"--output=/etc/cdi/nvidia.yaml`, or drop accelerator= to run on the CPU."
            )
        return None

    def hourly_cost(self, spec: Spec) -> float | None:
        return 0.0  # this machine

    def preflight(self, spec: Spec) -> None:
        Runtime(self.binary).path()  # the binary is there (the error says how to install it)

    def create(
        self, spec: Spec, pool_id: str, options: Options | None = None, name: str | None = None,
        pin: tuple[pkglock.Package, ...] | None = None,
    ) -> ContainerCluster:
        return ContainerCluster(self, spec, pool_id, options=options, pin=pin)

    # -- named pools (see ProviderConfig) --------------------------------------------------------
    def attach(self, description: dict[str, Any]) -> ContainerCluster:
        return ContainerCluster.from_description(description)

    def destroy(self, description: dict[str, Any]) -> None:
        cluster = ContainerCluster.from_description(description)
        cluster.ask_to_shut_down()
        cluster.close()

    def alive(self, description: dict[str, Any]) -> bool | None:
        return (
            any(v is True for v in self.nodes_alive(description))
            if description.get("nodes")
            else False
        )

    def nodes_alive(self, description: dict[str, Any]) -> list[bool | None]:
        runtime = Runtime(str(description.get("binary") or self.binary))
        try:
            running = runtime.running(str(description["pool_id"]))
        except ProviderError:
            return [None for _ in description.get("nodes", [])]
        return [running.get(n["container"], False) for n in description.get("nodes", [])]


@dataclass
class _Node:
    index: int
    container: str
    folder: Path  # on the host: mounted at /run/skyward in the container
    private_ip: str = ""
    hostname: str = ""
    agent_pid: int | None = None
    endpoint: NodeEndpoint | None = None

    @property
    def pool_dir(self) -> str:
        """The node's folder of the pool, as the container sees it."""
        return f"{node_sh.NODE_RUN}/pools/{self.container}"

    @property
    def socket(self) -> str:
        return str(self.folder / os.path.basename(node_sh.AGENT_SOCKET))


class ContainerCluster(Cluster):
    """One container per node, bootstrapped through the runtime's ``exec``."""

    def __init__(
        self,
        config: Container,
        spec: Spec,
        pool_id: str,
        *,
        options: Options | None = None,
        root: Path | None = None,
        pin: tuple[pkglock.Package, ...] | None = None,
    ) -> None:
        self.spec = spec
        self.pool_id = pool_id
        self.token = secrets.token_urlsafe(32)
        self.head_port = random.randrange(
            20000, 30000
        )  # torch/jax rendezvous, inside the containers
        self.interface = "eth0"
        self.spill_dir = None
        self._runtime = Runtime(config.binary)
        self._image = str(config.image or default_image())
        self._network = config.network or f"skyward-{pool_id}"
        self._own_network = config.network is None
        self._install: Install = config.install
        # 0700: the nodes' sockets (an attached pool's: the folder its nodes were made in)
        self._root = root or Path(tempfile.mkdtemp(prefix=f"sky-ctr-{pool_id}-"))
        self._home: Path | None = None  # skyward's caches for this image (set by _prepare)
        self._ttl = spec.ttl
        o = options
        self._bootstrap_timeout = float(
            o.bootstrap_timeout
            if o is not None and o.bootstrap_timeout
            else spec.image.bootstrap_timeout
        )
        self._pin = pin  # reproducing a pool: install its recorded packages
        self._agent_python: str | None = None  # (an attached pool's, from its description)
        self.table: NodeTable[_Node] = NodeTable()
        self._lock = self.table.lock
        self._ship: Shipment | None = None
        self._limits: list[str] | None = None
        self.apt_versions: dict[str, str] = {}

    # -- Cluster API -------------------------------------------------------------------------
    def start(self, count: int) -> list[NodeEndpoint]:
        return self.table.start(count, reconnect=self._reconnect, begin=self._begin, release=self._release)

    def start_each(self, count: int) -> Iterator[NodeEndpoint | BaseException]:
        return self.table.start_each(count, reconnect=self._reconnect, begin=self._begin, release=self._release)

    def _begin(self, count: int) -> tuple[list[_Node], Callable[[_Node], NodeEndpoint]]:
        self._prepare()
        return self.table.claim(count, self._new_node), self._bring_up

    def _new_node(self, index: int) -> _Node:
        return _Node(index, f"skyward-{self.pool_id}-{index}", self._root / f"node-{index}")

    def stop(self, endpoints: list[NodeEndpoint]) -> None:
        self._release(self.table.held(e.index for e in endpoints))

    def close(self) -> None:
        nodes = self.table.clear()
        try:
            self._release(nodes)
            # Anything of this pool a half-done start left (a container whose start was interrupted).
            left = list(self._runtime.running(self.pool_id))
            self._runtime.remove(left)
            if self._own_network and self._runtime.network_exists(self._network):
                self._runtime.remove_network(self._network)
        finally:
            shutil.rmtree(self._root, ignore_errors=True)

    def ask_to_shut_down(self) -> None:
        """Tell every described agent to stop (it then stops its workers); best effort."""
        from skyward.bootstrap.channel import NodeChannel

        for node in self.table.all():
            try:
                sock = _connect(node.socket, 5)
                NodeChannel(
                    sock,
                    node=node.index,
                    token=self.token,
                    ttl=self._ttl,
                    on_output=lambda *_: None,
                ).close(shutdown_agent=True)
            except (OSError, SkywardError):
                pass  # close() removes the container anyway

    # -- what every node gets, once ---------------------------------------------------------------
    def _prepare(self) -> None:
        with self._lock:
            if self._ship is not None:
                return
            rt = self._runtime
            info = rt.info()  # the binary, its daemon, this user's rights: each says what to do
            self._limits = self._limit_args(info)
            if not rt.image_exists(self._image):
                self._phase(-1, "pull", "started")
                t0 = time.monotonic()
                try:
                    rt.run(
                        ["pull", self._image], timeout=1800, what=f"getting image {self._image!r}"
                    )
                except ProviderError:
                    self._phase(-1, "pull", "failed", time.monotonic() - t0)
                    raise
                self._phase(-1, "pull", "done", time.monotonic() - t0)
            self._home = self._cache_folder()
            self._ensure_network()
            from skyward.bootstrap import shipment

            image, ops = self._final_image()
            self._ship, self.package_lock = shipment.build(
                self.spec,
                image,
                ops,
                pool_id=self.pool_id,
                install=self._install,
                kind="container",
                pin=self._pin,
                platform=None if self._install == "wheelhouse" else resolver.node_platform(None),
                on_phase=lambda node, phase, status, seconds: self._phase(
                    node, phase, status, seconds
                ),
            )
            _place(self._home, self._ship.files)

    def _final_image(self) -> tuple[Image, tuple[str, ...]]:
        if not self.spec.plugins:
            return self.spec.image, ()
        from skyward.plugins.compose import prepare

        return prepare(self.spec, self)

    def _cache_folder(self) -> Path:
        """skyward's caches on the nodes, kept on this machine per runtime and image: the next
        pool of the same image finds its environment built."""
        from skyward.paths import skyward_home

        proc = self._runtime.run(
            ["image", "inspect", "--format", "{{.Id}}", self._image],
            what=f"reading the id of image {self._image!r}",
        )
        image_id = proc.stdout.strip().splitlines()[-1].removeprefix("sha256:")[:16]
        folder = skyward_home() / "containers" / f"{self._runtime.name}-{image_id}"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return folder

    def _ensure_network(self) -> None:
        if self._runtime.network_exists(self._network):
            return
        if not self._own_network:
            raise ProviderError(
                f"sky.Container(network={self._network!r}): no such {self._runtime.name} "
                f"network; create it (`{self._runtime.name} network create {self._network}`) "
                f"or leave network= out for a network of the pool's own."
            )
        self._runtime.prune_networks()  # of pools whose client died: their containers are gone
        _sweep_folders(self._runtime)
        self._runtime.create_network(self._network, self.pool_id)

    def _limit_args(self, info: dict[str, Any]) -> list[str]:
        """``--cpus``/``--memory`` for vcpus=/memory_gb=, where this machine's cgroups allow them."""
        spec, args = self.spec, []
        if spec.vcpus:
            args += ["--cpus", f"{float(spec.vcpus):g}"]
        if spec.memory_gb:
            args += ["--memory", f"{max(6, int(float(spec.memory_gb) * 1024))}m"]
        host = info.get("host") or info.get("Host") or {}
        security = host.get("security") or {} if isinstance(host, dict) else {}
        rootless = bool(security.get("rootless")) if isinstance(security, dict) else False
        cgroups = str(host.get("cgroupVersion") or "") if isinstance(host, dict) else ""
        if args and rootless and cgroups == "v1":
            log.warning(
                "sky.Container: vcpus=/memory_gb= are not applied: rootless %s cannot limit "
                "containers on cgroup v1 (the nodes share this machine's CPUs and memory). "
                "Run as root, or on a machine with cgroup v2, for the limits.",
                self._runtime.name,
            )
            return []
        return args

    # -- one node ---------------------------------------------------------------------------------
    def _bring_up(self, node: _Node) -> NodeEndpoint:
        ship, home = self._ship, self._home
        assert ship is not None and home is not None
        rt = self._runtime
        pool_dir = node.folder / "pools" / node.container
        pool_dir.mkdir(parents=True, mode=0o700)
        node.folder.chmod(0o700)
        self._root.chmod(0o700)  # (made again when an asleep pool, swept meanwhile, wakes)
        if len(os.fsencode(node.socket)) > _UNIX_PATH_MAX:
            raise ProviderError(
                f"the agent's socket path {node.socket} is too long for a Unix socket; "
                f"set TMPDIR to a shorter folder."
            )
        if ship.includes is not None:
            _write(pool_dir / "includes.tar", ship.includes)
        if (
            ship.volumes_conf is not None
        ):  # the volumes' credentials: a 0600 file, never in the script
            _write(pool_dir / "rclone.conf", ship.volumes_conf)
        self._phase(node.index, "container", "started")
        t0 = time.monotonic()
        deadline = int(self._bootstrap_timeout) + 120
        rt.run(
            [
                "run",
                "-d",
                "--rm",
                "--init",
                "--name",
                node.container,
                "--hostname",
                node.container,
                "--network",
                self._network,
                "--label",
                f"{LABEL}={self.pool_id}",
                "--label",
                f"skyward.node={node.index}",
                "--user",
                "0:0",
                "-v",
                f"{home}:{node_sh.NODE_HOME}",
                "-v",
                f"{node.folder}:{node_sh.NODE_RUN}",
                "-e",
                f"SKYWARD_NODE_HOME={node_sh.NODE_HOME}",
                "-e",
                f"SKYWARD_NODE_RUN={node_sh.NODE_RUN}",
                *(self._limits or []),
                *self._gpu_args(node.index),
                "--entrypoint",
                "sh",
                self._image,
                "-c",
                node_sh.watch(deadline),
            ],
            what=f"starting container {node.container} from image {self._image!r}",
            timeout=300,
        )
        node.private_ip = rt.address(node.container, self._network)
        self._phase(node.index, "container", "done", time.monotonic() - t0)
        self._run_script(node, ship.script)
        hello, facts = self._start_agent(node, ship.agent_python)
        node.agent_pid = int(hello["pid"])
        node.hostname = facts.get("hostname") or node.container
        if node.index == 0 or self.interface == "eth0":
            self.interface = facts.get("interface") or self.interface
        node.endpoint = _endpoint(node)
        return node.endpoint

    def _gpu_args(self, index: int) -> list[str]:
        acc = self.spec.accelerator
        if acc is None:
            return []
        kind = _gpu_runtime(self._runtime)
        count = max(1, int(float(getattr(acc, "count", 1)) + 0.999))
        devices = ",".join(str(index * count + i) for i in range(count))
        if kind == "gpus":
            return ["--gpus", f'"device={devices}"']
        return [a for d in devices.split(",") for a in ("--device", f"nvidia.com/gpu={d}")]

    def _exec(
        self, node: _Node, args: list[str], *, stdin: bytes, timeout: float, on_line: Any = None
    ) -> tuple[int | None, list[str]]:
        """Run ``args`` in the node's container: (exit code or None on timeout, its output lines)."""
        env = [
            f"--env=SKYWARD_SKY={node_sh.NODE_HOME}",
            f"--env=SKYWARD_RUN={node_sh.NODE_RUN}",
            f"--env=SKYWARD_POOL={node.pool_dir}",
        ]
        proc = subprocess.Popen(
            [self._runtime.path(), "exec", "-i", *env, node.container, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        lines: queue.Queue[bytes | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                lines.put(raw)
            lines.put(None)

        reader = threading.Thread(target=pump, daemon=True, name="skyward-container-exec")
        reader.start()
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin)
            proc.stdin.close()
        out: list[str] = []
        end = time.monotonic() + timeout
        try:
            while True:
                try:
                    raw = lines.get(timeout=max(0.0, end - time.monotonic()))
                except queue.Empty:
                    return None, out
                if raw is None:
                    break
                line = raw.decode(errors="replace").rstrip("\n")
                out.append(line)
                if on_line is not None:
                    on_line(line)
            return proc.wait(), out
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            reader.join(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()

    def _run_script(self, node: _Node, text: str) -> None:
        from skyward.bootstrap.progress import PhaseReader

        progress = PhaseReader(node.index, self._phase, apt=self.apt_versions, lock=lambda: self.package_lock)

        def on_line(line: str) -> None:
            if not progress.feed(line) and line.strip() and not line.startswith("@@skyward"):
                log.debug("node %d: %s", node.index, line)

        code, out = self._exec(
            node,
            ["bash", "-s"],
            stdin=text.encode(),
            timeout=self._bootstrap_timeout,
            on_line=on_line,
        )
        if code == 0:
            return
        phase = progress.current or "bootstrap"
        tail = [line for line in out if not line.startswith("@@skyward")][-20:]
        why = ""
        if code is None:
            why = f"did not finish within bootstrap_timeout={self._bootstrap_timeout:g} s"
        elif code in (126, 127) and not progress.current:
            why = (
                f"could not run bash in image {self._image!r} (exit code {code}): the nodes' image "
                f"needs bash and a Python of the client's version"
            )
        raise BootstrapError(
            host=f"node {node.index} (container {node.container})",
            phase=phase,
            command=_phase_command(text, phase),
            exit_code=code,
            output=tail,
            why=why,
        )

    def _start_agent(self, node: _Node, agent_python: str) -> tuple[dict[str, Any], dict[str, str]]:
        command = node_sh.start_agent(node.pool_dir, agent_python, self._ttl, _AGENT_START_TIMEOUT)
        code, out = self._exec(
            node,
            ["bash", "-c", command],
            stdin=(self.token + "\n").encode(),
            timeout=_AGENT_START_TIMEOUT + 15,
        )
        facts = _facts("\n".join(out))
        try:
            hello = json.loads(facts.get("hello", ""))
            if "error" in hello:
                raise ValueError(hello["error"])
            int(hello["pid"])
            return hello, facts
        except (ValueError, KeyError, TypeError):
            log_file = node.folder / "pools" / node.container / "agent.log"
            tail = (
                log_file.read_text(errors="replace").splitlines()[-20:]
                if log_file.exists()
                else out[-20:]
            )
            raise BootstrapError(
                host=f"node {node.index} (container {node.container})",
                phase="agent",
                command="python -m skyward.bootstrap.agent_start",
                exit_code=code,
                output=tail,
                why=f"did not report its socket within {_AGENT_START_TIMEOUT} s",
            ) from None

    def _release(self, nodes: list[_Node]) -> None:
        """Remove these nodes' containers (their agents were told to stop) and their folders."""
        self.table.forget(nodes)
        if not nodes:
            return
        try:
            self._runtime.remove([n.container for n in nodes])
        finally:
            for n in nodes:
                shutil.rmtree(n.folder, ignore_errors=True)

    def _phase(self, node: int, phase: str, status: Any, seconds: float | None = None) -> None:
        ev.bus.emit(
            ev.BootstrapPhase(
                pool=self.pool_id, node=node, phase=phase, status=status, seconds=seconds
            )
        )

    # -- named pools (see Cluster.describe / ProviderConfig.attach) ----------------------------
    def describe(self) -> dict[str, Any]:
        import cloudpickle

        nodes = self.table.all()
        agent_python = self._ship.agent_python if self._ship else self._agent_python
        return {
            "provider": "container",
            "pool_id": self.pool_id,
            "token": self.token,
            "head_port": self.head_port,
            "interface": self.interface,
            "ttl": self._ttl,
            "binary": self._runtime.binary,
            "image": self._image,
            "network": self._network,
            "own_network": self._own_network,
            "install": self._install,
            "root": str(self._root),
            "home": str(self._home) if self._home else None,
            "next": self.table.next,
            "spec": base64.b64encode(cloudpickle.dumps(self.spec)).decode(),
            "pin": (self.package_lock or {}).get("packages")
            if self._pin is None
            else [p.to_json() for p in self._pin],
            "nodes": [
                {
                    "index": n.index,
                    "private_ip": n.private_ip,
                    "public_ip": None,
                    "hostname": n.hostname or n.container,
                    "container": n.container,
                    "folder": str(n.folder),
                    "agent_pid": n.agent_pid,
                    "socket": n.socket,
                    "log": f"{n.pool_dir}/agent.log",
                    "pool_dir": n.pool_dir,
                    "home": node_sh.NODE_HOME,
                    "agent_python": agent_python,
                }
                for n in nodes
            ],
        }

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> ContainerCluster:
        """The nodes another process started; connects to nothing until ``start``."""
        import cloudpickle

        require_kind(description, "container")
        network = description["network"]
        own = bool(description.get("own_network"))
        config = Container(image=description["image"], binary=description["binary"],
                           network=None if own else network, install=description.get("install", "wheelhouse"))
        spec = cloudpickle.loads(base64.b64decode(description["spec"]))
        self = cls(config, spec, description["pool_id"], root=Path(description["root"]))
        self._network, self._own_network = network, own
        self.token = description["token"]
        self.head_port = int(description["head_port"])
        self.interface = description.get("interface", "eth0")
        self._home = Path(description["home"]) if description.get("home") else None
        self._ttl = description["ttl"]
        pin = description.get("pin")
        self._pin = None if pin is None else tuple(pkglock.Package.from_json(p) for p in pin)
        self.table.restore(
            (
                _Node(
                    int(n["index"]),
                    n["container"],
                    Path(n["folder"]),
                    private_ip=n.get("private_ip") or "",
                    hostname=n.get("hostname") or "",
                    agent_pid=n.get("agent_pid"),
                )
                for n in description["nodes"]
            ),
            int(description.get("next", 0)),
        )
        self._agent_python = next(
            (n.get("agent_python") for n in description["nodes"] if n.get("agent_python")), None
        )
        return self

    def _reconnect(self, nodes: list[_Node]) -> list[NodeEndpoint]:
        """Hand out described nodes whose container still runs; the others are unreachable."""
        try:
            running = self._runtime.running(self.pool_id)
        except ProviderError as exc:
            running, why = {}, str(exc)
        else:
            why = ""
        reached = []
        for node in nodes:
            self.table.add(node)
            if running.get(node.container):
                node.endpoint = _endpoint(node)
                reached.append(node.endpoint)
            else:
                self.table.mark_unreachable(
                    node.index,
                    why
                    or (
                        f"its container {node.container} is not running (its "
                        f"agent's lease ran out, or it was removed)"
                    ),
                )
        if not reached and nodes:
            raise ProviderError(
                f"none of the {len(nodes)} container node(s) of this pool runs any more "
                f"({self.table.unreachable[nodes[0].index]}); `skyward down` removes its record."
            )
        return reached

    def detach(self) -> None:
        self.table.clear()

    # -- reaching a node: the runtime's exec into its container ---------------------------------------
    def _node_at(self, index: int) -> _Node:
        node = self.table.find(index)
        if node is None:
            raise ProviderError(f"node {index} is not one of this pool's nodes")
        return node

    def exec_argv(self, index: int, tty: bool) -> list[str]:
        """The command line that runs a program in node ``index``'s container."""
        node = self._node_at(index)
        return [self._runtime.path(), "exec", "-i", *(["-t"] if tty else []), node.container]

    def shell(self, index: int) -> ExecShell:
        self._node_at(index)
        return ExecShell(functools.partial(self.exec_argv, index))

    def open_stream(self, index: int, target: Target) -> Stream:
        """A relay in the node's container, on the runtime's ``exec`` (no port is published and
        the container's loopback is its own), run by the pool's Python there."""
        from skyward.bootstrap.routes import through_exec

        agent_python = self._ship.agent_python if self._ship else self._agent_python
        python = f"{node_sh.NODE_HOME}/{agent_python}" if agent_python else "python3"
        return through_exec([*self.exec_argv(index, False), python, "-m", "skyward.bootstrap.relay", str(target)])


def _endpoint(node: _Node) -> NodeEndpoint:
    return NodeEndpoint(
        index=node.index,
        private_ip=node.private_ip,
        public_ip=None,
        hostname=node.hostname or node.container,
        connect=functools.partial(_connect, node.socket, 10),
    )


def _connect(path: str, timeout: float) -> socket.socket:
    """The agent's Unix socket, in the node's folder mounted from this machine."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _place(home: Path, files: dict[str, tuple[Path | bytes, int]]) -> None:
    """The shipment's shared files into the nodes' cache folder, once: a file already there with
    the same size is kept; a new one is written under a unique name and renamed into place (other
    pools may be reading the folder)."""
    for rel, (src, mode) in files.items():
        dest = home / rel
        size = src.stat().st_size if isinstance(src, Path) else len(src)
        if dest.is_file() and dest.stat().st_size == size:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}")
        if isinstance(src, Path):
            shutil.copyfile(src, tmp)
        else:
            tmp.write_bytes(src)
        tmp.chmod(mode)
        os.replace(tmp, dest)


def _sweep_folders(runtime: Runtime) -> None:
    """The host folders of pools whose client died (their agents emptied them at the end of their
    lease and their containers removed themselves): untouched for ten minutes and no container.
    Only this user's folders, never a link: the temp folder is everyone's, and a pool run as
    root could otherwise remove another user's pool folders (or whatever a link named so
    points to)."""
    me = os.geteuid()
    for folder in Path(tempfile.gettempdir()).glob("sky-ctr-*-*"):
        pool_id = folder.name.split("-")[2]
        try:
            st = folder.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
                continue
            if time.time() - st.st_mtime < 600 or runtime.running(pool_id):
                continue
        except (OSError, ProviderError):
            continue
        shutil.rmtree(folder, ignore_errors=True)


def _gpu_runtime(runtime: Runtime) -> str | None:
    """How this runtime hands GPUs to containers: "cdi" (a CDI spec for nvidia.com/gpu; podman,
    and docker 25+), "gpus" (docker's --gpus, with the nvidia runtime), or None."""
    for folder in ("/etc/cdi", "/var/run/cdi"):
        with contextlib.suppress(OSError):
            for entry in os.listdir(folder):
                if entry.endswith((".yaml", ".yml", ".json")) and "nvidia" in entry:
                    return "cdi"
    if runtime.name == "docker" and shutil.which("nvidia-container-runtime"):
        return "gpus"
    return None
