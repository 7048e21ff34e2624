"""The SSH test hosts themselves: reachable, isolated, and gone without a trace afterwards.

Everything here talks to the hosts through the system `ssh` client, as a provider would."""

from __future__ import annotations

import base64
import ipaddress
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sshhosts
from sshhosts import Mode, SSHHost, SSHHostError, SSHHosts, SSHHostsUnavailable, unavailable_reason

MakeHosts = Callable[..., SSHHosts]

# Every fleet shape at once.
FLEET: dict[str, Any] = {"shared_home": True, "user": "auto", "sudo": "nopasswd", "bastion": True}

pytestmark = pytest.mark.skipif(
    unavailable_reason("loopback") is not None, reason=str(unavailable_reason("loopback"))
)


@pytest.fixture
def known_hosts(tmp_path: Path) -> Path:
    return tmp_path / "known_hosts"


def ssh(
    host: SSHHost,
    command: str,
    known_hosts: Path,
    *,
    check: bool = True,
    strict: str = "accept-new",
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [*host.ssh_argv(known_hosts, strict=strict), command],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, f"ssh {host} {command!r}: {proc.stderr}"
    return proc


def keyscan(host: SSHHost) -> str:
    """The host key the server presents, as "ssh-ed25519 AAAA..."."""
    out = subprocess.run(
        ["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(host.port), host.address],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    lines = [ln for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == 1, out
    return " ".join(lines[0].split()[1:3])


def require_netns(hosts: SSHHosts) -> None:
    if hosts.mode != "netns":
        pytest.skip(f"needs namespaced hosts: {unavailable_reason('netns')}")


# -- reachability and identity


def test_every_host_answers_on_its_own_address(three_hosts: SSHHosts, known_hosts: Path) -> None:
    assert len({(h.address, h.port) for h in three_hosts}) == 3
    for h in three_hosts:
        assert ssh(h, "echo ok", known_hosts).stdout == "ok\n"
        assert ssh(h, "id -un", known_hosts).stdout.strip() == h.user


def test_host_public_key_is_what_the_server_presents(
    three_hosts: SSHHosts, known_hosts: Path
) -> None:
    three_hosts.write_known_hosts(known_hosts)
    for h in three_hosts:
        assert keyscan(h) == h.host_public_key
        # Strict checking against the file we wrote: proves known_hosts_line is usable as is.
        assert ssh(h, "true", known_hosts, strict="yes").returncode == 0


def test_hosts_have_distinct_hostnames_and_addresses(
    three_hosts: SSHHosts, known_hosts: Path
) -> None:
    require_netns(three_hosts)
    for h in three_hosts:
        name, addrs, eth0, hosts_file = ssh(
            h, "hostname; echo @; hostname -I; echo @; ip -4 addr show dev eth0; echo @; "
            "cat /etc/hosts", known_hosts
        ).stdout.split("@\n")  # fmt: skip
        assert name.strip() == h.name
        assert addrs.split() == [h.address]
        assert f"inet {h.address}/24" in eth0
        # /etc/hosts on each host names the others and the client.
        assert all(f"{o.address} {o.name}" in hosts_file for o in three_hosts)
    assert len({h.name for h in three_hosts}) == 3


def test_hosts_reach_each_other(three_hosts: SSHHosts, known_hosts: Path) -> None:
    require_netns(three_hosts)
    h0, h1 = three_hosts[0], three_hosts[1]
    port = 7000 + secrets.randbelow(1000)
    listener = (
        "import socket\n"
        f"s = socket.create_server(({h1.address!r}, {port}))\n"
        "print('ready', flush=True)\n"
        "c, _ = s.accept()\n"
        "c.sendall(socket.gethostname().encode())\n"
        "c.close()\n"
    )
    server = subprocess.Popen(
        [*h1.ssh_argv(known_hosts), f"python3 -c {shlex.quote(listener)}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        assert server.stdout.readline() == "ready\n", server.stderr
        client = (
            "import socket\n"
            f"c = socket.create_connection(({h1.address!r}, {port}), timeout=10)\n"
            "print(c.recv(100).decode())\n"
        )
        got = ssh(h0, f"python3 -c {shlex.quote(client)}", known_hosts).stdout.strip()
        assert got == h1.name
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()


def test_hosts_reach_the_client(three_hosts: SSHHosts, known_hosts: Path) -> None:
    require_netns(three_hosts)
    with socket.create_server((three_hosts.client_address, 0)) as srv:
        srv.settimeout(30)
        port = srv.getsockname()[1]
        got: list[bytes] = []

        def accept() -> None:
            conn, _ = srv.accept()
            with conn:
                got.append(conn.recv(100))

        t = threading.Thread(target=accept)
        t.start()
        h = three_hosts[2]
        code = (
            "import socket\n"
            f"socket.create_connection(({three_hosts.client_address!r}, {port}), timeout=10)"
            ".sendall(socket.gethostname().encode())\n"
        )
        ssh(h, f"python3 -c {shlex.quote(code)}", known_hosts)
        t.join(timeout=30)
    assert got == [h.name.encode()]


def test_hosts_have_no_route_out(three_hosts: SSHHosts, known_hosts: Path) -> None:
    require_netns(three_hosts)
    assert three_hosts.subnet is not None
    for h in three_hosts:
        main_table, every, lookup = ssh(
            h,
            "ip -4 route show; echo @; ip -4 route show table all; ip -6 route show table all; "
            # A route lookup only (no packet is sent): nothing outside the subnet is routable.
            "echo @; ip route get 192.0.2.1 2>&1 || true",
            known_hosts,
        ).stdout.split("@\n")
        routes = main_table.splitlines()
        assert routes and all(r.startswith(f"{three_hosts.subnet} dev eth0") for r in routes)
        assert "default" not in every
        assert "unreachable" in lookup


def test_home_and_client_files_are_private(
    three_hosts: SSHHosts, known_hosts: Path, tmp_path: Path
) -> None:
    require_netns(three_hosts)
    marker = tmp_path / "client-only"
    marker.write_text("x")
    h0, h1 = three_hosts[0], three_hosts[1]
    assert ssh(h0, 'echo "$HOME"; pwd', known_hosts).stdout.split() == ["/root", "/root"]
    client_paths = [
        marker,
        Path.home() / ".skyward",
        Path(os.environ.get("SKYWARD_HOME", tmp_path)),  # the suite's cache dir (under /tmp)
        Path(__file__).resolve().parents[2] / "pyproject.toml",  # the client's checkout
        Path(sys.prefix),  # the client's venv
    ]
    existing = [str(p) for p in client_paths if p.exists()]
    assert str(marker) in existing
    for h in (h0, h1):
        # Fresh HOME (nothing but what our own ssh logins may have created); none of it visible.
        out = ssh(h, f"ls -A ~; for p in {shlex.join(existing)}; do test -e $p && echo $p; done; true",
                  known_hosts).stdout  # fmt: skip
        assert set(out.split()) <= {".ssh"}
    # Writes to one host's HOME and /tmp are seen neither by another host nor by the client.
    name = f"written-{secrets.token_hex(4)}"
    ssh(h0, f"touch ~/{name} /tmp/{name}", known_hosts)
    assert ssh(h1, f"test -e ~/{name} || test -e /tmp/{name}", known_hosts, check=False).returncode
    assert not (Path("/root") / name).exists() and not (Path("/tmp") / name).exists()


def test_loopback_mode_gives_each_host_its_own_home(
    ssh_hosts: MakeHosts, known_hosts: Path
) -> None:
    hosts = ssh_hosts(2, mode="loopback")
    homes = [ssh(h, 'echo "$HOME"', known_hosts).stdout.strip() for h in hosts]
    assert homes == [h.home for h in hosts] and len(set(homes)) == 2
    assert all(Path(home).is_relative_to(hosts.tmpdir) for home in homes)
    assert [keyscan(h) for h in hosts] == [h.host_public_key for h in hosts]


# -- fleet shapes: shared home, a login user that is not root, sudo, a bastion


def test_shared_home_is_one_directory_on_every_host(
    shared_home_hosts: SSHHosts, known_hosts: Path
) -> None:
    hosts = shared_home_hosts
    assert hosts.shared_home_dir is not None and hosts.shared_home_dir.is_dir()
    name = f"shared-{secrets.token_hex(4)}"
    ssh(hosts[0], f"echo written-on-0 > ~/{name}", known_hosts)
    for h in hosts:
        home, content = ssh(h, f'echo "$HOME"; cat ~/{name}', known_hosts).stdout.split()
        assert home == h.home and content == "written-on-0"
    assert (hosts.shared_home_dir / name).read_text() == "written-on-0\n"
    if hosts.mode == "netns":
        # Still distinct machines: own hostnames, own /tmp.
        assert [ssh(h, "hostname", known_hosts).stdout.strip() for h in hosts] == [
            h.name for h in hosts
        ]
        assert len({h.name for h in hosts}) == 3
        ssh(hosts[0], f"touch /tmp/{name}", known_hosts)
        assert ssh(hosts[1], f"test -e /tmp/{name}", known_hosts, check=False).returncode == 1


def test_shared_home_in_loopback_mode(ssh_hosts: MakeHosts, known_hosts: Path) -> None:
    hosts = ssh_hosts(2, mode="loopback", shared_home=True)
    assert hosts.shared_home_dir is not None
    homes = {ssh(h, 'echo "$HOME"', known_hosts).stdout.strip() for h in hosts}
    assert homes == {str(hosts.shared_home_dir)} == {h.home for h in hosts}
    ssh(hosts[1], f"echo from-1 > {hosts[1].home}/f", known_hosts)
    assert ssh(hosts[0], "cat $HOME/f", known_hosts).stdout == "from-1\n"


def _passwd_entry(user: str) -> str:
    return subprocess.run(["getent", "passwd", user], capture_output=True, text=True).stdout


def test_login_user_is_not_root(ssh_hosts: MakeHosts, known_hosts: Path) -> None:
    hosts = ssh_hosts(2, user="auto")
    name = hosts.user
    assert name.startswith("sky") and name != "root" and len(name) <= 32
    assert all(h.user == name and h.home == f"/home/{name}" for h in hosts)
    entry = _passwd_entry(name).split(":")
    assert entry[0] == name and entry[5] == f"/home/{name}" and entry[6].strip() == "/bin/bash"
    for h in hosts:
        uid, user, home, pwd, owner, mode = ssh(
            h, 'id -u; id -un; echo "$HOME"; pwd; stat -c "%U %a" ~', known_hosts
        ).stdout.split()  # fmt: skip
        assert uid != "0" and int(uid) == int(entry[2]) and user == name
        assert home == pwd == f"/home/{name}"
        assert (owner, mode) == (name, "700")
        ssh(h, "echo ok > ~/written && cat ~/written && mkdir -p ~/.skyward", known_hosts)
    # Each host's home is its own (a tmpfs in its mount namespace); the real one stays an empty
    # mountpoint.
    ssh(hosts[0], "touch ~/only-on-0", known_hosts)
    assert ssh(hosts[1], "test -e ~/only-on-0", known_hosts, check=False).returncode == 1
    assert list(Path(f"/home/{name}").iterdir()) == []
    # The client's key stays private even though the hosts' state dirs are open to the user.
    assert (hosts.client_key.stat().st_mode & 0o777) == 0o600
    assert ssh(hosts[0], "sudo -n true", known_hosts, check=False).returncode != 0


def test_login_user_with_a_shared_home(ssh_hosts: MakeHosts, known_hosts: Path) -> None:
    hosts = ssh_hosts(2, user="auto", shared_home=True)
    assert hosts.shared_home_dir is not None
    assert hosts.shared_home_dir.stat().st_uid == hosts.uid != 0
    ssh(hosts[0], "echo from-0 > ~/f", known_hosts)
    assert ssh(hosts[1], 'cat ~/f; echo "$HOME"', known_hosts).stdout.split() == [
        "from-0",
        f"/home/{hosts.user}",
    ]
    assert (hosts.shared_home_dir / "f").stat().st_uid == hosts.uid


def _as_root_on(host: SSHHost, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run argv as root inside host's namespaces (the login user cannot look at sudo's rules)."""
    assert host.pid is not None
    return subprocess.run(
        ["nsenter", "-t", str(host.pid), "-m", "-u", "-n", "-p", "--", *argv],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_sudo_nopasswd(ssh_hosts: MakeHosts, known_hosts: Path) -> None:
    before = sorted(os.listdir("/etc/sudoers.d"))
    hosts = ssh_hosts(2, user="auto", sudo="nopasswd")
    for h in hosts:
        assert ssh(h, "sudo -n true && sudo -n id -u", known_hosts).stdout == "0\n"
    assert sorted(os.listdir("/etc/sudoers.d")) == before  # the machine's own is untouched


@pytest.mark.parametrize("sudo", ["password", None])
def test_sudo_that_needs_a_password_or_is_not_allowed(
    ssh_hosts: MakeHosts, known_hosts: Path, sudo: str | None
) -> None:
    before = sorted(os.listdir("/etc/sudoers.d"))
    h = ssh_hosts(1, user="auto", sudo=sudo)[0]
    denied = ssh(h, "sudo -n true", known_hosts, check=False)
    assert denied.returncode != 0
    # sudo asks for the password before it says whether the rules allow the user at all.
    assert "password" in denied.stderr or "sudoers" in denied.stderr, denied.stderr
    # What the host's sudo says of the user's rules (as root on the host):
    rules = _as_root_on(h, "sudo", "-l", "-U", h.user)
    assert rules.returncode == 0, rules.stderr
    if sudo == "password":
        assert "(ALL) ALL" in rules.stdout and "NOPASSWD" not in rules.stdout
    else:
        assert "is not allowed to run sudo" in rules.stdout
    assert sorted(os.listdir("/etc/sudoers.d")) == before


def test_fleet_shape_options_are_checked() -> None:
    with pytest.raises(ValueError, match="user='auto'"):
        SSHHosts(1, sudo="nopasswd")
    with pytest.raises(ValueError, match="netns"):
        SSHHosts(1, mode="loopback", user="auto")
    with pytest.raises(ValueError, match="netns"):
        SSHHosts(1, mode="loopback", bastion=True)
    with pytest.raises(ValueError, match="user='auto'"):
        SSHHosts(1, user="ubuntu")  # type: ignore[arg-type]


def test_missing_sudo_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = sshhosts._which
    monkeypatch.setattr(
        sshhosts, "_which", lambda name: None if name == "sudo" else real_which(name)
    )
    reason = unavailable_reason(user="auto", sudo="nopasswd")
    if os.geteuid() == 0:
        assert reason is not None and "apt-get install sudo" in reason
    hosts = SSHHosts(1, user="auto", sudo="nopasswd")
    with pytest.raises(SSHHostsUnavailable):
        hosts.start()
    hosts.close()


def test_bastion_is_the_only_way_in(
    bastion_hosts: SSHHosts, known_hosts: Path, tmp_path: Path
) -> None:
    hosts = bastion_hosts
    b = hosts.bastion
    assert b is not None and hosts.subnet and hosts.inner_subnet
    assert hosts.jump == f"{b.user}@{b.address}:{b.port}"
    assert ipaddress.ip_address(b.address) in hosts.subnet
    assert all(ipaddress.ip_address(h.address) in hosts.inner_subnet for h in hosts)
    # The client reaches the bastion, and no inner host.
    assert ssh(b, "hostname", known_hosts).stdout.strip() == b.name
    for h in hosts:
        started = time.monotonic()
        with pytest.raises(OSError):
            socket.create_connection((h.address, h.port), timeout=2).close()
        assert time.monotonic() - started < 3
    # Through the bastion, with the config written for it (ProxyJump) and with ssh_argv.
    config = hosts.write_ssh_config(tmp_path / "ssh_config")
    assert f"ProxyJump {hosts.jump}" in config.read_text()
    for h in hosts:
        got = subprocess.run(
            ["ssh", "-F", str(config), h.address, "hostname"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert (got.returncode, got.stdout.strip()) == (0, h.name), got.stderr
        assert ssh(h, "hostname", known_hosts).stdout.strip() == h.name


def test_behind_a_bastion_hosts_reach_each_other_and_nothing_else(
    bastion_hosts: SSHHosts, known_hosts: Path
) -> None:
    hosts = bastion_hosts
    b = hosts.bastion
    assert b is not None and hosts.inner_subnet
    h0, h1 = hosts[0], hosts[1]
    # Directly over the inner bridge, no hop.
    ssh(h1, f"bash -c 'echo > /dev/tcp/{h0.address}/22'", known_hosts)
    # /etc/hosts names the hosts and the bastion (at the address they can reach).
    hosts_file = ssh(h1, "cat /etc/hosts", known_hosts).stdout
    bastion_inner = hosts.inner_subnet.network_address + 1
    assert f"{bastion_inner} {b.name}" in hosts_file
    assert all(f"{h.address} {h.name}" in hosts_file for h in hosts)
    ssh(h1, f"bash -c 'echo > /dev/tcp/{b.name}/22'", known_hosts)
    # An inner host has no route to the client's side; the bastion does not forward.
    for h in hosts:
        routes = ssh(h, f"ip -4 route show; echo @; ip route get {hosts.client_address} 2>&1 || true",
                     known_hosts).stdout.split("@\n")  # fmt: skip
        assert [r.split()[0] for r in routes[0].splitlines()] == [str(hosts.inner_subnet)]
        assert "unreachable" in routes[1]
    assert ssh(b, "cat /proc/sys/net/ipv4/ip_forward", known_hosts).stdout == "0\n"
    links = ssh(b, "ip -4 -br addr", known_hosts).stdout
    assert f"{b.address}/24" in links and f"{bastion_inner}/24" in links


def test_a_host_behind_a_bastion_restarts(ssh_hosts: MakeHosts, known_hosts: Path) -> None:
    hosts = ssh_hosts(1, bastion=True)
    h = hosts[0]
    ssh(h, "touch /tmp/before", known_hosts)
    h.restart(new_host_key=False)  # waits for it through the bastion
    assert ssh(h, "test -e /tmp/before || echo rebooted", known_hosts).stdout == "rebooted\n"


# -- host lifecycle


def test_restart_with_new_host_key(ssh_hosts: MakeHosts, known_hosts: Path) -> None:
    host = ssh_hosts(1)[0]
    old = host.host_public_key
    assert keyscan(host) == old
    ssh(host, "true", known_hosts)  # records the old key (accept-new)
    host.restart(new_host_key=True)
    assert host.host_public_key != old
    assert keyscan(host) == host.host_public_key
    changed = ssh(host, "true", known_hosts, check=False)
    assert changed.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in changed.stderr
    # Same key kept on a plain restart.
    host.restart(new_host_key=False)
    assert keyscan(host) == host.host_public_key


def test_stop_kill_and_start(ssh_hosts: MakeHosts, known_hosts: Path) -> None:
    hosts = ssh_hosts(2)
    h0, h1 = hosts[0], hosts[1]
    for stop in (h0.stop, h0.kill):
        stop()
        assert not h0.running and h0.pid is None
        lost = ssh(h0, "true", known_hosts, check=False)
        assert lost.returncode == 255
        assert ssh(h1, "echo alive", known_hosts).stdout == "alive\n"  # the others carry on
        h0.stop()  # idempotent
        h0.start()  # waits until it accepts connections
        assert ssh(h0, "echo back", known_hosts).stdout == "back\n"


def test_stopping_a_host_kills_everything_on_it(ssh_hosts: MakeHosts, known_hosts: Path) -> None:
    hosts = ssh_hosts(1, mode="netns")
    h = hosts[0]
    ssh(h, "nohup sleep 600 >/dev/null 2>&1 </dev/null &", known_hosts)
    assert h.netns is not None
    in_ns = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True)
    assert len(in_ns.stdout.split()) >= 3  # unshare, sshd and the sleep
    # The orphaned sleep is reaped by sshd, the host's init, not left to the real PID 1.
    assert ssh(h, "ps -o ppid= -C sleep", known_hosts).stdout.split() == ["1"]
    h.stop()
    in_ns = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True)
    assert in_ns.stdout.split() == []
    h.start()  # rebooted: a fresh, empty HOME
    assert set(ssh(h, "ls -A ~", known_hosts).stdout.split()) <= {".ssh"}


def test_a_host_powered_off_takes_its_agents_shared_memory_folders_with_it(
        ssh_hosts: MakeHosts, known_hosts: Path) -> None:
    """/dev/shm is the client's (hosts share its filesystem): a node agent killed on a host leaves
    its folder there, which only an agent of the same pid namespace would remove, and the
    host's namespace ends with it. Stopping the host removes them; others' stay."""
    hosts = ssh_hosts(1, mode="netns")
    h = hosts[0]
    ns = ssh(h, "readlink /proc/self/ns/pid", known_hosts).stdout.strip().rpartition("[")[2].rstrip("]")
    left = Path(f"/dev/shm/skyward-node-12345-{ns}-abc")
    other = Path(tempfile.mkdtemp(prefix="skyward-node-12345-1-", dir="/dev/shm"))
    try:
        ssh(h, f"mkdir {left} && touch {left}/spill", known_hosts)
        assert (left / "spill").exists()
        h.stop()
        assert not left.exists()
        assert other.exists()  # (another namespace's)
    finally:
        shutil.rmtree(left, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


@pytest.mark.parametrize("mode", ["netns", "loopback"])
def test_orphans_on_a_host_are_reaped(ssh_hosts: MakeHosts, known_hosts: Path, mode: Mode) -> None:
    """A job that outlives its session and then exits must not stay a zombie: its parent is
    the host's init (netns) or the reaper (loopback), not a PID 1 that may never reap."""
    h = ssh_hosts(1, mode=mode)[0]
    out = ssh(h, "sh -c 'sleep 1 >/dev/null 2>&1 </dev/null & echo $!'", known_hosts).stdout
    pid = out.strip()
    # Orphaned: adopted by the host's init (pid 1 on the host) or by the reaper.
    adopter = "1" if mode == "netns" else str(h._proc.pid if h._proc else None)
    assert ssh(h, f"ps -o ppid= -p {pid}", known_hosts).stdout.strip() == adopter
    deadline = time.monotonic() + 10
    while True:
        # `ps` on the host: in netns mode the pid is the host's own.
        state = ssh(h, f"ps -o stat= -p {pid} || true", known_hosts).stdout.strip()
        if not state or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert state == "", f"pid {pid} on the host is {state!r}"


def test_disconnect_makes_a_running_host_unreachable(
    ssh_hosts: MakeHosts, known_hosts: Path
) -> None:
    h = ssh_hosts(1, mode="netns")[0]
    h.disconnect()
    try:
        with pytest.raises(OSError):
            socket.create_connection((h.address, h.port), timeout=1).close()
        assert h.running
    finally:
        h.reconnect()
    assert ssh(h, "echo ok", known_hosts).stdout == "ok\n"


# -- cleanup


def _zombies() -> set[int]:
    """Unreaped processes that could be ours: a leaked host process ends up as a zombie child of
    PID 1 (which may never reap it) or of this process. Others' zombies, which come and go on a
    busy machine, are left out."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if state == "Z" and int(ppid) in (1, os.getpid()) and comm in _HOST_COMMS:
                found.add(int(entry))
    return found


_HOST_COMMS = {"sshd", "sleep", "unshare", "sh", "bash", "ip"}


def _snapshot(hosts: SSHHosts) -> list[int]:
    """Every pid that belongs to the hosts: launchers, sshds and what runs on the hosts."""
    pids = []
    for h in [*hosts, *([hosts.bastion] if hosts.bastion else [])]:
        if h._proc is not None:
            pids.append(h._proc.pid)
        if h.pid is not None:
            pids.append(h.pid)
        if h.netns is not None:
            out = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True)
            pids += [int(p) for p in out.stdout.split()]
    return pids


def assert_nothing_left(hosts: SSHHosts, pids: list[int], zombies_before: set[int]) -> None:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"sky-{hosts.tag}-" not in netns
    links = os.listdir("/sys/class/net")
    assert not [ln for ln in links if hosts.tag in ln]
    assert not hosts.tmpdir.exists()
    if hosts.requested_user is not None:  # the account and its home's mountpoint
        assert _passwd_entry(hosts.user) == ""
        assert not Path(f"/home/{hosts.user}").exists()
    if hosts.inner_subnet is not None:
        routes = subprocess.run(
            ["ip", "route", "show", "table", "all"], capture_output=True, text=True
        )
        assert str(hosts.inner_subnet) not in routes.stdout
    assert not [p for p in pids if Path(f"/proc/{p}").exists()], "a process was left (or unreaped)"
    # Other processes on a busy machine also leave orphans that their init reaps a moment later;
    # a zombie we leaked to an init that never reaps stays. Count only those that stay.
    new = _zombies() - zombies_before
    for _ in range(4):
        if not new:
            break
        time.sleep(0.5)
        new &= _zombies()
    assert not new, [_stat(z) for z in new]


def _stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return f"{pid}: gone"


@pytest.mark.parametrize("mode", ["netns", "loopback"])
def test_close_leaves_nothing(mode: Mode, known_hosts: Path) -> None:
    reason = unavailable_reason(mode)
    if reason:
        pytest.skip(reason)
    zombies_before = _zombies()
    with SSHHosts(2, mode=mode) as hosts:
        assert hosts.mode == mode
        for h in hosts:
            # A background job that outlives its session, and a daemon-style double fork.
            out = ssh(h, "nohup sleep 600 >/dev/null 2>&1 </dev/null & echo $!", known_hosts)
            ssh(h, "setsid sh -c 'sleep 600 & exit' >/dev/null 2>&1 </dev/null", known_hosts)
            assert out.stdout.strip().isdigit()
        pids = _snapshot(hosts)
        if mode == "loopback":
            # Without a PID namespace the sleeps are ordinary processes of this machine.
            pids += _sleeps_under(hosts)
        assert len(pids) >= 2 * 2
    assert_nothing_left(hosts, pids, zombies_before)
    hosts.close()  # idempotent


def _sleeps_under(hosts: SSHHosts) -> list[int]:
    """pids of the `sleep 600` processes descending from the hosts' reapers."""
    roots = {h._proc.pid for h in hosts if h._proc is not None}
    deadline = time.monotonic() + 10
    while True:
        found = []
        for entry in os.listdir("/proc"):
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
            except OSError:
                continue
            if cmd == b"sleep\x00600\x00" and _has_ancestor(int(entry), roots):
                found.append(int(entry))
        # A forked child may not have exec'd sleep yet when its ssh session returns.
        if len(found) == 2 * len(hosts) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(found) == 2 * len(hosts), found
    return found


def _has_ancestor(pid: int, roots: set[int]) -> bool:
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
        if pid in roots:
            return True
    return False


@pytest.mark.parametrize("mode", ["netns", "loopback"])
def test_failed_start_cleans_up(mode: Mode) -> None:
    reason = unavailable_reason(mode)
    if reason:
        pytest.skip(reason)
    zombies_before = _zombies()
    hosts = SSHHosts(2, mode=mode, sshd_options={"NoSuchOption": "yes"})
    with pytest.raises(SSHHostError, match="NoSuchOption"):
        hosts.start()
    assert_nothing_left(hosts, [], zombies_before)


@pytest.mark.parametrize("mode", ["netns", "loopback"])
def test_interrupted_start_cleans_up(mode: Mode, monkeypatch: pytest.MonkeyPatch) -> None:
    reason = unavailable_reason(mode)
    if reason:
        pytest.skip(reason)
    zombies_before = _zombies()
    hosts = SSHHosts(3, mode=mode)
    launched: list[int] = []

    def interrupted(self: SSHHosts, waiting: object) -> None:
        launched.extend(_snapshot(self))  # sshds are running by now
        raise KeyboardInterrupt

    monkeypatch.setattr(SSHHosts, "_wait_ready", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hosts.start()
    assert launched
    assert_nothing_left(hosts, launched, zombies_before)


@pytest.mark.parametrize(
    ("mode", "options"),
    [("netns", {}), ("loopback", {}), ("netns", FLEET)],
    ids=["netns", "loopback", "fleet-shape"],
)
def test_interrupted_at_any_setup_step_cleans_up(
    mode: Mode, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupt the setup at each of its external commands in turn (ssh-keygen, useradd, every
    `ip`): whatever was created up to that point is removed."""
    reason = unavailable_reason(mode, **options)
    if reason:
        pytest.skip(reason)
    n = 1 if options else 2
    real_run = sshhosts._run
    calls: list[list[str]] = []

    def counting(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        return real_run(argv, **kw)  # type: ignore[arg-type]

    # Commands whose results are cached (version and capability probes) run once only.
    sshhosts._sshd_version()
    monkeypatch.setattr(sshhosts, "_run", counting)
    with SSHHosts(n, mode=mode, **options):
        steps = len(calls)
    assert steps >= 3  # the client key and two host keys at least

    zombies_before = _zombies()
    for k in range(steps):
        seen = 0

        def interrupt_kth(
            argv: list[str], k: int = k, **kw: object
        ) -> subprocess.CompletedProcess[str]:
            nonlocal seen
            seen += 1
            if seen == k + 1:
                raise KeyboardInterrupt(f"at step {k}: {argv}")
            return real_run(argv, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(sshhosts, "_run", interrupt_kth)
        hosts = SSHHosts(n, mode=mode, **options)
        try:
            with pytest.raises(KeyboardInterrupt):
                hosts.start()
        finally:
            hosts.close()  # a no-op unless start() failed to clean up; keeps a failure contained
        print(f"interrupted at step {k}: {calls[k]}")  # shown if the check below fails
        assert_nothing_left(hosts, [], zombies_before)


def test_missing_sshd_is_reported_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sshhosts, "_which", lambda name: None if name == "sshd" else name)
    assert "sshd is not installed" in str(unavailable_reason("loopback"))
    hosts = SSHHosts(1)
    with pytest.raises(SSHHostsUnavailable, match="sshd is not installed"):
        hosts.start()
    hosts.close()


@pytest.mark.parametrize("mode", ["netns", "loopback"])
def test_sweep_removes_what_a_dead_run_left(mode: Mode, known_hosts: Path) -> None:
    reason = unavailable_reason(mode)
    if reason:
        pytest.skip(reason)
    zombies_before = _zombies()
    hosts = SSHHosts(2, mode=mode)
    try:
        hosts.start()
        for h in hosts:
            ssh(h, "nohup sleep 600 >/dev/null 2>&1 </dev/null &", known_hosts)
        pids = [p for p in _snapshot(hosts) if p not in {h._proc.pid for h in hosts if h._proc}]
        # Pretend the owning process died without cleaning up.
        (hosts.tmpdir / "owner").write_text("999999999 0\n")
        assert sshhosts.sweep_stale() == [hosts.tag]
        assert not hosts.tmpdir.exists()
    finally:
        hosts.close()  # reaps our own (already dead) launchers
    assert_nothing_left(hosts, pids, zombies_before)


def test_close_leaves_nothing_of_a_fleet_shape(known_hosts: Path) -> None:
    """A login user with sudo, a shared home and a bastion: the account, its home's mountpoint,
    the inner bridge and its route go too."""
    reason = unavailable_reason(**FLEET)
    if reason:
        pytest.skip(reason)
    zombies_before = _zombies()
    with SSHHosts(2, **FLEET) as hosts:
        assert hosts.bastion is not None and hosts.inner_subnet is not None
        for h in [hosts.bastion, *hosts]:
            ssh(h, "nohup sleep 600 >/dev/null 2>&1 </dev/null &", known_hosts)
            ssh(h, "setsid sh -c 'sleep 600 & exit' >/dev/null 2>&1 </dev/null", known_hosts)
        pids = _snapshot(hosts)
        assert len(pids) >= 3 * 4
        assert _passwd_entry(hosts.user) and Path(f"/home/{hosts.user}").is_dir()
        assert any(hosts.tag in link for link in os.listdir("/sys/class/net"))
    assert_nothing_left(hosts, pids, zombies_before)
    hosts.close()  # idempotent


def test_sweep_removes_what_a_dead_fleet_shape_left(known_hosts: Path) -> None:
    reason = unavailable_reason(**FLEET)
    if reason:
        pytest.skip(reason)
    zombies_before = _zombies()
    hosts = SSHHosts(1, **FLEET)
    try:
        hosts.start()
        assert _passwd_entry(hosts.user)
        ssh(hosts[0], "nohup sleep 600 >/dev/null 2>&1 </dev/null &", known_hosts)
        launchers = {h._proc.pid for h in [hosts.bastion, *hosts] if h and h._proc}
        pids = [p for p in _snapshot(hosts) if p not in launchers]
        (hosts.tmpdir / "owner").write_text("999999999 0\n")
        assert sshhosts.sweep_stale() == [hosts.tag]
        # Checked before close(), which would remove them too.
        assert _passwd_entry(hosts.user) == ""
        assert not Path(f"/home/{hosts.user}").exists()
        assert not [ln for ln in os.listdir("/sys/class/net") if hosts.tag in ln]
        routes = subprocess.run(
            ["ip", "route", "show", "table", "all"], capture_output=True, text=True
        )
        assert str(hosts.inner_subnet) not in routes.stdout
    finally:
        hosts.close()
    assert_nothing_left(hosts, pids, zombies_before)


def test_paramiko_connects_with_the_expected_host_key(three_hosts: SSHHosts) -> None:
    """What fabric (hence a provider) would do: key auth, and only the advertised host key."""
    paramiko = pytest.importorskip("paramiko")
    h = three_hosts[1]
    client = paramiko.SSHClient()
    try:
        key_type, key_b64 = h.host_public_key.split()
        where = h.address if h.port == 22 else f"[{h.address}]:{h.port}"
        host_key = paramiko.PKey.from_type_string(key_type, base64.b64decode(key_b64))
        client.get_host_keys().add(where, key_type, host_key)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            h.address, port=h.port, username=h.user, key_filename=str(h.key_path),
            look_for_keys=False, allow_agent=False, timeout=10,
        )  # fmt: skip
        _, stdout, _ = client.exec_command("hostname")
        assert stdout.read().decode().strip() == h.name
        sftp = client.open_sftp()  # the provider will upload files this way
        try:
            # An absolute path: in loopback mode the session's working dir is the real home.
            path = f"{h.home}/uploaded.txt"
            with sftp.open(path, "w") as f:
                f.write("hello")
            with sftp.open(path) as f:
                assert f.read() == b"hello"
        finally:
            sftp.close()
    finally:
        client.close()
