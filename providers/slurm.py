"""sky.Slurm(login): pools on the Slurm clusters that labs and universities already run.

The client logs in to the login node only, as a user of the site does. For a pool of N nodes:

1. the shipment (bootstrap script, uv, the wheelhouse) goes to the user's home, which every node
   of a Slurm site shares; the environment is built there once, from the login node, while the
   job waits in the queue;
2. one job of N nodes is submitted with ``sbatch`` (all nodes start together, as DDP needs); its
   batch script runs ``srun`` with one task per node, and each task runs the same bootstrap (the
   shared phases find the environment built and skip) and then the agent, in the foreground: the
   agent is the job, so ``scancel`` stops it and its end ends the job;
3. each agent listens on its node's private address (``--direct``: only clients that prove the
   pool's token are admitted) and writes where to a file in the pool's folder; the client reaches
   it through a direct-tcpip channel of its SSH connection to the login node (the login node is
   the bastion), never by logging in to a compute node.

The token travels in a 0600 file of the pool's 0700 folder (uploaded over the login node's SSH
connection), never in the job's environment or on a command line; each node's script reads it into
a shell variable for its agent, which takes it out of its own environment. While the job waits, the
pool's events say its id, state and Slurm's reason; leaving the pool cancels the job; a node lost
is replaced by a one-node job.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import re
import secrets
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from skyward.bootstrap import shipment as ship
from skyward.bootstrap.routes import channel, prohibited, relay_command
from skyward.bootstrap.script import hold_pool, run_folder
from skyward.errors import BootstrapError, ConfigError, ProviderError
from skyward.observe import events as ev
from skyward.records import pkglock, resolver

from . import slurm_queue as q
from .base import Cluster, NodeEndpoint, ProviderConfig, SSHShell, require_kind
from .nodetable import NodeTable
from .slurm_shared import SharedQueue, queue_of

if TYPE_CHECKING:
    from skyward.bootstrap.progress import PhaseReader
    from skyward.bootstrap.remote import Remote
    from skyward.bootstrap.routes import Stream, Target
    from skyward.spec import Image, Options, Spec

log = logging.getLogger("skyward.slurm")
Install = Literal["wheelhouse", "index"]
_POLL = 0.25  # seconds between looks at the queue and the nodes' files while a job starts
# While a job waits in the queue: (until it has waited this long, look every this many seconds);
# capped by sky.Slurm(max_poll_interval=). A job that starts at once is seen within 0.25 s.
_PENDING_POLL = ((2.0, _POLL), (5.0, 1.0), (15.0, 2.0), (40.0, 5.0), (120.0, 10.0), (float("inf"), 30.0))
_AGENT_START_TIMEOUT = 30
_IO_LINGER = 0.3  # seconds a `skyward ssh`/`cp` step outlives its command (see SlurmCluster.shell)


@dataclass(frozen=True, slots=True)
class Slurm(ProviderConfig):
    """A Slurm cluster reached through its login node: ``sky.Slurm("me@login.hpc.example.edu")``.

    ``login`` is ``host``, ``user@host`` or ``user@host:port`` (``user``, ``key``, ``port`` and
    ``jump``, a bastion in front of the login node, as in sky.SSH; ``~/.ssh/config`` is honoured).
    ``partition``, ``account``, ``qos``, ``constraint`` go to sbatch as they are; ``time`` is the
    job's ``--time`` (seconds, or Slurm's "HH:MM:SS"; default ``max_duration``, else the
    partition's default); ``options`` are extra sbatch flags (``["--exclusive", "--mem=64G"]``).
    ``gres``: the site's GRES type for the pool's accelerator (default: its name as the site's
    ``sinfo`` spells it, ``A100`` or ``a100``, lowercased where sinfo cannot be read; "" for
    untyped ``--gpus-per-node=N``).
    ``pending_timeout``: seconds a job may wait in the queue before the pool gives up and cancels it.
    ``max_poll_interval``: the most seconds between two looks (``squeue``) at a job waiting in the
    queue: looks start 0.25 s apart and slow down (1, 2, 5, 10, 30 s) while it waits.
    ``install``, ``known_hosts``: as in sky.SSH.
    ``submit``: how each job is asked for. ``"sbatch"`` (the default): a batch job, which the
    scheduler starts on its own schedule (Slurm schedules batch jobs at most every
    ``batch_sched_delay``, 3 s by default) and which needs nothing on the login node while it
    runs. ``"srun"``: an interactive job, scheduled the moment it is asked for (a pool on an idle
    cluster starts in about a second), held by an ``srun`` the pool leaves running on the login
    node (detached from the SSH session): if that process goes (a login node's reboot), the job
    ends and its nodes are replaced like any lost node.
    """

    login: str = ""
    user: str | None = None
    key: str | None = None
    port: int | None = None
    jump: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: int | str | None = None
    constraint: str | None = None
    options: Sequence[str] = ()
    pending_timeout: float = 600
    max_poll_interval: float = 30.0
    gres: str | None = None
    max_duration: float | None = None
    install: Install = "wheelhouse"
    known_hosts: str | None = None
    submit: Literal["sbatch", "srun"] = "sbatch"
    kind: ClassVar[str] = "slurm"
    serve_on_private_ip: ClassVar[bool] = True  # (streams come through the login node)
    _host: tuple[str | None, str, int | None] = field(init=False, repr=False, compare=False, default=(None, "", None))

    def __post_init__(self) -> None:
        if not isinstance(self.login, str) or not self.login.strip():
            raise ConfigError("sky.Slurm(login=...) names the cluster's login node: 'login.hpc.example.edu', "
                              "'me@login.hpc.example.edu' or 'me@login:2222'.")
        m = re.fullmatch(r"(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:@\s]+))(?::(?P<port>\d+))?",
                         self.login.strip())
        if not m:
            raise ConfigError(f"sky.Slurm(login={self.login!r}): not a host; write 'host', 'user@host' or "
                              f"'user@host:port'.")
        port = int(m["port"]) if m["port"] else self.port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
            raise ConfigError(f"sky.Slurm: port {port!r} is not a TCP port (1..65535; sshd listens on 22).")
        object.__setattr__(self, "_host", (m["user"] or self.user, m["v6"] or m["host"], port))
        for name in ("partition", "account", "qos", "constraint", "gres"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not re.fullmatch(r"[^\s'\"\\;|&$`<>]*", value)
                                      or (not value and name != "gres")):
                raise ConfigError(f"sky.Slurm({name}={value!r}) is not valid: a name as Slurm writes it "
                                  f"(no spaces or shell characters), e.g. {name}='gpu'.")
        q.check_time(self.time, "sky.Slurm(time")
        q.check_time(self.max_duration, "sky.Slurm(max_duration")
        object.__setattr__(self, "options", q.check_options(self.options))
        if isinstance(self.pending_timeout, bool) or not isinstance(self.pending_timeout, int | float) \
                or self.pending_timeout <= 0:
            raise ConfigError(f"sky.Slurm(pending_timeout={self.pending_timeout!r}) is not valid: seconds > 0 "
                              f"that a job may wait in the queue.")
        if isinstance(self.max_poll_interval, bool) or not isinstance(self.max_poll_interval, int | float) \
                or self.max_poll_interval <= 0:
            raise ConfigError(f"sky.Slurm(max_poll_interval={self.max_poll_interval!r}) is not valid: seconds > 0 "
                              f"between looks at a job waiting in the queue.")
        if self.submit not in ("sbatch", "srun"):
            raise ConfigError(f"sky.Slurm(submit={self.submit!r}) is not valid: 'sbatch' (a batch job, the default) "
                              f"or 'srun' (an interactive job: starts at once, held by srun on the login node).")
        if self.install not in ("wheelhouse", "index"):
            raise ConfigError(f"sky.Slurm(install={self.install!r}) is not valid: use 'wheelhouse' or 'index'.")
        if self.jump is not None and (not isinstance(self.jump, str) or not self.jump.strip()):
            raise ConfigError(f"sky.Slurm(jump={self.jump!r}): a jump host is written 'user@bastion[:port]'.")

    # -- the provider API ----------------------------------------------------------------------
    def check(self, spec: Spec) -> str | None:
        if spec.volumes:
            from skyward.volumes import Volume

            if not all(isinstance(v, Volume) for v in spec.volumes):
                return "sky.Disk applies to cloud providers only (a Slurm site's nodes keep their own disks)"
            if any(v.storage is None for v in spec.volumes):
                return "give each sky.Volume a storage=, e.g. sky.storage.S3(region='us-east-1')"
        try:
            q.gpu_flag(spec, self.gres)
        except ConfigError as exc:
            return str(exc)
        return q.spec_conflicts(self.options, spec)

    def hourly_cost(self, spec: Spec) -> float | None:
        return 0.0  # the site's allocation, not dollars

    def flags(self, spec: Spec, gres_types: Sequence[str] = ()) -> tuple[str, ...]:
        """The sbatch flags of every job of a pool of ``spec`` (beside nodes, name and output);
        ``gres_types``: the GRES types sinfo shows, whose spelling the GPU request takes."""
        out = []
        for flag, value in (("--partition", self.partition), ("--account", self.account), ("--qos", self.qos),
                            ("--constraint", self.constraint)):
            if value:
                out.append(f"{flag}={value}")
        limit = q.check_time(self.time if self.time is not None else self.max_duration, "sky.Slurm(time")
        if limit:
            out.append(f"--time={limit}")
        gpus = q.gpu_flag(spec, self.gres, gres_types)
        if gpus:
            out.append(gpus)
        if spec.vcpus:
            out.append(f"--cpus-per-task={int(-(-spec.vcpus // 1))}")
        if spec.memory_gb:
            out.append(f"--mem={int(-(-spec.memory_gb * 1024 // 1))}M")
        return (*out, *self.options)

    def target(self) -> Any:
        from skyward.bootstrap.remote import Target

        user, host, port = self._host
        return Target(host, port, user, self.key, jump=self.jump, known_hosts=self.known_hosts)

    def create(self, spec: Spec, pool_id: str, options: Options | None = None, name: str | None = None,
               pin: tuple[pkglock.Package, ...] | None = None) -> SlurmCluster:
        return SlurmCluster(spec, pool_id, self, options=options, pin=pin)

    # -- offers: the partitions, from sinfo on the login node -------------------------------------
    def partitions(self) -> list[q.Partition]:
        """The cluster's partitions as ``sinfo`` shows them now (one SSH command on the login node)."""
        _, out = self._on_login(f"sinfo -h -N -o {shlex.quote(q.SINFO_FORMAT)}", phase="sinfo")
        return q.parse_sinfo(out)

    def _on_login(self, command: str, *, phase: str, retry_for: float = 30.0, check: bool = True) -> tuple[int, str]:
        """One command on the login node, on a connection of its own."""
        from skyward.bootstrap.remote import Remote

        remote = Remote(self.target(), connect_timeout=min(10.0, retry_for), retry_for=retry_for,
                        label=f"login node {self._host[1]}")
        remote.open()
        try:
            return remote.run(command, timeout=60, phase=phase, check=check)
        finally:
            remote.close()

    def live_offers(self, want: Any) -> list[Any]:
        """sky.offers(provider=sky.Slurm(...)): one offer per partition that fits ``want``
        (accelerator, vcpus, memory per node), the default partition first; price 0 (the site's
        allocation, not dollars); ``extra`` says how many nodes it has and how many are idle."""
        return [q.offer(p, self._host[1]) for p in q.fitting(self.partitions(), want)]

    def choose_partition(self, spec: Spec, parts: list[q.Partition] | None = None) -> str | None:
        """The partition for a spec that asks for GPUs, CPUs or memory and names none (None: the
        cluster's default partition will do); ``parts``: sinfo's, if already asked."""
        if self.partition or not (spec.accelerator or spec.vcpus or spec.memory_gb):
            return self.partition
        parts = self.partitions() if parts is None else parts
        fit = q.fitting(parts, spec)
        if not fit:
            listed = "; ".join(q.describe(p) for p in parts) or "none"
            raise ProviderError(
                f"no partition of {self._host[1]} has nodes with what the pool asks for "
                f"({q.asked(spec)}); its partitions: {listed}. Ask for less, or name one with partition=.")
        return fit[0].name

    # -- named pools ---------------------------------------------------------------------------
    def attach(self, description: dict[str, Any]) -> SlurmCluster:
        return SlurmCluster.from_description(description)

    def destroy(self, description: dict[str, Any]) -> None:
        SlurmCluster.from_description(description).close()

    # -- the registry's view of a described pool: its jobs in the queue ------------------------
    def jobs(self, description: dict[str, Any]) -> list[dict[str, Any]]:
        """A described pool's jobs as the queue shows them now: id, state, Slurm's reason, its
        node list, and the pool's nodes it brings (host names and ranks). A job gone from the
        queue is ``GONE`` (it ended more than MinJobAge ago). Raises ProviderError when the
        login node cannot be asked."""
        states = self._queue(description)
        out = []
        for job in description.get("jobs") or {}:
            nodes = [n for n in description.get("nodes", []) if str(n.get("job")) == str(job)]
            state = states.get(str(job))
            out.append({"job": str(job), "state": state.state if state else "GONE",
                        "reason": state.reason if state else "", "nodelist": state.nodelist if state else "",
                        "nodes": [n.get("hostname") for n in nodes], "pool_nodes": [int(n["index"]) for n in nodes]})
        return out

    def alive(self, description: dict[str, Any]) -> bool | None:
        """By the jobs' state in the queue (one squeue on the login node, shared with
        ``nodes_alive`` and ``jobs`` for a few seconds): True while a job of the pool runs,
        False when all have ended or left the queue, None when the login node cannot be asked."""
        try:
            states = self._queue(description)
        except ProviderError:
            return None
        jobs = [states.get(str(j)) for j in description.get("jobs") or {}]
        if not jobs:
            return None if description.get("nodes") else False
        return any(s is not None and not s.ended for s in jobs)

    def nodes_alive(self, description: dict[str, Any]) -> list[bool | None]:
        try:
            states = self._queue(description)
        except ProviderError:
            return [None for _ in description.get("nodes", [])]
        return [(s := states.get(str(n.get("job")))) is not None and s.state in ("RUNNING", "COMPLETING")
                for n in description.get("nodes", [])]

    def accounting(self, description: dict[str, Any]) -> dict[str, Any]:
        """What a described pool's jobs used, asked once they ended (`skyward down` puts it in the
        pool's record and its trail): each job's state, elapsed time, CPUs, GPUs, CPU and GPU
        hours and nodes, from ``sacct`` where the site keeps accounting. Where it does not
        (``AccountingStorageType=accounting_storage/none``: sacct says so), the same figures come
        from the controller's memory of the jobs (``scontrol show job``, kept MinJobAge after
        they end), and ``accounting`` says that sacct had none and why."""
        jobs = sorted({str(j) for j in description.get("jobs") or {}} | {str(j) for j in description.get("ended_jobs") or []},
                      key=lambda j: (len(j), j))
        if not jobs:
            return {"jobs": {}, "accounting": "no job"}
        listed = ",".join(jobs)
        command = (f"sacct -X -P -n -j {listed} -o {q.SACCT_FORMAT} 2>&1; echo \"@@sacct $?\"; "
                   f"for j in {' '.join(jobs)}; do echo \"@@job $j\"; scontrol show job -o \"$j\" 2>&1; done")
        # Asked right after the jobs were cancelled: a job still on its way out (COMPLETING) has
        # neither its final state nor its final time yet, so it is asked again, for up to 15 s.
        until = time.monotonic() + 15.0
        while True:
            try:
                _, out = self._on_login(command, phase="sacct", retry_for=10.0, check=False)
            except Exception as exc:
                return {"jobs": {j: {} for j in jobs},
                        "accounting": f"unknown: the login node could not be asked ({exc})"}
            used, how = _usage(out, listed)
            if time.monotonic() > until or not any(
                    str(u.get("state", "")).split(" ")[0] in q.PASSING for u in used.values()):
                break
            time.sleep(1.0)
        out_jobs = {}
        for j in jobs:
            info = (description.get("jobs") or {}).get(j) or {}
            out_jobs[j] = {"usage": used.get(j), "pool_nodes": info.get("nodes"), "script": info.get("script")}
        return {"jobs": out_jobs, "accounting": how,
                "cpu_hours": round(sum(u["cpu_hours"] for u in used.values()), 4),
                "gpu_hours": round(sum(u["gpu_hours"] for u in used.values()), 4),
                "elapsed_seconds": max((u["elapsed_seconds"] for u in used.values()), default=0)}

    def _queue(self, description: dict[str, Any]) -> dict[str, q.JobState]:
        """Each of a described pool's jobs as the controller knows it (``GONE`` once it no longer
        does, confirmed): raises ProviderError when that cannot be told (squeue failed at each of
        a few tries, the login node unreachable), which callers read as "unknown", never "ended"."""
        from skyward.bootstrap.remote import Remote

        jobs = tuple(sorted({str(j) for j in description.get("jobs") or {}}
                            | {str(n.get("job")) for n in description.get("nodes", []) if n.get("job")}))
        if not jobs:
            return {}
        key = (self._host, jobs)
        with _LOOKS_LOCK:
            seen = _LOOKS.get(key)
            if seen is not None and time.monotonic() - seen[0] < _LOOK_FOR:
                if isinstance(seen[1], BaseException):
                    raise seen[1]
                return seen[1]
        remote: Remote | None = None

        def run(command: str) -> tuple[int, str]:
            nonlocal remote
            if remote is None:
                remote = Remote(self.target(), connect_timeout=5.0, retry_for=5.0,
                                label=f"login node {self._host[1]}")
                try:
                    remote.open()
                except BaseException:
                    remote = None
                    raise
            try:
                return remote.run(command, timeout=60, phase="squeue", check=False)
            except BaseException:
                remote.close()
                remote = None
                raise

        try:
            states: dict[str, q.JobState] | BaseException = _look(
                run, jobs, patience=_DESCRIBED_PATIENCE, where=self._host[1], shared=queue_of(self._host),
                max_age=_LOOK_FOR)
        except ProviderError as exc:
            states = exc
        finally:
            if remote is not None:
                remote.close()
        with _LOOKS_LOCK:
            _LOOKS[key] = (time.monotonic(), states)
        if isinstance(states, BaseException):
            raise states
        return states


# squeue looks of described pools, reused for a few seconds: `skyward ls` asks alive, nodes_alive
# and jobs of each Slurm pool, one connection to the login node for the three.
_LOOK_FOR = 5.0
_LOOKS: dict[tuple[Any, ...], tuple[float, dict[str, q.JobState] | BaseException]] = {}
_LOOKS_LOCK = threading.Lock()
# A failed look is tried again after these pauses (seconds), for as long as the caller's patience.
_BACKOFF = (1.0, 2.0, 4.0, 8.0, 15.0)
_DESCRIBED_PATIENCE = 8.0  # `skyward ls`/`status` and the registry: then "unknown" (the ttl decides)


def _look(run: Any, jobs: Sequence[str], *, patience: float, where: str,
          sleep: Any = time.sleep, shared: SharedQueue | None = None, max_age: float = 0.0) -> dict[str, q.JobState]:
    """Each of ``jobs`` as the controller knows it: squeue, and for a job an answering squeue
    does not list, ``scontrol show job`` and sacct (a state such as CANCELLED or TIMEOUT, or
    ``GONE`` when neither knows it any more). A look that fails (squeue's non-zero status, the
    login node unreachable) is tried again with backoff for ``patience`` seconds; then this raises
    ProviderError with squeue's status and words: the jobs' state is unknown, and nothing may be
    ended on it. ``run(command) -> (status, output)`` runs a command on the login node. With
    ``shared``, the first look is the process's shared one of the user's jobs (an answer at most
    ``max_age`` old); a look after a failure is a new one."""
    started = time.monotonic()
    error = ""
    for attempt in range(len(_BACKOFF) + 1):
        try:
            if shared is not None:
                look = shared.look(run, max_age=max_age if attempt == 0 else 0.0)
            else:
                look = q.parse_look(run(q.squeue_command(jobs))[1])
            if look.error is None:
                missing = [j for j in jobs if j not in look.states]
                if not missing:
                    return look.states
                confirmed, unknown = q.parse_confirm(run(q.confirm_command(missing))[1], missing)
                if not unknown:
                    return {**look.states, **confirmed}
                error = "; ".join(f"job {j}: {why}" for j, why in unknown.items())
            else:
                error = look.error
        except Exception as exc:
            error = f"the login node could not be asked ({exc})"
        pause = _BACKOFF[min(attempt, len(_BACKOFF) - 1)]
        if attempt >= len(_BACKOFF) or time.monotonic() - started + pause > patience:
            break
        log.info("Slurm on %s: looking at jobs %s failed (%s); trying again in %g s", where, ",".join(jobs),
                 error, pause)
        sleep(pause)
    raise ProviderError(
        f"Slurm on {where} could not say where jobs {', '.join(jobs)} stand ({error}; tried for "
        f"{time.monotonic() - started:.0f} s): their state is unknown, so nothing was ended on it.")


@dataclass
class _Node:
    index: int
    job: str
    endpoint: NodeEndpoint | None = None
    hostname: str = ""
    slurm_node: str = ""  # Slurm's name of the node (SLURMD_NODENAME): srun --nodelist takes it
    address: str = ""
    port: int = 0  # the agent's direct port on the node's private address
    agent_pid: int = 0
    agent_id: str = ""  # the agent's identity, from its start-up line (NodeEndpoint.agent_id)
    stopped: bool = False
    facts: dict[str, Any] = field(default_factory=dict)


class SlurmCluster(Cluster):
    """A pool's jobs on one Slurm cluster, all reached through one SSH connection to its login node."""

    def __init__(self, spec: Spec, pool_id: str, provider: Slurm, *, options: Options | None = None,
                 pin: tuple[pkglock.Package, ...] | None = None) -> None:
        self.spec = spec
        self.pool_id = pool_id
        self.provider = provider
        self.token = secrets.token_urlsafe(32)
        self.head_port = random.randrange(20000, 30000)
        self.interface = "eth0"
        self.spill_dir = None
        self.table: NodeTable[_Node] = NodeTable()
        self._lock = self.table.lock
        self._connecting = threading.Lock()  # one (re)connection to the login node at a time
        self._remote: Remote | None = None
        self._closed = False
        self._partition: str | None = None  # chosen from sinfo when the spec asks for GPUs/CPUs/memory
        self._ready = False  # the shipment is on the shared home
        self._build: threading.Thread | None = None  # the environment, built on the login node
        self._build_error: BaseException | None = None
        self._parts: list[q.Partition] | None = None  # sinfo's partitions, asked once per pool
        self._said_cpus = False
        self._started_once = False  # some job's agents listened: a failed build on the login node did not matter
        self._jobs: dict[str, dict[str, Any]] = {}  # job id -> {"nodes": [...], "script": ...}
        self._ended: list[str] = []  # jobs the pool cancelled while it ran on (shrunk, healed): accounted at down
        # Why the pool ends rather than heals (a job of it cancelled, or past its time limit):
        # every replacement and every new job is refused with it (issue 45, item 3).
        self._ended_by: str | None = None
        self._lost_to: dict[int, q.JobState] = {}  # a replaced node's job as it ended (preempted())
        self.sky = ""  # skyward's folder in the (shared) home
        self.folder = ""  # the pool's folder there: scripts, the nodes' logs and where they listen
        self.login_pool = ""  # the login node's own folder of the pool (its env.sh, while it builds)
        self.login_address = ""
        o = options
        self._ssh_timeout = float(o.ssh_timeout) if o is not None and o.ssh_timeout else 60.0
        self._bootstrap_timeout = float(
            o.bootstrap_timeout if o is not None and o.bootstrap_timeout else spec.image.bootstrap_timeout)
        self._ttl = spec.ttl
        self._pin = pin  # reproducing a pool: install its recorded packages
        self._ship: ship.Shipment | None = None
        self._agent_python = ""  # the agent's interpreter, relative to self.sky (a described pool's)
        self._relay = False  # the login node forbids TCP forwarding: agents are reached through a relay
        self._forwarding = False  # a direct-tcpip channel to an agent has opened: forwarding works
        self._forwarding_lock = threading.Lock()
        self.apt_versions: dict[str, str] = {}

    @property
    def _nodes(self) -> dict[int, _Node]:
        """The nodes submitted or handed out (the table's, under ``_lock``)."""
        return self.table.nodes

    # -- the login node ------------------------------------------------------------------------
    def _login(self) -> Remote:
        from skyward.bootstrap.remote import Remote

        with self._connecting:
            with self._lock:
                if self._closed:
                    raise ProviderError(f"pool {self.pool_id} is closed: its Slurm jobs were cancelled")
                remote = self._remote
            if remote is not None:
                if _connected(remote):
                    return remote
                # The session dropped (a login node's sshd restarted, a network blip): connect again
                # within ssh_timeout; the tunnels to the agents are reopened through the new one
                # (issue 45, item 2: ``replace`` finds the same agents there).
                log.warning("Slurm pool %s: the connection to %s dropped; connecting again (ssh_timeout=%gs)",
                            self.pool_id, remote.label, self._ssh_timeout)
                try:
                    remote.close()
                except Exception:
                    pass
            target = self.provider.target()
            remote = Remote(target, connect_timeout=min(10.0, self._ssh_timeout), retry_for=self._ssh_timeout,
                            label=f"login node {target.host}")
            remote.open()
            with self._lock:
                self._remote = remote
            return remote

    def _python(self) -> str:
        """The agent's interpreter, relative to ``self.sky`` ("" when not known yet)."""
        return self._ship.agent_python if self._ship is not None else self._agent_python

    def _try_login(self) -> None:
        try:
            self._login()
        except BaseException:  # the caller's own _login() connects again and raises it
            pass

    def _run(self, command: str, *, stdin: bytes | None = None, timeout: float = 60,
             check: bool = True, phase: str = "slurm") -> tuple[int, str]:
        return self._login().run(command, stdin=stdin, timeout=timeout, check=check, phase=phase)

    def _sinfo(self) -> list[q.Partition]:
        """The cluster's partitions, asked once per pool on its connection ([] when sinfo fails:
        the job goes without what they would add)."""
        if self._parts is None:
            code, out = self._run(f"sinfo -h -N -o {shlex.quote(q.SINFO_FORMAT)}", check=False, phase="sinfo")
            self._parts = q.parse_sinfo(out) if code == 0 else []
        return self._parts

    def _partition_facts(self, parts: list[q.Partition]) -> q.Partition | None:
        return q.partition_named(parts, self._partition or self.provider.partition)

    def _explain(self, nodes: int) -> str:
        """Slurm's refusal in the pool's own terms, or "" (nothing to add to Slurm's words)."""
        try:
            why = q.explain_refusal(self._sinfo(), partition=self._partition or self.provider.partition,
                                    nodes=nodes, time_limit=q.check_time(
                                        self.provider.time if self.provider.time is not None
                                        else self.provider.max_duration, "time"), spec=self.spec)
        except Exception:  # the explanation is a courtesy: the refusal itself must come out
            why = None
        return why or ""

    # -- preparing (once per pool) -----------------------------------------------------------------
    def _prepare(self) -> None:
        """The shipment on the shared home and the pool's folder there; the environment starts
        building on the login node (in the background: the job's wait in the queue overlaps it)."""
        from skyward.bootstrap.script import node_dirs_command

        with self._lock:
            if self._ready:
                return
        if self._ship is None:
            # The login (a key exchange and its round trips) goes on while the shipment is built here
            # (a resolution of the pinned requirements, reused from the client's cache when fresh);
            # _login below waits for it, or connects again after a failure and raises its error.
            threading.Thread(target=self._try_login, name="skyward-slurm-login", daemon=True).start()
            image, ops = self._final_image()
            self._ship, self.package_lock = ship.build(
                self.spec, image, ops, pool_id=self.pool_id, install=self.provider.install, kind="slurm",
                pin=self._pin, platform=None if self.provider.install == "wheelhouse" else resolver.node_platform(None),
                on_phase=lambda node, phase, status, seconds: self._phase(node, phase, status, seconds),
                reuse_lock=True)
        remote = self._login()
        s = self._ship
        _, out = remote.run(node_dirs_command(self.pool_id, 0, sudo=False) + _LOGIN_FACTS, phase="connect")
        facts = ship.facts(out)
        if facts.get("sinfo") == "0" and self._parts is None:
            self._parts = q.parse_sinfo("\n".join(ln[8:] for ln in out.splitlines() if ln.startswith("%%sinfo ")))
        self.sky = facts["sky"]
        self.login_pool = f"{facts['run']}/pools/{self.pool_id}-login"
        self.folder = f"{self.sky}/slurm/{self.pool_id}"
        self.login_address = facts.get("address", "") or remote.host
        self._phase(-1, "upload", "started")
        t0 = time.monotonic()
        remote.upload([(p, *s.files[p]) for p in remote.missing(s.sizes, self.sky)], self.sky)
        mine: list[tuple[str, Any, int]] = [
            ("bootstrap.sh", s.script.encode(), 0o600),
            ("node.sh", self._node_script().encode(), 0o700),
            # The pool's secret, for the agents: a 0600 file in the pool's 0700 folder, read by each
            # node's script into a shell variable. Never in the job's environment: Slurm keeps that
            # in the controller's state and, with AccountingStoreFlags=job_env, in slurmdbd, where
            # `sacct --env-vars` shows it for as long as the site keeps accounting.
            ("token", (self.token + "\n").encode(), 0o600),
        ]
        if s.includes is not None:
            mine.append(("includes.tar", s.includes, 0o600))
        if s.volumes_conf is not None:
            mine.append(("rclone.conf", s.volumes_conf, 0o600))
        remote.run(f"mkdir -p -m 700 {shlex.quote(self.folder)}", phase="upload")
        remote.upload(mine, self.folder)
        self._phase(-1, "upload", "done", time.monotonic() - t0)
        self._build = threading.Thread(target=self._build_on_login, name="skyward-slurm-env", daemon=True)
        self._build.start()
        with self._lock:
            self._ready = True

    def _final_image(self) -> tuple[Image, tuple[str, ...]]:
        if not self.spec.plugins:
            return self.spec.image, ()
        from skyward.plugins.compose import prepare

        return prepare(self.spec, self)

    def _build_on_login(self) -> None:
        """The shared phases of the bootstrap (uv, Python, the environment, skyward) on the login
        node: the compute nodes find them done. The node-local phases (apt, plugin ops, volumes)
        are the nodes' own."""
        from skyward.bootstrap import script
        from skyward.bootstrap.progress import PhaseReader

        assert self._ship is not None
        try:
            text = _shared_phases(self._ship.script)
            where = (f"SKYWARD_SKY={shlex.quote(self.sky)} SKYWARD_RUN={shlex.quote(self.login_pool.rsplit('/pools/', 1)[0])} "
                     f"SKYWARD_POOL={shlex.quote(self.login_pool)}")
            progress = PhaseReader(-1, self._phase, label="login ")

            def on_line(line: str) -> None:
                progress.feed(line)

            self._login().run(script.bash_on_stdin(text, where), stdin=text.encode(),
                              timeout=self._bootstrap_timeout, on_line=on_line, phase="bootstrap")
        except BaseException as exc:
            # The nodes would run the same phases on the same shared home and fail the same way
            # (no Python X.Y, a resolution error): the job waiting for them fails at once with this
            # (``_wait``), rather than at pending_timeout or at its nodes' bootstrap (issue 45, item 7).
            log.warning("building the environment on the login node failed: %s", exc)
            self._build_error = exc

    def _node_script(self) -> str:
        """What srun runs on each node (argument: the pool's index of the job's first node)."""
        assert self._ship is not None
        return _NODE_SCRIPT.format(
            folder=shlex.quote(self.folder), sky=shlex.quote(self.sky), pool=self.pool_id,
            python=self._ship.agent_python, ttl=self._ttl, login=shlex.quote(self.login_address),
            timeout=_AGENT_START_TIMEOUT * 20, hold=hold_pool(), run=run_folder("$(id -u)"))

    # -- the Cluster API ---------------------------------------------------------------------------
    def start(self, count: int) -> list[NodeEndpoint]:
        return self.table.start(count, reconnect=self._reconnect, together=self._begin, release=self._release)

    def start_each(self, count: int) -> Iterator[NodeEndpoint | BaseException]:
        """As ``start``: all of a start's new nodes are one job's, and come up together."""
        return self.table.start_each(count, reconnect=self._reconnect, together=self._begin, release=self._release)

    def _begin(self, count: int) -> tuple[list[_Node], Callable[[list[_Node]], list[NodeEndpoint]]]:
        """``count`` new nodes, claimed once the shipment is on its way; one job brings them up."""
        with self._lock:
            if self._ended_by is not None:
                raise ProviderError(self._ended_by)
        self._prepare()
        return self.table.claim(count, lambda i: _Node(i, "")), self._submit

    def _release(self, nodes: list[_Node]) -> None:
        """A failed start's nodes: their job (if Slurm took it) is cancelled, the table forgets them."""
        self._cancel(sorted({n.job for n in nodes if n.job}))
        self.table.forget(nodes)

    def _submit(self, nodes: list[_Node]) -> list[NodeEndpoint]:
        """One job for these nodes; back when every node's agent listens."""
        first, count = nodes[0].index, len(nodes)
        parts = self._sinfo()
        # The site's own spelling of the GPU type (sinfo's GRES): Slurm's types are case-sensitive.
        gres_types = sorted({k for p in parts for k, _ in p.gpus})
        flags = self.provider.flags(self.spec, gres_types)
        if self._partition is None:
            self._partition = self.provider.choose_partition(self.spec, parts) or ""
        if self._partition and self._partition != self.provider.partition:
            flags = (f"--partition={self._partition}", *flags)
        cpus = q.default_cpus(self._partition_facts(parts), self.spec, self.provider.options)
        if cpus is not None:
            flags = (*flags, f"--cpus-per-task={cpus}")
            if not self._said_cpus:
                self._said_cpus = True
                log.info("Slurm pool %s: each node's job asks for %d CPUs (the partition's nodes' share; "
                         "vcpus= not given): give sky.Compute(vcpus=N) to ask for fewer", self.pool_id, cpus)
        request = q.JobRequest(name=f"skyward-{self.pool_id}"[:64], nodes=count, first=first, folder=self.folder,
                               flags=flags)
        if self.provider.submit == "srun":
            text = request.launcher(f"{self.folder}/node.sh")
            name = f"job-{first}.srun"
            self._login().upload([(name, text.encode(), 0o600)], self.folder)
            code, out = self._run(f"cd {shlex.quote(self.folder)} || exit 3; {q.srun_start(name, f'job-{first}.out')}",
                                  check=False, phase="srun")
            job = out.strip().splitlines()[-1].strip() if code == 0 and out.strip() else ""
        else:
            text = request.script(f"{self.folder}/node.sh")
            name = f"job-{first}.sbatch"
            self._login().upload([(name, text.encode(), 0o600)], self.folder)
            code, out = self._run(f"cd {shlex.quote(self.folder)} && sbatch --parsable {name}", check=False,
                                  phase="sbatch")
            job = out.strip().splitlines()[-1].split(";")[0].strip() if code == 0 and out.strip() else ""
        if code != 0 or not job.isdigit():
            never = q.never_runs(out)
            why = self._explain(count) if never else ""
            raise ProviderError(
                f"Slurm refused the pool's job on {self._login().label}: {never or out.strip()[-600:]}"
                + (f" ({why}). This cluster can never run it as asked." if why else ". " + ("This cluster can never run it as asked: change partition=, account=, qos=, nodes= or "
                   "accelerator= to what `sinfo` shows"
                   + (" (or name the site's GRES type with sky.Slurm(gres=...), as `sinfo -o %G` spells it)."
                      if "generic resource" in never or "Trackable RESource" in never else ".") if never else
                   f"The {'launcher' if name.endswith('.srun') else 'batch script'} is {self.folder}/{name}; "
                   f"try `{'bash' if name.endswith('.srun') else 'sbatch'}` of it by hand on the login node."))
            )
        indices = [n.index for n in nodes]
        with self._lock:
            self._jobs[job] = {"nodes": indices, "script": text, "submitted": time.time()}
            for n in nodes:
                n.job = job
        return self._wait(job, indices)

    def _wait(self, job: str, indices: list[int]) -> list[NodeEndpoint]:
        """Watch the job in the queue (events on each change), then its nodes' bootstrap; fail
        after ``pending_timeout`` in the queue, or when the job ends before its agents listen."""
        submitted = time.monotonic()
        started: float | None = None
        last: tuple[str, str] = ("", "")
        seen: dict[int, int] = {i: 0 for i in indices}  # log lines already turned into events
        progress = {i: self._progress(i) for i in indices}
        ready: dict[int, dict[str, Any]] = {}
        files = " ".join(str(i) for i in indices)
        # What the nodes have written so far, in one word: their logs' bytes and how many hellos.
        sig = (f"sig() {{ echo \"$(cat {' '.join(f'node-{i}.log' for i in indices)} 2>/dev/null | wc -c)"
               f"/$(ls {' '.join(f'node-{i}.json' for i in indices)} 2>/dev/null | wc -l)\"; }}; ")
        after = f"for i in {files}; do echo \"@@@log $i\"; cat node-$i.log 2>/dev/null; " \
                f"echo \"@@@hello $i $(cat node-$i.json 2>/dev/null)\"; done; echo \"@@@sig $(sig)\""
        written = ""  # the nodes' files as the last look saw them (sig)
        failed = 0  # looks in a row at which squeue gave no answer
        state: q.JobState | None = None
        pause = 0.0
        queue = queue_of(self.provider._host)
        logs: dict[int, list[str]]
        hellos: dict[int, dict[str, Any]]
        while True:
            if started is None and state is not None and state.state == "PENDING":
                # Waiting in the queue: nothing on the nodes to read yet, and the job's state comes
                # from the look this process's pools share (one squeue for all that wait; issue 45,
                # item 5), no older than this pool's own pause, nor than its job.
                seen_now = queue.look(lambda c: self._run(c, check=False, phase="squeue"),
                                      max_age=min(pause, time.monotonic() - submitted))
                logs, hellos = {}, {}
            else:
                # Once the job runs, the look waits on the login node (up to 1 s, 50 ms apart, no
                # RPC) for the nodes to write something new: their bootstrap's lines and agents'
                # hellos are seen within 50 ms, with about one squeue a second while nothing moves.
                wait = (f"S0={shlex.quote(written)}; for _ in $(seq 1 20); do [ \"$(sig)\" != \"$S0\" ] && break; "
                        f"sleep 0.05; done; ") if started is not None else ""
                _, out = self._run(f"cd {shlex.quote(self.folder)} || exit 3; {sig}{wait}{q.squeue_command([job])}; "
                                   f"{after}", check=False, phase="squeue")
                seen_now, logs, hellos = _parse_look(out, job)
                found = re.search(r"^@@@sig (\S*)$", out, re.M)
                written = found.group(1) if found else ""
            now = time.monotonic()
            if seen_now.error is not None:
                # No answer is no news: the job is where it was (issue 45, item 1); look again, slower.
                failed += 1
                if failed in (1, 5) or failed % 20 == 0:
                    log.warning("Slurm job %s: squeue failed (%s); looking again", job, seen_now.error)
            else:
                failed = 0
                state = seen_now.states.get(job)
                if state is None:  # an answer without the job: the controller's own record says how it ended
                    try:
                        state = _look(lambda c: self._run(c, check=False, phase="squeue"), [job],
                                      patience=self._ssh_timeout, where=self._login().label)[job]
                    except ProviderError as exc:  # unknown still: look again
                        seen_now = q.Look({}, str(exc))
                        failed += 1
            if state is not None and (state.state, state.reason) != last:
                last = (state.state, state.reason)
                ev.bus.emit(ev.JobQueued(pool=self.pool_id, job=job, state=state.state, reason=state.reason,
                                         nodes=tuple(indices), seconds=now - submitted))
            if state is not None and state.state != "PENDING" and started is None:
                started = now
            for i, lines in logs.items():
                for line in lines[seen[i]:]:
                    progress[i].feed(line)
                seen[i] = len(lines)
            for i, hello in hellos.items():
                if i not in ready and hello:
                    if "error" in hello:
                        raise self._node_failed(i, job, logs.get(i, []), hello)
                    ready[i] = hello
            if len(ready) == len(indices):
                break
            build = self._build_error
            if build is not None and not ready and not self._started_once:
                raise ProviderError(
                    f"building the pool's environment on the login node failed, so its nodes cannot "
                    f"start; Slurm job {job} was cancelled. {build}")
            if state is not None and state.ended and seen_now.error is None:
                raise self._job_ended(job, state, logs)
            never = q.never_reason(state.reason) if state is not None and state.state == "PENDING" else None
            if never is not None and state is not None:
                why = self._explain(len(indices))
                raise ProviderError(
                    f"Slurm job {job} can never start as asked: it is PENDING with reason {state.reason} "
                    + (f"({why}); it was cancelled. This cluster can never run it as asked." if why else
                       f"({never}); it was cancelled. This cluster can never run it as asked: change "
                       f"partition=, nodes=, accelerator=, vcpus=, memory_gb= or time= to what `sinfo` shows "
                       f"(sky.offers(provider=sky.Slurm(...)) lists the partitions).")
                )
            if started is None and now - submitted > self.provider.pending_timeout:
                raise ProviderError(
                    f"Slurm job {job} waited {self.provider.pending_timeout:g} s in the queue "
                    f"(pending_timeout) and is still "
                    f"{f'PENDING, reason {state.reason}' if state is not None else 'not known to have started'}"
                    f"{f' (squeue fails: {seen_now.error})' if seen_now.error else ''}; it was cancelled. "
                    f"`squeue -j {job}` on the login node said why; raise sky.Slurm(pending_timeout=...), ask "
                    f"for fewer nodes or another partition, or try when the cluster is quieter."
                )
            if started is not None and now - started > self._bootstrap_timeout + _AGENT_START_TIMEOUT:
                missing = sorted(set(indices) - set(ready))
                raise ProviderError(
                    f"Slurm job {job} runs, but node(s) {missing} did not start their agent within "
                    f"bootstrap_timeout={self._bootstrap_timeout:g} s; their logs are {self.folder}/node-N.log.")
            # While the job starts, the next look waits on the login node (above); while it waits
            # in the queue, slower and slower (issue 45, item 5: each look is an RPC to slurmctld).
            pause = min(_POLL * 2 ** failed, 10.0) if failed or started is None else 0.0
            if started is None:
                waited = now - submitted
                step = next((p for after, p in _PENDING_POLL if waited < after), _PENDING_POLL[-1][1])
                pause = max(pause, min(step, self.provider.max_poll_interval))
                pause = min(pause, max(_POLL, self.provider.pending_timeout - waited + _POLL))
            time.sleep(pause)
        self._started_once = True
        return [self._endpoint(i, job, ready[i]) for i in indices]

    def _progress(self, node: int) -> PhaseReader:
        """How node ``node``'s log lines are read: its phases as events, what apt installed on
        it into the pool's apt versions and lock."""
        from skyward.bootstrap.progress import PhaseReader

        return PhaseReader(node, self._phase, apt=self.apt_versions, lock=lambda: self.package_lock)

    def _endpoint(self, index: int, job: str, hello: dict[str, Any]) -> NodeEndpoint:
        with self._lock:
            node = self._nodes[index]
        node.hostname = str(hello.get("hostname") or hello.get("node") or "")
        node.slurm_node = str(hello.get("node") or node.hostname)
        node.address = str(hello["ip"])
        node.port = int(hello["agent"]["direct"])
        node.agent_pid = int(hello["agent"].get("pid") or 0)
        node.agent_id = str(hello["agent"].get("id") or "")
        node.facts = hello
        if index == min(self._nodes) and hello.get("interface"):
            self.interface = str(hello["interface"])
        node.endpoint = NodeEndpoint(index=index, private_ip=node.address, public_ip=None, hostname=node.hostname,
                                     connect=functools.partial(_tunnel, self, node.address, node.port),
                                     agent_id=node.agent_id)
        return node.endpoint

    def _node_failed(self, index: int, job: str, lines: list[str], hello: dict[str, Any]) -> BaseException:
        from skyward.bootstrap.script import parse_marker

        assert self._ship is not None
        phase = "bootstrap"
        code: int | None = None
        for line in lines:
            parsed = parse_marker(line)
            if parsed is not None and parsed[1] == "failed":
                phase, code = parsed[0], parsed[2]
        if hello.get("error") == "agent":
            _, tail = self._run(f"tail -n 20 {shlex.quote(self.folder)}/agent-{index}.log 2>/dev/null; true",
                                check=False)
            said = hello.get("hello")
            why = (f"listens on no private address the login node reaches ({said.get('direct_error')})"
                   if isinstance(said, dict) and said.get("direct_error") else
                   f"did not report its port within {_AGENT_START_TIMEOUT} s")
            return BootstrapError(host=f"node {index} ({hello.get('hostname', '?')}, Slurm job {job})", phase="agent",
                                  command="python -m skyward.bootstrap.agent_start", exit_code=None,
                                  output=tail.splitlines(), why=why)
        return BootstrapError(host=f"node {index} ({hello.get('hostname', '?')}, Slurm job {job})", phase=phase,
                              command=ship.phase_command(self._ship.script, phase), exit_code=code,
                              output=[ln for ln in lines if not ln.startswith("@@skyward")][-20:])

    def _job_ended(self, job: str, state: q.JobState | None, logs: dict[int, list[str]]) -> ProviderError:
        _, out = self._run(f"tail -n 15 {shlex.quote(self.folder)}/job-{job}.out 2>/dev/null; true", check=False)
        what = f"{state.state} (reason {state.reason})" if state is not None else "gone from the queue"
        tail = "\n".join(out.splitlines()[-15:])
        return ProviderError(
            f"Slurm job {job} ended before its nodes' agents started: {what}."
            + (f" Its output ({self.folder}/job-{job}.out) ends with:\n{tail}" if tail.strip() else
               f" It wrote no output at {self.folder}/job-{job}.out: do the compute nodes share the home "
               f"directory with the login node? sky.Slurm needs that, as Slurm sites have it.")
        )

    # -- a lost node: healed, or the end of the pool ----------------------------------------------
    def replace(self, lost: NodeEndpoint) -> NodeEndpoint:
        """A one-node job in place of a lost node, once its job's end says it may be replaced
        (``_why_lost``): never in place of a job the user or the site ended."""
        state = self._why_lost(lost.index)
        if state is not None and state.state.split()[0] == "RUNNING":
            again = self._same_agent(lost.index)
            if again is not None:
                return again
        return super().replace(lost)

    def _same_agent(self, index: int) -> NodeEndpoint | None:
        """Node ``index``'s agent, when it still listens (its job runs and the pool lost it with the
        connection to the login node, not with the node): the same agent under a new index, reached
        through the login node's connection as it is now (issue 45, item 2); it kept its lease.
        None when the login node cannot open a stream to it (the agent is gone)."""
        with self._lock:
            old = self._nodes.get(index)
        if old is None or not old.port or not old.address:
            return None
        try:
            if self._relay:  # a relay's channel opens whether or not the agent listens: ask the login node
                code, out = self._run(f"timeout 5 bash -c {shlex.quote(f'exec 3<>/dev/tcp/{old.address}/{old.port}')}",
                                      check=False, phase="probe")
                if code != 0:
                    raise ProviderError(out.strip() or f"exit {code}")
            else:
                self._login().tunnel(old.port, host=old.address).close()
        except Exception as exc:
            log.info("Slurm pool %s: node %d's agent at %s:%d does not answer (%s): a new node takes its place",
                     self.pool_id, index, old.address, old.port, exc)
            return None
        with self._lock:
            (node,) = self.table.claim_locked(1, lambda i: _Node(
                i, old.job, hostname=old.hostname, slurm_node=old.slurm_node, address=old.address, port=old.port,
                agent_pid=old.agent_pid, agent_id=old.agent_id, facts=old.facts))
            new = node.index
            self._nodes.pop(index, None)
            info = self._jobs.get(old.job)
            if info is not None:
                info["nodes"] = [new if i == index else i for i in info["nodes"]]
        node.endpoint = NodeEndpoint(index=new, private_ip=node.address, public_ip=None, hostname=node.hostname,
                                     connect=functools.partial(_tunnel, self, node.address, node.port),
                                     agent_id=node.agent_id)
        log.warning("Slurm pool %s: node %d's agent still runs in job %s: reconnected to it as node %d",
                    self.pool_id, index, old.job, new)
        return node.endpoint

    def _settled(self, job: str, *, within: float, patience: float, pause: float) -> q.JobState:
        """How ``job`` stands, looked at again every ``pause`` seconds for up to ``within`` seconds
        while it is on its way out (COMPLETING: how it ends is what counts); the last look when it
        has not settled by then. Raises ProviderError when the queue cannot say (``_look``)."""
        until = time.monotonic() + within
        while True:
            state = _look(lambda c: self._run(c, check=False, phase="squeue"), [job], patience=patience,
                          where=self._login().label)[job]
            if state.state.split()[0] not in q.PASSING or time.monotonic() > until:
                return state
            time.sleep(pause)

    def _why_lost(self, index: int) -> q.JobState | None:
        """How node ``index``'s job stands now. A node lost from a running job (its agent died), or
        whose job ended by NODE_FAIL, BOOT_FAIL, PREEMPTED, a requeue or a failure, may be
        replaced; one whose job was cancelled (scancel, by the user or an admin) or reached its
        time limit may not: that ends the pool (its other jobs are cancelled, so that every node
        goes) and this raises ProviderError naming the job and why, as every later replacement
        does. Raises ProviderError too while the job's state cannot be told (squeue failing):
        the pool tries again (Options.max_provision_attempts)."""
        with self._lock:
            if self._ended_by is not None:
                raise ProviderError(self._ended_by)
            node = self._nodes.get(index)
            job = node.job if node is not None else ""
            ours = bool(job) and job in self._jobs
        if not ours:
            return None  # a node of a job the pool ended itself (shrunk, healed), or none yet
        state = self._settled(job, within=max(30.0, self._ssh_timeout), patience=self._ssh_timeout, pause=1.0)
        base = state.state.split()[0]
        if base in q.PASSING:  # never replaced on a guess: it may have been cancelled
            raise ProviderError(f"Slurm job {job} is still {state.state}: how it ends decides whether "
                                f"node {index} is replaced")
        why = q.stops_the_pool(state)
        if why is None:
            with self._lock:
                self._lost_to[index] = state
            log.info("Slurm pool %s: node %d's job %s is %s (reason %s): replacing it", self.pool_id, index, job,
                     state.state, state.reason or "-")
            return state
        limit = f" (time={self.provider.time if self.provider.time is not None else self.provider.max_duration})" \
            if base in ("TIMEOUT", "DEADLINE") else ""
        message = (f"Slurm job {job} {why}{limit}: the pool ends with it rather than resubmit what its "
                   f"user or the site ended; its nodes are not replaced. Open a new pool to go on"
                   + (", with a longer time=" if limit else "") + ".")
        with self._lock:
            first = self._ended_by is None
            if first:
                self._ended_by = message
            message = self._ended_by or message
            others = [j for j in self._jobs if j != job]
        if first:
            log.error("Slurm pool %s: %s", self.pool_id, message)
            ev.bus.emit(ev.Error(pool=self.pool_id, message=message, node=index))
            self._cancel(others, forget=False)
        raise ProviderError(message)

    def loss_reason(self, index: int, why: str) -> str:
        """``why`` with how node ``index``'s job stands (issue 45, item 8): "connection closed;
        Slurm job 12 reached its time limit (TIMEOUT)", "...; Slurm job 12 was cancelled by uid
        1000", "...; Slurm job 12 is NODE_FAIL", "...; Slurm job 12 still RUNNING (its agent
        ended)". A look at the queue, again while the job is on its way out (COMPLETING: a
        scancel's job says CANCELLED only once its processes are gone, which took over 2.5 s on
        a loaded 2-core machine), given at most 7 s in all (the login node may be what was lost;
        the node's tasks have their errors already, and a replacement waits for the job to settle
        anyway)."""
        with self._lock:
            node = self._nodes.get(index)
            job = node.job if node is not None else ""
            if not job or job not in self._jobs or self._closed:
                return why
        seen: list[q.JobState] = []

        def look() -> None:
            try:
                seen.append(self._settled(job, within=6.0, patience=2.0, pause=0.25))
            except Exception as exc:
                log.debug("Slurm pool %s: no look at job %s for node %d's loss: %s", self.pool_id, job, index, exc)

        thread = threading.Thread(target=look, name="skyward-slurm-loss", daemon=True)
        thread.start()
        thread.join(7.0)
        if not seen:
            return why
        state = seen[0]
        base = state.state.split()[0]
        stops = q.stops_the_pool(state)
        if stops:
            said = f"Slurm job {job} {stops} ({base})" if base not in stops else f"Slurm job {job} {stops}"
        elif base == "RUNNING" and not state.restarts:
            said = f"Slurm job {job} still RUNNING (its agent on this node ended)"
        else:
            said = f"Slurm job {job} is {state.state}"
            if state.restarts:
                said += f", requeued {state.restarts} time(s)"
        if state.reason and state.reason not in ("None", "(null)") and state.reason not in said:
            said += f", reason {state.reason}"
        return f"{why}; {said}"

    def preempted(self, index: int) -> str | None:
        with self._lock:
            state = self._lost_to.get(index)
        if state is not None and state.state.split()[0] == "PREEMPTED":
            return f"Slurm preempted its job {state.job}" + (f" ({state.reason})" if state.reason else "")
        return None

    def stop(self, endpoints: list[NodeEndpoint]) -> None:
        """These nodes' agents were told to stop; a job none of whose nodes is wanted is cancelled
        (the others keep theirs: a node of a bigger job is released when its job ends)."""
        with self._lock:
            for e in endpoints:
                node = self._nodes.get(e.index)
                if node is not None:
                    node.stopped = True
            done = [j for j, info in self._jobs.items()
                    if all(self._nodes.get(i) is None or self._nodes[i].stopped for i in info["nodes"])]
        self._cancel(done)

    def close(self) -> None:
        with self._lock:
            jobs = list(self._jobs)
        try:
            if self._remote is not None or jobs:
                self._cancel(jobs, forget=False)
                if self.folder:
                    clean = f"rm -rf {shlex.quote(self.folder)}"
                    if self.login_pool:
                        clean += f" {shlex.quote(self.login_pool)}"
                    self._run(f"{clean}; true", check=False, timeout=30)
        except Exception as exc:
            log.warning("Slurm pool %s: cleaning up on the login node failed (%s); its jobs %s end by "
                        "themselves when their agents' lease (ttl=%ss) runs out", self.pool_id, exc,
                        ", ".join(jobs) or "-", self._ttl)
        finally:
            with self._lock:
                self._jobs.clear()
                self._nodes.clear()
                self._closed = True
                remote, self._remote = self._remote, None
            if remote is not None:
                remote.close()

    def _cancel(self, jobs: list[str], forget: bool = True) -> None:
        if not jobs:
            return
        self._run(f"scancel {' '.join(shlex.quote(j) for j in jobs)} 2>&1; true", check=False, timeout=30)
        if forget:
            with self._lock:
                for j in jobs:
                    if j in self._jobs and j not in self._ended:
                        self._ended.append(j)
                    info = self._jobs.pop(j, None) or {"nodes": []}
                    for i in info["nodes"]:
                        if self._nodes.get(i) is not None and self._nodes[i].stopped:
                            self._nodes.pop(i, None)

    def scheduler_facts(self) -> dict[str, Any]:
        """For the pool's record (records/record.py): its Slurm jobs, each with its sbatch script,
        the pool's nodes it brings and Slurm's names of them, and the login node."""
        with self._lock:
            jobs = {j: {"script": info.get("script"), "pool_nodes": list(info["nodes"]),
                        "nodes": [self._nodes[i].slurm_node or self._nodes[i].hostname
                                  for i in info["nodes"] if i in self._nodes]}
                    for j, info in self._jobs.items()}
        return {"login": self.provider._host[1], "partition": self._partition or self.provider.partition,
                "jobs": jobs}

    def jobs(self) -> dict[str, list[int]]:
        """The pool's running jobs: job id -> the pool's node indices it brings."""
        with self._lock:
            return {j: list(info["nodes"]) for j, info in self._jobs.items()}

    def _phase(self, node: int, phase: str, status: Any, seconds: float | None = None) -> None:
        ev.bus.emit(ev.BootstrapPhase(pool=self.pool_id, node=node, phase=phase, status=status, seconds=seconds))

    # -- named pools -------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        import base64

        import cloudpickle

        with self._lock:
            nodes = self.table.all_locked()
            jobs = {j: dict(info) for j, info in self._jobs.items()}
        p = self.provider
        return {
            "provider": "slurm",
            "pool_id": self.pool_id,
            "token": self.token,
            "head_port": self.head_port,
            "interface": self.interface,
            "ttl": self._ttl,
            "login": {"host": p._host[1], "port": p._host[2], "user": p._host[0], "key": p.key, "jump": p.jump,
                      "known_hosts": p.known_hosts},
            "slurm": {"partition": p.partition, "account": p.account, "qos": p.qos, "time": p.time,
                      "constraint": p.constraint, "options": list(p.options), "pending_timeout": p.pending_timeout,
                      "max_poll_interval": p.max_poll_interval,
                      "gres": p.gres, "max_duration": p.max_duration, "install": p.install, "submit": p.submit},
            "spec": base64.b64encode(cloudpickle.dumps(self.spec)).decode(),
            "sky": self.sky,
            "folder": self.folder,
            "login_pool": self.login_pool,
            "login_address": self.login_address,
            "agent_python": self._python(),
            "next": self.table.next,
            "jobs": jobs,
            "ended_jobs": list(self._ended),
            "nodes": [
                {"index": n.index, "private_ip": n.address, "public_ip": None, "hostname": n.hostname,
                 "slurm_node": n.slurm_node, "job": n.job, "port": n.port, "agent_pid": n.agent_pid,
                 "agent_id": n.agent_id,
                 "log": f"{self.folder}/agent-{n.index}.log",
                 # where skyward ssh finds the pool's virtualenv (the shared home's)
                 "home": self.sky,
                 "agent_python": self._python()}
                for n in nodes
            ],
        }

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> SlurmCluster:
        """The jobs another process started; connects to nothing until ``start``."""
        import base64

        import cloudpickle

        require_kind(description, "slurm")
        login = description["login"]
        opts: dict[str, Any] = {k: (tuple(v) if k == "options" else v) for k, v in description["slurm"].items()}
        address = login["host"] if login.get("user") is None else f"{login['user']}@{login['host']}"
        if login.get("port"):
            address += f":{login['port']}"
        provider = Slurm(address, key=login.get("key"), jump=login.get("jump"), known_hosts=login.get("known_hosts"),
                         **opts)
        spec = cloudpickle.loads(base64.b64decode(description["spec"]))
        self = cls(spec, description["pool_id"], provider)
        self.token = description["token"]
        self.head_port = int(description["head_port"])
        self.interface = description.get("interface", "eth0")
        self._ttl = description["ttl"]
        self.sky, self.folder = description["sky"], description["folder"]
        self.login_pool, self.login_address = description.get("login_pool", ""), description.get("login_address", "")
        self._agent_python = str(description.get("agent_python") or "")
        self._jobs = {j: dict(info) for j, info in description.get("jobs", {}).items()}
        self._ended = [str(j) for j in description.get("ended_jobs") or []]
        self.table.restore([
            _Node(int(n["index"]), str(n["job"]), hostname=n.get("hostname") or "", address=n["private_ip"],
                  port=int(n["port"]), agent_pid=int(n.get("agent_pid") or 0), agent_id=n.get("agent_id") or "",
                  slurm_node=n.get("slurm_node") or n.get("hostname") or "")
            for n in description["nodes"]
        ], int(description.get("next", 0)))
        self._ready = True  # its shipment is on the shared home already
        return self

    def _reconnect(self, nodes: list[_Node]) -> list[NodeEndpoint]:
        """Hand out described nodes: their job must still run; one tunnel each through the login node."""
        jobs = sorted({n.job for n in nodes})
        try:
            states: dict[str, q.JobState] | None = _look(
                lambda c: self._run(c, check=False, phase="squeue"), jobs, patience=_DESCRIBED_PATIENCE,
                where=self._login().label)
        except ProviderError as exc:
            # Unknown is not ended (issue 45, item 1): try each node's agent; the tunnel tells.
            log.warning("%s; reaching the pool's nodes without it", exc)
            states = None
        reached = []
        for n in nodes:
            state = states.get(n.job) if states is not None else None
            self.table.add(n)
            if states is not None and (state is None or state.ended or state.state != "RUNNING"):
                what = f"{state.state}, reason {state.reason}" if state else "gone from the queue"
                self.table.mark_unreachable(n.index, f"its Slurm job {n.job} is {what}")
                continue
            n.endpoint = NodeEndpoint(index=n.index, private_ip=n.address, public_ip=None, hostname=n.hostname,
                                      connect=functools.partial(_tunnel, self, n.address, n.port), agent_id=n.agent_id)
            reached.append(n.endpoint)
        if not reached:
            raise ProviderError(f"none of this pool's nodes can be reached: "
                                f"{'; '.join(f'node {i}: {w}' for i, w in self.unreachable().items())}")
        return reached

    def detach(self) -> None:
        with self._lock:
            remote, self._remote = self._remote, None
        if remote is not None:
            remote.close()

    # -- reaching a node: through the login node ---------------------------------------------------
    def _job_node(self, index: int) -> _Node:
        node = self.table.find(index)
        if node is None or not node.job:
            raise ProviderError(f"pool {self.pool_id} has no node {index} in a Slurm job now; "
                                f"`skyward status` lists its nodes.")
        return node

    def open_stream(self, index: int, target: Target) -> Stream:
        """A port on node ``index``'s private address, as the login node reaches it (the agents
        listen there): a direct-tcpip channel through the login node, or a relay there where it
        forbids forwarding. A port on the node's loopback or a Unix socket on it is out of reach:
        the login node is another machine, and a compute node is never logged in to."""
        node = self._job_node(index)
        if not isinstance(target, int) or not node.address:
            raise ProviderError(f"node {index} of pool {self.pool_id}: a Slurm node is reached through the "
                                f"login node, which reaches TCP ports on the node's address only, not "
                                f"{target!r}.")
        return _tunnel(self, node.address, target)

    # Never the login node's own shell (a shell there is not a shell on the node): its sessions,
    # each carried into the node's job.
    def shell(self, index: int) -> SSHShell:
        """Where `skyward ssh`/`cp` run a command on node ``index``: the login node's connection,
        and a function that turns a command (and whether it runs on a terminal) into the ``srun``
        line that runs it on that node inside its job: a step beside the agent's (``--overlap``:
        it takes none of the job's CPUs from it), with the job's environment (SLURM_JOB_ID, ...),
        on a pseudo-terminal of the job's when asked. Never a login to a compute node, which
        Slurm sites forbid (pam_slurm_adopt or none at all)."""
        node = self._job_node(index)
        where = node.slurm_node or node.hostname
        flags = [f"--jobid={node.job}", "--overlap", f"--nodelist={where}", "--nodes=1", "--ntasks=1", "--quiet"]

        def wrap(command: str, tty: bool) -> str:
            if tty:
                return shlex.join(["srun", *flags, "--pty"]) + " " + command
            # The step lingers a moment after the command: srun (22.05 checked) may lose the last
            # of a task's stdout when the task exits right after writing it ("_server_read:
            # unexpected eof reading message body"): 3 of 30 tar streams of 230 KB were cut
            # short, none with 0.1 s or 0.3 s of linger.
            return shlex.join(["srun", *flags, "bash", "-c", f"{command}\nr=$?; sleep {_IO_LINGER}; exit $r"])

        return SSHShell(self._login(), wrap)


def _connected(remote: Remote) -> bool:
    """Whether the SSH session to the login node still stands."""
    conn = remote.conn
    transport = getattr(conn, "transport", None) if conn is not None else None
    return transport is not None and bool(transport.is_active())


def _tunnel(cluster: SlurmCluster, address: str, port: int) -> Any:
    """A stream to a node's agent: a direct-tcpip channel from the login node to its private
    address; where the login node's sshd forbids that (``AllowTcpForwarding no``,
    ``DisableForwarding``), a link of the login node's multiplexer (``Remote.muxed``: one exec
    channel running the pool's own Python there, from the environment on the shared home, which
    connects to the agents and carries every link), else (a login node whose skyward has no
    multiplexer) a relay over an exec channel per link, copying frames to the agent.

    Where forwarding is allowed sshd carries the links: no process of the pool's runs on the
    login node, and at 3 nodes a channel per link was as fast to enter, and faster per call and
    per byte, than the multiplexer (docs/guides/benchmarks.md, Slurm's links)."""
    remote = cluster._login()
    if cluster._forwarding:
        return _direct(cluster, remote, address, port)
    # Until one channel has opened, one attempt at a time: paramiko keeps a refused channel's
    # reason on the connection for whichever opener asks first, so two refused at once may leave
    # one of them a bare "Unable to open channel" in place of "administratively prohibited".
    with cluster._forwarding_lock:
        if not cluster._relay:
            try:
                sock = _direct(cluster, remote, address, port)
            except _Prohibited as exc:
                log.info("%s forbids TCP forwarding (%s): the pool reaches its agents through a relay there "
                         "instead (its own Python on the login node, over an exec channel)", remote.label, exc)
                cluster._relay = True
            else:
                cluster._forwarding = True
                return sock
    python = f"{cluster.sky}/{cluster._python()}"
    link = remote.muxed(port, address, python, f"{cluster.folder}/mux.log")
    return link if link is not None else remote.relay(relay_command(python, port, host=address))


class _Prohibited(Exception):
    """The login node's sshd refused a direct-tcpip channel by its configuration."""


def _direct(cluster: SlurmCluster, remote: Remote, address: str, port: int) -> Any:
    """A direct-tcpip channel through the login node to a node's agent; _Prohibited where the
    login node forbids them and the pool can relay instead."""
    import paramiko

    try:
        return channel(remote, port, host=address)
    except paramiko.ChannelException as exc:
        if not prohibited(exc) or not cluster._python():
            raise ProviderError(
                f"{remote.label} refused a channel to node agent {address}:{port}: {exc}. The login node "
                f"must let its users reach the compute nodes' addresses (sshd's AllowTcpForwarding).") from None
        raise _Prohibited(str(exc)) from None


def _usage(out: str, listed: str) -> tuple[dict[str, dict[str, Any]], str]:
    """``accounting``'s command output -> each job's usage, and where it came from (sacct, or the
    controller's memory of the jobs where the site keeps no accounting)."""
    head, _, rest = out.partition("@@sacct ")
    code, _, rest = rest.partition("\n")
    used = q.parse_sacct(head) if code.strip() == "0" else {}
    if used:
        return used, "sacct"
    said = " ".join(head.split())[-200:] or f"no record of jobs {listed}"
    for block in rest.split("@@job ")[1:]:
        job, _, text = block.partition("\n")
        found = q.parse_scontrol_job(text)
        if found is not None:
            used[job.strip()] = found
    return used, f"none in sacct ({said}); figures from the controller (scontrol show job)"


def _parse_look(out: str, job: str) -> tuple[q.Look, dict[int, list[str]], dict[int, dict[str, Any]]]:
    """One look's output: what squeue said of the job, each node's log lines, each node's hello (or {})."""
    queue, sep, tail = out.partition("@@@log ")
    look = q.parse_look(queue)
    logs: dict[int, list[str]] = {}
    hellos: dict[int, dict[str, Any]] = {}
    current: int | None = None
    for line in (sep + tail).splitlines():
        if line.startswith("@@@log "):
            current = int(line.split()[1])
            logs[current] = []
        elif line.startswith("@@@hello "):
            _, index, *rest = line.split(" ", 2)
            current = None
            try:
                hellos[int(index)] = json.loads(rest[0]) if rest and rest[0].strip() else {}
            except ValueError:
                hellos[int(index)] = {}
        elif current is not None:
            logs[current].append(line)
    return look, logs, hellos


def _shared_phases(text: str) -> str:
    """The bootstrap script cut to what the login node builds for every node (uv, Python, the
    environment, skyward): the phases after the environment's lock is released are node-local."""
    head, sep, _ = text.partition("env_unlock\n")
    if not sep:
        return text
    # apt belongs to the nodes (a login node is no place for system packages, nor is sudo there).
    head = re.sub(r"^phase apt .*\n", "", head, flags=re.M)
    return head + sep + 'echo "@@skyward ready"\n'


# Printed after NODE_DIRS on the login node: the address compute nodes reach it by.
# Then the partitions as sinfo shows them (the same connection's one command: no round trip more).
_LOGIN_FACTS = (
    'echo "@@address $(echo "${SSH_CONNECTION:-}" | cut -d" " -f3)"\n'
    f'S=$(sinfo -h -N -o {shlex.quote(q.SINFO_FORMAT)} 2>&1); echo "@@sinfo $?"; printf "%s\\n" "$S" | sed "s/^/%%sinfo /"\n'
)

# Run by srun on each node of a job: $1 is the pool's index of the job's first node. The node's
# bootstrap output and, once its agent listens, a one-line JSON hello go to the pool's folder on
# the shared home, which the client reads through the login node. The agent runs in the
# foreground of the job step (scancel stops it; its end ends the step).
_NODE_SCRIPT = r"""#!/bin/bash
set -u
FOLDER={folder}
I=$(( $1 + ${{SLURM_NODEID:-0}} ))
IFS= read -r TOKEN < "$FOLDER/token" || TOKEN=
SKY={sky}
{run}POOL="$RUN/pools/{pool}-$I"
hello() {{ printf '%s\n' "$1" > "$FOLDER/node-$I.json.tmp" && mv -f "$FOLDER/node-$I.json.tmp" "$FOLDER/node-$I.json"; }}
{hold}umask 077
for f in includes.tar rclone.conf; do [ -f "$FOLDER/$f" ] && cp "$FOLDER/$f" "$POOL/$f"; done
if ! SKYWARD_SKY="$SKY" SKYWARD_RUN="$RUN" SKYWARD_POOL="$POOL" bash "$FOLDER/bootstrap.sh" </dev/null >"$FOLDER/node-$I.log" 2>&1; then
  hello "{{\"error\": \"bootstrap\", \"hostname\": \"$(hostname)\"}}"; exit 1
fi
cd "$POOL"; . ./env.sh
mkdir -p site
PP="$POOL/site"; if [ -d "$POOL/includes" ]; then PP="$POOL/includes:$PP"; fi
export PYTHONPATH="$PP${{PYTHONPATH:+:$PYTHONPATH}}" SKYWARD_SITE="$POOL/site" SKYWARD_UV="$SKY/bin/uv"
ADDR=$(ip -o route get {login} 2>/dev/null | sed -n 's/.* src \([^ ]*\).*/\1/p' | head -n1)
DEV=$(ip -o route get {login} 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -n1)
[ -n "$ADDR" ] || ADDR=$(hostname -I 2>/dev/null | cut -d" " -f1)
rm -f agent.json
# Clients come through the login node to the direct listener; the agent's other listener is a
# Unix socket in this 0700 folder, or in a short one of its own where this path is too long (no
# loopback port another user of the node could fill).
SKYWARD_AGENT_TOKEN="$TOKEN" "$SKY/{python}" -m skyward.bootstrap.agent_start --ttl {ttl} --log "$FOLDER/agent-$I.log" \
  --socket "$POOL/agent.sock" --direct "$ADDR" --orphan-cleanup "$POOL" --sweep "$RUN/pools" </dev/null >agent.json 2>>"$FOLDER/agent-$I.log" &
AGENT=$!
TOKEN=
trap 'kill -TERM $AGENT 2>/dev/null' TERM INT
for _ in $(seq 1 {timeout}); do [ -s agent.json ] && break; kill -0 $AGENT 2>/dev/null || break; sleep 0.05; done
if [ -s agent.json ] && grep -q '"direct"' agent.json; then
  hello "{{\"agent\": $(head -n1 agent.json), \"hostname\": \"$(hostname)\", \"ip\": \"$ADDR\", \"interface\": \"$DEV\", \"node\": \"${{SLURMD_NODENAME:-}}\", \"job\": \"${{SLURM_JOB_ID:-}}\"}}"
else
  H=$(head -n1 agent.json 2>/dev/null)
  hello "{{\"error\": \"agent\", \"hostname\": \"$(hostname)\", \"hello\": ${{H:-null}}}}"
  kill -TERM $AGENT 2>/dev/null
fi
wait $AGENT; CODE=$?
wait $AGENT 2>/dev/null
cd /; rm -rf "$POOL"
exit $CODE
"""
