"""A real Slurm cluster on the SSH test hosts (tests/sshhosts.py), for the sky.Slurm tests.

``SlurmCluster(hosts)`` turns started netns ``SSHHosts`` into a small Slurm site:

* one ``munged``, run as the ``munge`` user with a fresh 0400 key, serves every host through its
  unix socket: the hosts' network namespaces share the client's filesystem, so one socket is
  reachable from all of them (``AuthInfo=socket=...`` in slurm.conf);
* ``slurmctld`` runs on the client, on the hosts' bridge address, under this machine's own host
  name (``SlurmctldHost=<hostname>(<bridge ip>)``; any other name and it refuses to start: "not a
  valid controller"), on a free port;
* host 0 is the login node (no ``slurmd``: jobs, not logins, get compute nodes); every other host
  runs ``slurmd -D -N <its name>`` inside its own network, UTS, mount and PID namespaces (entered
  with ``nsenter``), declared ``NodeName=<name> NodeAddr=<its address>``;
* the configuration is bound over ``/etc/slurm`` inside each host's mount namespace (never on the
  real machine), so ``sbatch``/``srun``/``squeue`` on a host find it where a site keeps it.

This machine mounts cgroup v1 under a tmpfs, so the cluster uses ``cgroup.conf`` with
``CgroupPlugin=cgroup/v1`` and ``CgroupAutomount=no``, ``ProctrackType=proctrack/linuxproc`` and
``TaskPlugin=task/none``. Nothing here is reaped by PID 1: every daemon started is waited for at
``close()``, which also runs when ``start()`` fails half way. The daemons' files live in a folder
under ``/dev/shm`` (the hosts hide ``/tmp``, ``/run`` and ``/var``'s scratch dirs, not it); a test
process killed outright leaves that folder and its daemons to ``sweep_stale`` (run by ``start``).

Skip with ``SlurmUnavailable``'s message where ``slurm-wlm``/``munge`` are not installed or the
hosts are not in netns mode.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from helpers import free_port
from sshhosts import SSHHosts

_SBIN = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ROOT = Path("/dev/shm")
_PREFIX = "sky-slurm-"
_DAEMONS = ("munged", "slurmctld", "slurmd")
_CLIENTS = ("sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")


class SlurmUnavailable(Exception):
    """This machine cannot run the test cluster (tests skip with the message)."""


def unavailable_reason() -> str | None:
    """None when a Slurm test cluster can run here, else why not (and how to get one)."""
    missing = [t for t in (*_DAEMONS, *_CLIENTS, "nsenter") if shutil.which(t, path=_SBIN) is None]
    if missing:
        return (f"Slurm is not installed here ({', '.join(missing)} missing): "
                f"`apt-get install slurm-wlm munge` (as root; .ci/run does it)")
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (slurmd runs inside the netns test hosts)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "the munge user does not exist: reinstall the munge package"
    return None


class SlurmCluster:
    """munged + slurmctld on the client, slurmd on hosts[1:], hosts[0] the login node."""

    def __init__(self, hosts: SSHHosts, *, partition: str = "debug", cpus: int | None = None,
                 slurmd_timeout: int = 10) -> None:
        if hosts.mode != "netns":
            raise SlurmUnavailable("the Slurm test cluster needs netns SSH hosts (root)")
        if len(hosts) < 2:
            raise ValueError("a Slurm test cluster needs a login host and at least one compute host")
        self.hosts = hosts
        self.login = hosts[0]
        self.compute = list(hosts)[1:]
        self.partition = partition
        self.cpus = cpus or (os.cpu_count() or 1)
        self.slurmd_timeout = slurmd_timeout
        self.tag = secrets.token_hex(3)
        self.dir = Path()
        self.conf = Path()
        self.controller = socket.gethostname()
        self.port = 0
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._mounted: list[int] = []

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        why = unavailable_reason()
        if why is not None:
            raise SlurmUnavailable(why)
        sweep_stale()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{self.tag}-", dir=_ROOT))
        self.dir.chmod(0o755)
        (self.dir / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        etc = self.dir / "etc"
        etc.mkdir(mode=0o755)
        for sub in ("ctld", "log"):
            (self.dir / sub).mkdir(mode=0o755)
        self._start_munge()
        self.port = free_port(self.hosts.client_address)
        self.conf = etc / "slurm.conf"
        self.conf.write_text(self._slurm_conf())
        (etc / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        for f in etc.iterdir():
            f.chmod(0o644)
        for h in self.hosts:
            self._bind_etc(h)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait_controller()
        for h in self.compute:
            (self.dir / "d" / h.name).mkdir(parents=True, mode=0o755)
            pid = h.pid
            assert pid is not None, f"{h} is not running"
            self._spawn(f"slurmd {h.name}", [
                "nsenter", "-t", str(pid), "-n", "-u", "-m", "-p", "--",
                "slurmd", "-D", "-N", h.name, "-f", str(self.conf)])
        self.wait_idle()

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        d = self.dir / "munge"
        d.mkdir(mode=0o755)
        key = d / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        for p in (d, key):
            os.chown(p, munge.pw_uid, munge.pw_gid)
        self.munge_socket = d / "munge.socket"
        self._spawn("munged", [
            "runuser", "-u", "munge", "--", "munged", "--foreground", "--force",
            f"--socket={self.munge_socket}", f"--key-file={key}", f"--pid-file={d}/munged.pid",
            f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"])
        _wait(lambda: self.munge_socket.exists(), 10, "munged did not create its socket",
              lambda: _tail(d / "munged.log"), self._procs[-1][1])

    def _slurm_conf(self) -> str:
        d = self.dir
        nodes = "".join(
            f"NodeName={h.name} NodeAddr={h.address} CPUs={self.cpus} State=UNKNOWN\n" for h in self.compute)
        names = ",".join(h.name for h in self.compute)
        return f"""\
# A skyward test cluster ({self.tag}); written by tests/slurmcluster.py.
ClusterName=sky{self.tag}
SlurmctldHost={self.controller}({self.hosts.client_address})
SlurmctldPort={self.port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/d/%n
SlurmctldPidFile={d}/ctld/slurmctld.pid
SlurmdPidFile={d}/d/%n/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout={self.slurmd_timeout}
SlurmctldTimeout=30
MessageTimeout=10
KillWait=3
MinJobAge=60
InactiveLimit=0
{nodes}PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""

    def _bind_etc(self, host: object) -> None:
        """The configuration at /etc/slurm inside the host's own mount namespace."""
        pid = host.pid  # type: ignore[attr-defined]
        assert pid is not None, f"{host} is not running"
        _run(["nsenter", "-t", str(pid), "-m", "--", "mount", "--bind", str(self.dir / "etc"), "/etc/slurm"])

    def _spawn(self, label: str, argv: Sequence[str]) -> None:
        log = open(self.dir / "log" / f"{label.replace(' ', '-')}.out", "ab")  # noqa: SIM115
        with log:
            proc = subprocess.Popen([shutil.which(argv[0], path=_SBIN) or argv[0], *argv[1:]],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    env={"PATH": _SBIN, "LANG": "C.UTF-8", "SLURM_CONF": str(self.conf)},
                                    start_new_session=True)
        self._procs.append((label, proc))

    def _wait_controller(self) -> None:
        proc = self._procs[-1][1]
        _wait(lambda: self.run(["scontrol", "ping"], check=False).stdout.count("UP") > 0, 20,
              "slurmctld did not come up", lambda: _tail(self.dir / "log" / "slurmctld.log"), proc)

    def wait_idle(self, timeout: float = 30) -> None:
        """Until every compute node is idle (slurmd registered, no job on it)."""
        def idle() -> bool:
            states = self.node_states()
            return len(states) == len(self.compute) and all(s == "idle" for s in states.values())

        _wait(idle, timeout, "the compute nodes did not all become idle",
              lambda: f"{self.node_states()}\n" + _tail(self.dir / "log" / "slurmctld.log"))

    def close(self) -> None:
        """Stop every daemon (slurmd first, munged last) and wait for each; remove the folder."""
        for _label, proc in reversed(self._procs):
            if proc.poll() is None:
                # nsenter forked slurmd inside the host's PID namespace: signal the daemon itself.
                for pid in [*_children(proc.pid), proc.pid]:
                    _kill(pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                for pid in [*_children(proc.pid), proc.pid]:
                    _kill(pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self._procs.clear()
        for h in self.hosts:
            pid = h.pid
            if pid is not None:
                _run(["nsenter", "-t", str(pid), "-m", "--", "umount", "/etc/slurm"], check=False)
        if self.dir != Path() and self.dir.is_dir():
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- driving it ----------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm command on the client, as root (an admin's view of the cluster)."""
        proc = subprocess.run([shutil.which(argv[0], path=_SBIN) or argv[0], *argv[1:]], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env={"PATH": _SBIN, "LANG": "C.UTF-8", "SLURM_CONF": str(self.conf)})
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def node_states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
        return {n: s.rstrip("*") for n, s in (line.split() for line in out.splitlines() if line.strip())}

    def jobs(self, user: str | None = None) -> list[dict[str, str]]:
        """The queue: one dict per job (id, name, state, reason, nodes)."""
        argv = ["squeue", "-h", "-o", "%i|%j|%T|%r|%N"]
        if user:
            argv += ["-u", user]
        out = self.run(argv).stdout
        keys = ("id", "name", "state", "reason", "nodes")
        return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]

    def wait_no_jobs(self, timeout: float = 30) -> None:
        _wait(lambda: not [j for j in self.jobs() if j["state"] not in ("COMPLETED", "CANCELLED", "FAILED")],
              timeout, "jobs are still in the queue", lambda: str(self.jobs()))

    def log(self, name: str = "slurmctld") -> str:
        return _tail(self.dir / "log" / f"{name}.log", 60)


# -- helpers ---------------------------------------------------------------------------------------
def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([shutil.which(argv[0], path=_SBIN) or argv[0], *argv[1:]], capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _wait(ok: object, timeout: float, what: str, detail: object = None,
          proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ok():  # type: ignore[operator]
                return
        except (OSError, RuntimeError, subprocess.SubprocessError):
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: it exited ({proc.returncode})\n{detail() if detail else ''}")  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout:g} s\n{detail() if detail else ''}")  # type: ignore[operator]
        time.sleep(0.1)


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"({path} unreadable)"


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(stat[1]) == pid:
                kids.append(int(entry))
    return kids


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def sweep_stale() -> list[Path]:
    """Stop the daemons and remove the folders of clusters whose test process died unannounced
    (SIGKILL, a cancelled CI job): their daemons name the folder in their command lines."""
    swept = []
    for d in _ROOT.glob(f"{_PREFIX}*"):
        try:
            pid, started = (d / "owner").read_text().split()
        except (OSError, ValueError):
            continue
        if _start_time(int(pid)) == started:
            continue  # its owner still runs
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if str(d).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                        pids.append(int(entry))
        for p in pids:
            _kill(p, signal.SIGKILL)
        shutil.rmtree(d, ignore_errors=True)
        swept.append(d)
    return swept
