"""Real `sshd` test hosts for SSH-provider tests.

`SSHHosts(n)` starts n sshd servers that a test reaches with a real SSH client, and removes every
trace of them on exit. Two modes:

* ``"netns"`` (root; what CI runs). Each host is its own small machine:
  - a network namespace ``sky-<tag>-<i>`` whose only link is ``eth0``, one end of a veth pair
    plugged into a private bridge ``skb-<tag>`` in the root namespace. The bridge has
    ``10.213.X.1/24`` (X random, checked against every address and route already on this
    machine); host i has ``10.213.X.(10+i)/24``. No default route: a host reaches the other hosts
    and the client (the bridge address) and nothing else.
  - its own UTS namespace (hostname ``sky-<tag>-<i>``), PID namespace (``ps`` on a host shows only
    that host's processes, and ``pkill`` there cannot touch the test runner) and mount namespace in
    which ``/root`` (the login user's HOME), ``/tmp``, ``/var/tmp``, ``/run`` and ``/var/log`` are
    fresh tmpfs, and the client's checkout of this repository and its virtualenv are hidden under
    empty read-only tmpfs. So ~/.skyward, SKYWARD_HOME (pytest puts it under /tmp), pip/uv caches
    in ~/.cache and the editable install are all invisible to a host. /etc/hosts names the hosts
    and the client ("sky-client"). The rest of the filesystem (/usr, /etc, the system python3) is
    the client's, shared read-write, like a stock machine image.
  - sshd is PID 1 of the host's PID namespace. It reaps every orphan on the host (sshd's SIGCHLD
    handler waits for any child), and when it dies the kernel kills everything on the host, so
    stopping a host is a power cut and leaves no process behind.

* ``"loopback"`` (any user; the fallback without root). Hosts are sshd processes on distinct
  addresses 127.213.X.(10+i) with free high ports, logging in as the current user. No
  namespaces: all hosts share the client's hostname, filesystem and process table. HOME is moved
  to a per-host directory with sshd's ``SetEnv HOME=...`` (the session still starts in the real
  home directory as its working directory). Each sshd runs under a tiny subreaper (see _REAPER) so
  processes it leaves behind are still reaped: PID 1 on some machines never reaps orphans.

``mode="auto"`` (the default) picks netns when this process is root and namespaces work, else
loopback. A test that needs real isolation asks for ``mode="netns"`` and is skipped elsewhere.

Everything created is undone by `close()` (also on `__exit__` and when setup fails half way):
each undo step is registered *before* the step it undoes, and every undo step tolerates the
thing being already gone. What a killed test process could not undo is swept by the next
SSHHosts.start() (see sweep_stale).

Using a host (see SSHHost): ``ssh -i host.key_path -p host.port host.user@host.address``; the
host key to expect is ``host.host_public_key`` (``hosts.write_known_hosts(path)`` writes them
all). ``host.stop()``/``kill()``/``start()``/``restart(new_host_key=True)``/``disconnect()``
drive failures.

Fleet shapes. By default every host has its own empty home and logs in as root (netns) or as the
current user (loopback). Real fleets differ; these keyword arguments of SSHHosts (combinable)
give the other shapes:

* ``shared_home=True``: one directory, ``hosts.shared_home_dir`` on the client (inside the temp
  dir), is every host's home, like an NFS home on a lab cluster. netns: bind-mounted where the
  home would be (``/root``, or ``/home/<user>``); loopback: every host's ``SetEnv HOME`` names it.
  ``host.home`` stays the path a login sees. (A bastion keeps a home of its own.)
* ``user="auto"`` (netns only): log in as a real account that is not root, ``sky<tag>``
  (``hosts.user``, ``host.user``), made with ``useradd -M -d /home/<user>`` and ``usermod -p '*'``
  (sshd without PAM refuses a locked account, which is what useradd makes) and marked in its
  GECOS field, so that only accounts made here are ever deleted. Its home on each host is a
  tmpfs it owns, mounted at ``/home/<user>`` in the host's mount namespace (or the shared home,
  chowned to it); the empty mountpoint exists on the real filesystem while the hosts do.
  ``userdel`` at close. sshd reads AuthorizedKeysFile as the login user: the state dirs are
  0711 and authorized_keys 0644 (the client's private key stays 0600).
* ``sudo="nopasswd" | "password" | None`` (only with ``user``): each host mounts its own
  tmpfs over ``/etc/sudoers.d`` (the machine's own is never touched) holding one 0440 rule:
  ``<user> ALL=(ALL) NOPASSWD:ALL``, ``<user> ALL=(ALL) ALL`` (the account has no password, so
  ``sudo -n true`` fails: "a password is required"), or none at all (not in sudoers).
* ``bastion=True`` (netns only): the n hosts are reachable only through a jump host,
  ``hosts.bastion`` (an SSHHost: same client key, same login user, its own home, name
  ``sky-<tag>-b``). The bastion sits on the client's bridge (``skb-<tag>``, address .10) and has
  a second link ``eth1`` (address .1) on an inner bridge ``skbi-<tag>`` whose /24
  (``hosts.inner_subnet``) has no address in the root namespace; the n hosts' eth0 are on the
  inner bridge only, at inner .(10+i). The root namespace gets an ``unreachable`` route for the
  inner /24 (no other SSHHosts takes it, and the client fails at once instead of timing out),
  and the bastion does not forward IP: only SSH jumping (direct-tcpip through the bastion's
  sshd) reaches a host. ``host.address`` is the inner address; ``hosts.jump`` is
  ``"user@bastion:22"``; ``hosts.write_ssh_config(path)`` writes an OpenSSH client config (a
  ``ProxyJump`` for each inner host) and ``host.ssh_argv()`` jumps through the bastion by
  itself. /etc/hosts on every host names the hosts and the bastion (at its inner address).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import getpass
import ipaddress
import json
import os
import pwd
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from helpers import free_port

Mode = Literal["auto", "netns", "loopback"]
Sudo = Literal["nopasswd", "password"]

# 10.213.0.0/16 is ours: each SSHHosts takes one free /24 out of it for its bridge.
_NETNS_POOL = ipaddress.ip_network("10.213.0.0/16")
_SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The checkout this file belongs to; hidden from netns hosts so they cannot import the client's
# editable skyward or use its venv by accident.
_REPO_ROOT = Path(__file__).resolve().parents[1]


class SSHHostsUnavailable(Exception):
    """This machine cannot run the requested kind of hosts (tests should skip with the message)."""


class SSHHostError(RuntimeError):
    """Setting up or driving a host failed."""


# --------------------------------------------------------------------------------------------
# Small process helpers


def _which(name: str) -> str | None:
    # sshd and ip live in sbin, which a non-root PATH often lacks.
    return shutil.which(name, path=os.environ.get("PATH", "") + ":" + _SBIN_PATH)


def _run(
    argv: Sequence[str], *, check: bool = True, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    # Resolved here because a non-root PATH (or a minimal CI one) may lack the sbin dirs.
    argv = [_which(argv[0]) or argv[0], *argv[1:]]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and proc.returncode != 0:
        raise SSHHostError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0]


def _children(pid: int) -> list[int]:
    # /proc/PID/task/TID/children is not in every kernel; scanning /proc works everywhere.
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _ppid_and_state(int(entry))
            if info is not None and info[0] == pid:
                kids.append(int(entry))
    return kids


def _alive(pid: int) -> bool:
    info = _ppid_and_state(pid)
    return info is not None and info[1] != "Z"


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _wait_dead(pids: Iterable[int], timeout: float, *, reaped: bool = False) -> list[int]:
    """Poll until none of pids runs (zombies count as dead, unless reaped: then until they are
    gone altogether); return those left."""
    left = list(pids)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if (os.path.exists(f"/proc/{p}") if reaped else _alive(p))]
    return left


@functools.cache
def _sshd_version() -> tuple[int, int]:
    sshd = _which("sshd")
    out = _run([sshd, "-V"], check=False).stderr if sshd else ""
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


@functools.cache
def _namespaces_work() -> str | None:
    """None if this process can create the namespaces netns mode needs, else why not."""
    unshare = _which("unshare")
    if unshare is None:
        return "unshare (util-linux) is not installed"
    probe = _run(
        [unshare, "--net", "--uts", "--pid", "--fork", "--mount-proc", "--", "true"], check=False
    )
    if probe.returncode != 0:
        return f"cannot create namespaces here: {probe.stderr.strip()}"
    return None


def unavailable_reason(
    mode: Mode = "auto",
    *,
    user: str | None = None,
    sudo: Sudo | None = None,
    bastion: bool = False,
    shared_home: bool = False,
) -> str | None:
    """Why SSHHosts(mode=mode, **fleet_shape) cannot run on this machine, or None if it can. A
    login user or a bastion needs netns mode, whatever mode says; a shared home needs nothing."""
    for tool in ("sshd", "ssh-keygen"):
        if _which(tool) is None:
            return f"{tool} is not installed (apt-get install openssh-server openssh-client)"
    if user is not None or bastion:
        mode = "netns"
    if mode == "netns":
        if os.geteuid() != 0:
            why = "; user= and bastion= need netns mode" if user is not None or bastion else ""
            return f"netns SSH hosts need root (network, PID and mount namespaces){why}"
        for tool in ("ip", "mount", "hostname"):
            if _which(tool) is None:
                return f"{tool} is not installed (apt-get install iproute2)"
        reason = _namespaces_work()
        if reason:
            return reason
    if user is not None:
        for tool in ("useradd", "usermod", "userdel"):
            if _which(tool) is None:
                return f"{tool} is not installed (apt-get install passwd)"
        if not Path("/home").is_dir():
            return "/home does not exist (a login user's home is mounted under it)"
    if sudo is not None:
        return _sudo_unavailable()
    return None


def _sudo_unavailable() -> str | None:
    if _which("sudo") is None:
        return "sudo is not installed (apt-get install sudo)"
    try:
        sudoers = Path("/etc/sudoers").read_text()
    except OSError as e:
        return f"cannot read /etc/sudoers: {e}"
    # Each host's rule goes into its own /etc/sudoers.d; sudo reads it only if included.
    if not re.search(r"^\s*[@#]includedir\s+/etc/sudoers\.d/?\s*$", sudoers, re.MULTILINE):
        return "/etc/sudoers does not include /etc/sudoers.d (add: @includedir /etc/sudoers.d)"
    return None


def resolve_mode(mode: Mode) -> Literal["netns", "loopback"]:
    if mode == "auto":
        return "netns" if unavailable_reason("netns") is None else "loopback"
    return mode


# --------------------------------------------------------------------------------------------
# The programs that run a host

# Run by `sh -c` as PID 1 of a fresh PID/mount/UTS namespace (inside the host's network
# namespace). $1: the host's state dir, $2: its hostname, $3: the login user's home, $4: a
# directory to bind there (a shared home) or "" for a fresh tmpfs, $5: "uid:gid" owning that
# tmpfs or "" (root), the rest: paths to hide. It ends by exec'ing sshd, which thereby becomes
# the host's init.
_HOST_INIT = r"""
set -eu
state=$1 name=$2 home=$3 home_src=$4 owner=$5
shift 5
hostname "$name"
# Hide the client's checkout first: /root and /tmp are replaced wholesale just below anyway.
for p in "$@"; do
    if [ -d "$p" ]; then mount -t tmpfs -o ro,mode=0755,size=64k sky-hidden "$p"; fi
done
# A private /run: sshd's privilege-separation dir without touching the real /run. The state dir
# (keys, sshd_config) is bound into it before /tmp, where it lives on the client, is replaced.
mount -t tmpfs -o mode=0755,size=16m sky-run /run
mkdir -m 0755 /run/sshd /run/skyhost
mount --bind "$state" /run/skyhost
mount --bind /run/skyhost/hosts /etc/hosts
# The login user's HOME starts empty, like on a fresh machine, unless it is the shared home (bound
# now: it lives under the client's /tmp, replaced below).
if [ -n "$home_src" ]; then
    mount --bind "$home_src" "$home"
elif [ -n "$owner" ]; then
    mount -t tmpfs -o "mode=0700,uid=${owner%:*},gid=${owner#*:}" sky-home "$home"
else
    mount -t tmpfs -o mode=0700 sky-home "$home"
fi
# A login user's sudo rule (or the lack of one) lives in this host's own /etc/sudoers.d.
if [ -d /run/skyhost/sudoers.d ]; then
    mount -t tmpfs -o mode=0755,size=64k sky-sudoers /etc/sudoers.d
    for rule in /run/skyhost/sudoers.d/*; do
        if [ -f "$rule" ]; then install -m 0440 -o root -g root "$rule" /etc/sudoers.d/; fi
    done
fi
# The scratch dirs start empty too; /var/log keeps sshd's wtmp/lastlog writes off the real
# machine.
mount -t tmpfs -o mode=1777 sky-tmp /tmp
mount -t tmpfs -o mode=1777 sky-vartmp /var/tmp
mount -t tmpfs -o mode=0755,size=16m sky-log /var/log
exec "$SSHD" -D -e -f /run/skyhost/sshd_config
"""

# Loopback mode has no PID namespace, so nothing would reap what sshd leaves behind (session
# processes once sshd dies, background jobs whose shell exited): their parent becomes PID 1,
# which may never reap. This wrapper becomes their reaper instead. It forwards SIGTERM/SIGINT
# to sshd; when sshd exits it kills and reaps everything left under it, then exits with sshd's
# status. It never gets SIGKILL from us (see SSHHost._terminate).
_REAPER = r"""
import ctypes, os, signal, sys
PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
sshd = None
sshd_reaped = False
pending = []
def forward(sig, frame):
    # SIGUSR1 asks for SIGKILL: SIGKILL sent to the reaper itself would orphan sshd.
    sig = signal.SIGKILL if sig == signal.SIGUSR1 else sig
    if sshd_reaped:
        return  # its pid may belong to another process by now
    if sshd is None:
        pending.append(sig)
        return
    try:
        os.kill(sshd, sig)
    except ProcessLookupError:
        pass
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(s, forward)
sshd = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)
for sig in pending:
    os.kill(sshd, sig)
status = 0
while True:
    pid, st = os.wait()
    if pid == sshd:
        sshd_reaped = True
        status = os.waitstatus_to_exitcode(st)
        break
me = str(os.getpid())
while True:
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == me:
                    os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass
    try:
        os.wait()
    except ChildProcessError:
        break
sys.exit(status if status >= 0 else 128 - status)
"""


# --------------------------------------------------------------------------------------------


class SSHHost:
    """One sshd host. Connect with: ssh -i KEY_PATH -p PORT USER@ADDRESS (with a bastion, through
    it: see ssh_argv).

    name            hostname the host reports (netns mode; in loopback mode the client's)
    address, port   where its sshd listens (reachable from the client and from the other hosts;
                    with a bastion, from the other hosts and the bastion only)
    user            login user ("root" in netns mode, the current user in loopback mode, or the
                    account made for user="auto")
    key_path        the client's private key (shared by all hosts of one SSHHosts)
    host_public_key "ssh-ed25519 AAAA..." of the host's current host key
    home            HOME seen by a login on this host
    """

    def __init__(
        self,
        owner: SSHHosts,
        index: int,
        name: str,
        address: str,
        port: int,
        *,
        label: str | None = None,
    ) -> None:
        """label names the host's state dir, namespace and link (default: its index)."""
        self._owner = owner
        self.index = index
        self.name = name
        self.address = address
        self.port = port
        self.user = owner.user
        self.key_path: Path = owner.client_key
        label = str(index) if label is None else label
        self.state_dir: Path = owner.tmpdir / f"host{label}"
        self.is_bastion = label == "b"
        # Where the home comes from: a fresh tmpfs, or the shared dir (never for a bastion).
        self._home_src = (
            owner.shared_home_dir if owner.shared_home_dir and not self.is_bastion else None
        )
        if owner.mode == "netns":
            self.home = "/root" if self.user == "root" else f"/home/{self.user}"
        else:
            self.home = str(self._home_src or self.state_dir / "home")
        self.host_public_key = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self.netns = f"sky-{owner.tag}-{label}" if owner.mode == "netns" else None
        self.veth = f"skv-{owner.tag}-{label}" if owner.mode == "netns" else None

    def __repr__(self) -> str:
        return f"SSHHost({self.name!r}, {self.user}@{self.address}:{self.port})"

    # -- what a client needs

    @property
    def known_hosts_line(self) -> str:
        """This host's line for a known_hosts file."""
        where = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{where} {self.host_public_key}"

    def ssh_argv(
        self, known_hosts: str | os.PathLike[str], *, strict: str = "accept-new"
    ) -> list[str]:
        """`ssh` argv up to and including the destination; append the remote command. With a
        bastion it jumps through it (the bastion's key is checked against known_hosts too)."""
        argv = [
            "ssh", "-F", "/dev/null", "-i", str(self.key_path), "-p", str(self.port),
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10",
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", f"StrictHostKeyChecking={strict}",
            "-o", "LogLevel=ERROR", f"{self.user}@{self.address}",
        ]  # fmt: skip
        bastion = self._owner.bastion
        if bastion is not None and not self.is_bastion:
            # Not -J: ssh passes its -F (here /dev/null) on to the jump's ssh, but not -i or -o,
            # so the jump would have no key. ssh expands %h/%p, then runs this with sh.
            jump = bastion.ssh_argv(known_hosts, strict=strict)
            jump[-1:-1] = ["-W", "[%h]:%p"]
            argv[-1:-1] = ["-o", f"ProxyCommand={shlex.join(jump)}"]
        return argv

    @property
    def log(self) -> str:
        """sshd's own log (stderr) for this host, across restarts."""
        try:
            return (self.state_dir / "sshd.log").read_text(errors="replace")
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle

    def start(self, *, new_host_key: bool = False, wait: bool = True) -> None:
        """Start sshd (again) and, unless wait=False, wait until it accepts connections.
        A netns host comes back like a rebooted machine: empty HOME and /tmp, no processes."""
        if self.running:
            raise SSHHostError(f"{self} is already running")
        key = self.state_dir / "ssh_host_ed25519_key"
        if new_host_key or not key.exists():
            for f in (key, key.with_suffix(".pub")):
                f.unlink(missing_ok=True)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name, "-f", str(key)])
        self.host_public_key = " ".join(key.with_suffix(".pub").read_text().split()[:2])
        self._launch()
        if wait:
            self._owner._wait_ready([self])

    def _launch(self) -> None:
        owner = self._owner
        sshd = _which("sshd")
        assert sshd is not None
        config = self.state_dir / "sshd_config"
        env = {"PATH": _SBIN_PATH, "LANG": "C.UTF-8"}  # nothing of the client's environment
        if owner.mode == "netns":
            assert self.netns is not None
            config.write_text(self._sshd_config("/run/skyhost"))  # where the host sees it
            env["SSHD"] = sshd
            ids = f"{owner.uid}:{owner.gid}" if owner.user != "root" else ""
            argv = [
                _which("ip") or "ip", "netns", "exec", self.netns,
                # --kill-child: if unshare itself dies, the host's init (and so the host) dies too.
                "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--mount",
                "--propagation", "private", "--",
                "sh", "-c", _HOST_INIT, "sky-host-init", str(self.state_dir), self.name,
                self.home, str(self._home_src or ""), ids, *[str(p) for p in owner.hide],
            ]  # fmt: skip
        else:
            config.write_text(self._sshd_config(str(self.state_dir)))
            if os.geteuid() == 0:
                # sshd as root insists on its privilege-separation dir; it is a standard system
                # directory (packaged via tmpfiles.d), so it is created if missing and left there.
                os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
            argv = [sys.executable, "-c", _REAPER, sshd, "-D", "-e", "-f", str(config)]
        # sshd logs every connection with -e: a file, because an unread pipe would fill up and
        # block sshd. A session of its own: Ctrl-C in the test terminal must not hit the hosts
        # directly; the fixture's cleanup takes them down in order.
        with open(self.state_dir / "sshd.log", "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )

    def _sshd_config(self, state_dir: str) -> str:
        lines = {
            # A bastion listens on both its links, like a real one.
            "ListenAddress": f"{'0.0.0.0' if self.is_bastion else self.address}:{self.port}",
            "HostKey": f"{state_dir}/ssh_host_ed25519_key",
            "PidFile": f"{state_dir}/sshd.pid",
            "AuthorizedKeysFile": f"{state_dir}/authorized_keys",
            "StrictModes": "no",
            "PubkeyAuthentication": "yes",
            "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "PermitRootLogin": "prohibit-password",
            "UsePAM": "no",
            "AllowTcpForwarding": "yes",
            "X11Forwarding": "no",
            "PrintMotd": "no",
            "PrintLastLog": "no",
            "UseDNS": "no",
            "Subsystem": "sftp internal-sftp",
            # Tests open many connections at once (multiplexed or in parallel).
            "MaxSessions": "50",
            "MaxStartups": "100:30:200",
            "LogLevel": "VERBOSE",
        }
        if self._owner.mode == "loopback":
            lines["SetEnv"] = f"HOME={self.home}"
        if _sshd_version() >= (9, 8):
            # Newer sshd penalises addresses whose connections end before authenticating (our
            # readiness probe does exactly that) and then refuses them for a while.
            lines["PerSourcePenalties"] = "no"
        if not self.is_bastion:
            # A test's sshd options shape the hosts; the bastion must keep forwarding.
            lines.update(self._owner.sshd_options)
        return "".join(f"{k} {v}\n" for k, v in lines.items())

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sshd gracefully (SIGTERM, then SIGKILL). In netns mode this powers the host off:
        every process on it dies with it. Idempotent."""
        self._terminate(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL sshd at once (a crashed machine in netns mode). Idempotent."""
        self._terminate(signal.SIGKILL, 5.0)

    def restart(self, *, new_host_key: bool = True) -> None:
        """Stop and start again, by default with a freshly generated host key."""
        self.stop()
        self.start(new_host_key=new_host_key)

    def _terminate(self, sig: int, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        pid_ns = self._pid_namespace(proc)
        if proc.poll() is None:
            self._signal(proc, sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                try:
                    proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    # Last resort; should not happen. (unshare's --kill-child then kills init.)
                    proc.kill()
                    proc.wait()
        self._proc = None
        if pid_ns:
            # A node agent's shared-memory folder (/dev/shm/skyward-node-<pid>-<pid namespace>-*)
            # is removed by the next agent of its pid namespace when the agent was killed; this
            # host's namespace is gone, and /dev/shm is the client's: remove them here.
            for left in Path("/dev/shm").glob(f"skyward-node-*-{pid_ns}-*"):
                shutil.rmtree(left, ignore_errors=True)

    def _pid_namespace(self, proc: subprocess.Popen[bytes]) -> str:
        """netns: the inode of the host's pid namespace, or "" (loopback hosts share the client's)."""
        if self._owner.mode != "netns" or proc.poll() is not None:
            return ""
        try:
            theirs, ours = (os.readlink(f"/proc/{pid}/ns/pid") for pid in (self._init_pid(proc), "self"))
        except OSError:
            return ""
        # (never this process's own: the Local nodes of the tests use it)
        return theirs.rpartition("[")[2].rstrip("]") if theirs != ours else ""

    def _signal(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        """Deliver sig to this host's sshd without orphaning anything.

        Our child (proc) is a launcher whose own child is sshd; the launcher must outlive sshd
        to reap it, since the real PID 1 may never reap an orphan.
        netns: the launcher is `unshare`, which blocks SIGTERM and waits for its one child, the
        host's init (sshd): signal that child directly.
        loopback: the launcher is the reaper, which forwards SIGTERM and turns SIGUSR1 into a
        SIGKILL for sshd."""
        if self._owner.mode == "netns":
            _kill(self._init_pid(proc), sig)
        else:
            _kill(proc.pid, signal.SIGUSR1 if sig == signal.SIGKILL else sig)

    def _init_pid(self, proc: subprocess.Popen[bytes]) -> int:
        """netns: pid of the host's init (sshd), the only child of `unshare`."""
        deadline = time.monotonic() + 2.0
        while True:
            kids = _children(proc.pid)
            if kids or proc.poll() is not None or time.monotonic() > deadline:
                return kids[0] if kids else proc.pid
            time.sleep(0.01)  # just started: unshare has not forked yet

    @property
    def pid(self) -> int | None:
        """pid (in the client's PID namespace) of this host's sshd listener, if running."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        if self._owner.mode == "netns":
            return self._init_pid(self._proc)
        # Without a PID namespace sshd's PidFile holds its real pid.
        try:
            return int((self.state_dir / "sshd.pid").read_text())
        except (OSError, ValueError):
            return None

    # -- network (netns mode)

    def disconnect(self) -> None:
        """Unplug the host's cable: it keeps running but nobody can reach it (netns mode)."""
        self._set_link("down")

    def reconnect(self) -> None:
        self._set_link("up")

    def _set_link(self, state: str) -> None:
        if self.veth is None:
            raise SSHHostError("disconnect/reconnect need netns mode")
        _run(["ip", "link", "set", self.veth, state])


class SSHHosts:
    """n real sshd hosts; use as a context manager (or call start() and close())."""

    def __init__(
        self,
        n: int = 3,
        *,
        mode: Mode = "auto",
        start_timeout: float = 15.0,
        sshd_options: dict[str, str] | None = None,
        hide: Iterable[str | os.PathLike[str]] | None = None,
        shared_home: bool = False,
        user: Literal["auto"] | None = None,
        sudo: Sudo | None = None,
        bastion: bool = False,
    ) -> None:
        """mode: see the module docstring. sshd_options: extra/overriding sshd_config lines (for
        the n hosts, not a bastion). hide: paths to hide from netns hosts (default: this
        repository's checkout). shared_home, user, sudo, bastion: the fleet shapes of the module
        docstring (user and bastion need netns mode: SSHHostsUnavailable without it)."""
        if not 1 <= n <= 200:
            raise ValueError("n must be between 1 and 200 (host i gets address .(10+i) of a /24)")
        if user not in (None, "auto"):
            # Only accounts made (and so safely deleted) here: never an existing one.
            raise ValueError(f"user={user!r}: use user='auto' (an account made for these hosts)")
        if sudo not in (None, "nopasswd", "password"):
            raise ValueError(f"sudo={sudo!r}: use 'nopasswd', 'password' or None")
        if sudo is not None and user is None:
            raise ValueError("sudo= needs a login user that is not root: add user='auto'")
        if mode == "loopback" and (user is not None or bastion):
            raise ValueError("user= and bastion= need mode='netns' (or 'auto')")
        self.n = n
        self.requested_mode = mode
        self.start_timeout = start_timeout
        self.sshd_options = dict(sshd_options or {})
        self.hide = [Path(p) for p in hide] if hide is not None else _default_hide()
        self.shared_home = shared_home
        self.requested_user = user
        self.sudo = sudo
        self.wants_bastion = bastion
        self.mode: Literal["netns", "loopback"] = "loopback"
        self.tag = secrets.token_hex(3)
        self.hosts: list[SSHHost] = []
        self.bastion: SSHHost | None = None
        self.user = ""
        self.uid, self.gid = os.geteuid(), os.getegid()  # of the login user
        self.tmpdir = Path()
        self.client_key = Path()
        self.shared_home_dir: Path | None = None
        self.bridge: str | None = None
        self.subnet: ipaddress.IPv4Network | None = None
        self.inner_bridge: str | None = None
        self.inner_subnet: ipaddress.IPv4Network | None = None
        self.client_address = ""  # how hosts reach the client (not the hosts behind a bastion)
        self._undo = contextlib.ExitStack()
        self._started = False

    def __enter__(self) -> SSHHosts:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, i: int) -> SSHHost:
        return self.hosts[i]

    def __iter__(self) -> Iterator[SSHHost]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def _every_host(self) -> list[SSHHost]:
        """The bastion, if any, then the hosts."""
        return [*([self.bastion] if self.bastion else []), *self.hosts]

    @property
    def jump(self) -> str | None:
        """The bastion as ``ssh -J`` / ProxyJump takes it ("user@address:port"), or None."""
        b = self.bastion
        return None if b is None else f"{b.user}@{b.address}:{b.port}"

    def write_known_hosts(self, path: str | os.PathLike[str]) -> Path:
        """Write a known_hosts file listing every host's current key (and the bastion's)."""
        p = Path(path)
        p.write_text("".join(h.known_hosts_line + "\n" for h in self._every_host()))
        return p

    def write_ssh_config(
        self, path: str | os.PathLike[str], *, known_hosts: str | os.PathLike[str] | None = None
    ) -> Path:
        """Write an OpenSSH client config with a Host block per host address (and the bastion's),
        so that ``ssh -F PATH ADDRESS cmd`` works: the key, user, port, strict host key checking
        against known_hosts (written here, default PATH.known_hosts) and, behind a bastion,
        ``ProxyJump``. Options given to ssh with -o take precedence."""
        p = Path(path)
        kh = self.write_known_hosts(known_hosts or p.with_name(p.name + ".known_hosts"))
        blocks = []
        for h in self._every_host():
            lines = [
                f"Host {h.address}",
                f"    HostName {h.address}",
                f"    User {h.user}",
                f"    Port {h.port}",
                f"    IdentityFile {h.key_path}",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {kh}",
                "    StrictHostKeyChecking yes",
                "    BatchMode yes",
                "    ConnectTimeout 10",
            ]
            if self.bastion is not None and h is not self.bastion:
                lines.append(f"    ProxyJump {self.jump}")
            blocks.append("\n".join(lines) + "\n")
        p.write_text("\n".join(blocks))
        return p

    # -- setup

    def start(self) -> None:
        if self._started:
            raise SSHHostError("SSHHosts.start() called twice")
        self._started = True
        reason = unavailable_reason(
            self.requested_mode, user=self.requested_user, sudo=self.sudo,
            bastion=self.wants_bastion,
        )  # fmt: skip
        if reason:
            raise SSHHostsUnavailable(reason)
        needs_netns = self.requested_user is not None or self.wants_bastion
        self.mode = "netns" if needs_netns else resolve_mode(self.requested_mode)
        sweep_stale()
        try:
            self._setup()
        except BaseException:
            # Also on KeyboardInterrupt: undo whatever part of the setup happened.
            self.close()
            raise

    def _setup(self) -> None:
        self.tmpdir = Path(tempfile.mkdtemp(prefix=f"sky-sshhosts-{self.tag}-"))
        self._undo.callback(shutil.rmtree, self.tmpdir, ignore_errors=True)
        # Who owns this dir, so that a later run can sweep it if this process dies unannounced.
        (self.tmpdir / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        if self.mode == "netns" and self.tmpdir.resolve().is_relative_to("/run"):
            # The host init replaces /run before binding the state dir into it.
            raise SSHHostError(f"temp dir {self.tmpdir} must not be under /run (set TMPDIR)")
        if self.requested_user is not None:
            self._setup_user()
        else:
            self.user = "root" if self.mode == "netns" else getpass.getuser()
        if self.shared_home:
            self.shared_home_dir = self.tmpdir / "shared-home"
            self.shared_home_dir.mkdir(mode=0o700)
            os.chown(self.shared_home_dir, self.uid, self.gid)
        self.client_key = self.tmpdir / "id_ed25519"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sky-test-client",
              "-f", str(self.client_key)])  # fmt: skip
        client_pub = self.client_key.with_suffix(".pub").read_text()

        if self.mode == "netns":
            self._setup_network()
        else:
            self._setup_loopback_addresses()

        hosts_file = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
        if self.mode == "netns":
            hosts_file += f"{self.client_address} sky-client\n"
            if self.bastion is not None and self.inner_subnet is not None:
                hosts_file += f"{self.inner_subnet.network_address + 1} {self.bastion.name}\n"
            hosts_file += "".join(f"{h.address} {h.name}\n" for h in self.hosts)
        every = self._every_host()
        for h in every:
            # sshd reads authorized_keys as the login user (netns: the state dir is bound at
            # /run/skyhost), so the dir is traversable and the file readable by anyone. Explicit
            # modes: a umask of 077 must not lock a login user out.
            h.state_dir.mkdir()
            h.state_dir.chmod(0o711)
            for name, text in (("authorized_keys", client_pub), ("hosts", hosts_file)):
                (h.state_dir / name).write_text(text)
                (h.state_dir / name).chmod(0o644)
            if self.requested_user is not None:
                rules = h.state_dir / "sudoers.d"
                rules.mkdir(mode=0o700)
                if self.sudo is not None:
                    tags = "NOPASSWD: " if self.sudo == "nopasswd" else ""
                    (rules / "skyward-test").write_text(f"{self.user} ALL=(ALL) {tags}ALL\n")
            if self.mode == "loopback" and not Path(h.home).exists():
                Path(h.home).mkdir()

        # The hosts' processes go before the network and the temp dir (ExitStack is LIFO).
        for h in every:
            self._undo.callback(h.kill)
            h.start(wait=False)  # all at once, then wait for all
        self._wait_ready(every)

    def _setup_user(self) -> None:
        """Make the login account (user="auto"). Deleted at close, or by sweep_stale when this
        process dies: the temp dir names it, its GECOS field says it is ours."""
        self.user = name = f"sky{self.tag}"
        self._undo.callback(_delete_user, name, self.tag)
        (self.tmpdir / "user").write_text(name + "\n")
        _run(["useradd", "-M", "-d", f"/home/{name}", "-s", "/bin/bash",
              "-c", _user_marker(self.tag), name])  # fmt: skip
        # useradd makes a locked account ("!"), which sshd refuses without PAM even with a key.
        _run(["usermod", "-p", "*", name])
        entry = pwd.getpwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        # The hosts mount its home here in their own mount namespaces; the real dir stays empty.
        mountpoint = Path("/home") / name
        self._undo.callback(_remove_empty_dir, mountpoint)
        mountpoint.mkdir(mode=0o755)

    def _setup_network(self) -> None:
        self.subnet = _free_subnet()
        base = self.subnet.network_address
        self.client_address = str(base + 1)
        self.bridge = f"skb-{self.tag}"
        self._undo.callback(_delete_link, self.bridge)
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.client_address}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        hosts_bridge, hosts_base = self.bridge, base
        if self.wants_bastion:
            hosts_bridge, hosts_base = self._setup_bastion(base)
        for i in range(self.n):
            h = SSHHost(self, i, f"sky-{self.tag}-{i}", str(hosts_base + 10 + i), 22)
            self.hosts.append(h)
            self._plug(h, hosts_bridge, f"{h.address}/24")

    def _setup_bastion(self, base: ipaddress.IPv4Address) -> tuple[str, ipaddress.IPv4Address]:
        """The bastion on the client's bridge, and the inner bridge behind it; returns the inner
        bridge and its /24's base address."""
        b = SSHHost(self, -1, f"sky-{self.tag}-b", str(base + 10), 22, label="b")
        self.bastion = b
        self._plug(b, self.bridge or "", f"{b.address}/24")
        assert b.netns is not None
        # A new namespace may inherit IP forwarding from the root one: off, so that only SSH
        # jumping (the bastion's sshd) reaches the inner hosts.
        _run(["ip", "netns", "exec", b.netns,
              "sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_forward"])  # fmt: skip
        self.inner_subnet = inner = _free_subnet()
        # No address for the client on it. An unreachable route instead: another SSHHosts never
        # takes this /24 for its bridge, and the client gets "no route" at once. The file tells
        # sweep_stale which route to remove.
        (self.tmpdir / "inner-subnet").write_text(f"{inner}\n")
        self._undo.callback(_delete_route, str(inner))
        _run(["ip", "route", "add", "unreachable", str(inner)])
        self.inner_bridge = f"skbi-{self.tag}"
        self._undo.callback(_delete_link, self.inner_bridge)
        _run(["ip", "link", "add", self.inner_bridge, "type", "bridge"])
        _run(["ip", "link", "set", self.inner_bridge, "up"])
        self._plug(b, self.inner_bridge, f"{inner.network_address + 1}/24",
                   veth=f"{b.veth}i", dev="eth1")  # fmt: skip
        return self.inner_bridge, inner.network_address

    def _plug(
        self, h: SSHHost, bridge: str, cidr: str, *, veth: str | None = None, dev: str = "eth0"
    ) -> None:
        """Give h a link `dev` with address cidr on bridge (creating h's namespace first, for
        eth0). Only the /24: the kernel adds the subnet route, and there is no default route."""
        assert h.netns is not None and h.veth is not None
        veth = veth or h.veth
        if dev == "eth0":
            self._undo.callback(_delete_netns, h.netns)
            _run(["ip", "netns", "add", h.netns])
            _run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
        self._undo.callback(_delete_link, veth)
        # The peer is created straight inside the namespace, so no stray eth0 ever shows up in
        # the root namespace.
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", dev, "netns", h.netns])
        _run(["ip", "link", "set", veth, "master", bridge, "up"])
        _run(["ip", "-n", h.netns, "addr", "add", cidr, "dev", dev])
        _run(["ip", "-n", h.netns, "link", "set", dev, "up"])

    def _setup_loopback_addresses(self) -> None:
        # All of 127/8 is local on Linux: distinct addresses keep hosts apart in ssh/known_hosts.
        x = random.randrange(256)
        self.client_address = "127.0.0.1"
        for i in range(self.n):
            address = f"127.213.{x}.{10 + i}"
            self.hosts.append(SSHHost(self, i, socket.gethostname(), address, free_port(address)))

    def _wait_ready(self, hosts: Sequence[SSHHost]) -> None:
        """Wait until every host's sshd answers with its SSH banner (from the client, or from
        the bastion for the hosts behind one)."""
        deadline = time.monotonic() + self.start_timeout
        pending = list(hosts)
        while pending:
            for h in list(pending):
                if h._proc is None or h._proc.poll() is not None:
                    raise SSHHostError(f"sshd of {h} exited during startup; its log:\n{h.log}")
                # The client has no route to the hosts behind a bastion: ask from the bastion.
                via = self.bastion.netns if self.bastion and h is not self.bastion else None
                if _banner_ok(h.address, h.port, via):
                    pending.remove(h)
            if pending and time.monotonic() > deadline:
                h = pending[0]
                raise SSHHostError(
                    f"sshd of {h} not accepting connections after {self.start_timeout}s; "
                    f"its log:\n{h.log}"
                )
            if pending:
                time.sleep(0.02)

    # -- cleanup

    def close(self) -> None:
        """Stop every host and remove every namespace, link and file. Idempotent."""
        self._undo.close()


def _default_hide() -> list[Path]:
    """The client's checkout and its virtualenv (wherever it lives): a host must not import the
    client's skyward or its dependencies by accident."""
    hide = []
    # Only a real checkout, never a system directory if this file was installed oddly.
    if len(_REPO_ROOT.parts) > 2 and (_REPO_ROOT / "tests").is_dir():
        hide.append(_REPO_ROOT)
    if sys.prefix != sys.base_prefix and not Path(sys.prefix).is_relative_to(_REPO_ROOT):
        hide.append(Path(sys.prefix))
    return hide


def _banner_ok(address: str, port: int, netns: str | None = None) -> bool:
    """Whether an sshd answers at address:port, seen from this process or from netns."""
    try:
        s = _socket_in_netns(netns) if netns else socket.socket()
        with s:
            s.settimeout(0.5)
            s.connect((address, port))
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


_CLONE_NEWNET = 0x40000000


def _socket_in_netns(netns: str) -> socket.socket:
    """A TCP socket in the network namespace named netns (`ip netns`). A socket stays in the
    namespace it was made in, so a throwaway thread enters the namespace to make it and this
    process's own threads stay where they are (Python 3.11 has no os.setns)."""
    made: list[socket.socket | OSError] = []

    def enter_and_make() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            made.append(socket.socket())
        except OSError as e:
            made.append(e)

    t = threading.Thread(target=enter_and_make, name=f"netns-{netns}", daemon=True)
    t.start()
    t.join()
    if isinstance(made[0], OSError):
        raise made[0]
    return made[0]


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 10.213.X.0/24 that overlaps no address or route on this machine."""
    used: list[ipaddress.IPv4Network] = []
    for entry in json.loads(_run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]"):
        for a in entry.get("addr_info", []):
            used.append(ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network)
    for r in json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]"):
        dst = r.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(dst, strict=False))
    candidates = list(_NETNS_POOL.subnets(new_prefix=24))
    random.shuffle(candidates)
    # Never an address an earlier set of this process had: hosts there had other host keys,
    # which a client that recorded them (trust on first use) rightly refuses.
    fresh = [net for net in candidates if net not in _HANDED_OUT] or candidates
    for net in fresh:
        if not any(net.overlaps(u) for u in used):
            _HANDED_OUT.add(net)
            return net
    raise SSHHostError("no free /24 left in 10.213.0.0/16")


_HANDED_OUT: set[ipaddress.IPv4Network] = set()


_STATE_DIR_NAME = re.compile(r"sky-sshhosts-([0-9a-f]{6})-")


def sweep_stale() -> list[str]:
    """Remove what SSHHosts of dead processes left behind; return their tags.

    A test process killed outright (SIGKILL, a CI job cancelled) cannot run its cleanup. Every
    SSHHosts records its owner (pid and start time) in its temp dir; this removes the hosts,
    namespaces, links and dir of every owner that is gone. Runs at each SSHHosts.start()."""
    swept = []
    for d in Path(tempfile.gettempdir()).glob("sky-sshhosts-*"):
        m = _STATE_DIR_NAME.match(d.name)
        try:
            pid, started = (d / "owner").read_text().split()
        except (OSError, ValueError):
            continue  # not one of ours, someone else's, or being created right now
        if m is None or _start_time(int(pid)) == started:
            continue  # owner alive
        tag = m.group(1)
        if os.geteuid() == 0 and _which("ip"):
            for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines():
                ns = line.split(" ", 1)[0]
                if ns.startswith(f"sky-{tag}-"):
                    _delete_netns(ns)
            _delete_link(f"skb-{tag}")
            _delete_link(f"skbi-{tag}")
            with contextlib.suppress(OSError, ValueError):
                _delete_route(str(ipaddress.ip_network((d / "inner-subnet").read_text().strip())))
        # Loopback hosts: the reaper and sshd name the dir in their command lines. SIGTERM lets
        # the reaper take sshd and its sessions down with it.
        pids = _pids_mentioning(str(d))
        for p in pids:
            _kill(p, signal.SIGTERM)
        for p in _wait_dead(pids, 5.0):
            _kill(p, signal.SIGKILL)
        # The login account last: userdel refuses while its processes run.
        if os.geteuid() == 0:
            with contextlib.suppress(OSError):
                name = (d / "user").read_text().strip()
                if re.fullmatch(r"sky[0-9a-f]{6}", name):
                    _delete_user(name, tag)
                    _remove_empty_dir(Path("/home") / name)
        shutil.rmtree(d, ignore_errors=True)
        swept.append(tag)
    return swept


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pids_mentioning(text: str) -> list[int]:
    needle = text.encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _user_marker(tag: str) -> str:
    """The GECOS field of a login account made by SSHHosts `tag`."""
    return f"skyward test host {tag}"


def _delete_user(name: str, tag: str) -> None:
    """Delete the account `name` if SSHHosts `tag` made it (its GECOS says so); never another."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return
    if entry.pw_gecos == _user_marker(tag):
        # -f: delete even if a process of it is still running somewhere (it should not be).
        _run(["userdel", "-f", name], check=False)


def _remove_empty_dir(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.rmdir()  # only an empty one: it was just a mountpoint


def _delete_route(subnet: str) -> None:
    _run(["ip", "route", "del", "unreachable", subnet], check=False)


def _delete_link(name: str) -> None:
    if Path(f"/sys/class/net/{name}").exists():
        _run(["ip", "link", "del", name], check=False)


def _delete_netns(name: str) -> None:
    """Kill whatever still runs in the namespace, then delete it."""
    if not Path(f"/run/netns/{name}").exists():
        return

    # Normally nothing runs there any more: each host's init was stopped first and took its
    # host down with it. Otherwise (a sweep, a failed stop) kill the inits first, so that their
    # launchers (`unshare`) reap them; killing a launcher first would leave its init to a PID 1
    # that may never reap it. Then whatever is left. None of these is our child, so wait for
    # them to die rather than wait() for them.
    def pids() -> list[int]:
        out = _run(["ip", "netns", "pids", name], check=False).stdout
        return [int(p) for p in out.split()]

    inits = [p for p in pids() if _parent_comm(p) == "unshare"]
    for p in inits:
        _kill(p, signal.SIGKILL)
    _wait_dead(inits, 5.0, reaped=True)  # reaped by their launchers, which then exit
    rest = pids()
    for p in rest:
        _kill(p, signal.SIGKILL)
    _wait_dead(rest, 5.0)
    _run(["ip", "netns", "del", name], check=False)


def _parent_comm(pid: int) -> str:
    info = _ppid_and_state(pid)
    try:
        return Path(f"/proc/{info[0]}/comm").read_text().strip() if info else ""
    except OSError:
        return ""
