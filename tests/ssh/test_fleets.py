"""SSH fleets as they are: hosts that share one home directory (an NFS home), several
programs on the same hosts at once, pool after pool, login users that are not root, hosts behind a
bastion, and a console that shows only skyward's own words. Real sshd hosts (tests/sshhosts.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Recorder, running_description
from sshhosts import SSHHost, SSHHosts, SSHHostsUnavailable

import skyward as sky
from skyward.core.pool import Pool

pytestmark = pytest.mark.timeout(600)
QUIET = sky.Options(console=False)
REPO = Path(__file__).resolve().parents[2]


def start(**options: Any) -> SSHHosts:
    hosts = SSHHosts(options.pop("n", 3), mode="netns", **options)
    try:
        hosts.start()
    except SSHHostsUnavailable as e:
        pytest.skip(f"netns SSH test hosts unavailable: {e}")
    return hosts


@pytest.fixture(scope="module")
def shared() -> Iterator[SSHHosts]:
    """Three hosts whose home is one directory, like an NFS-mounted home."""
    hosts = start(shared_home=True)
    try:
        yield hosts
    finally:
        hosts.close()


def provider(hosts: Any, **kw: Any) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts], **kw)


def on_host(host: SSHHost, command: str) -> str:
    argv = [*host.ssh_argv("/dev/null", strict="no"), command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


@sky.function
def where() -> dict[str, Any]:
    import os
    import socket

    return {"host": socket.gethostname(), "cwd": os.getcwd(), "rank": sky.instance_info().node}


@sky.function
def square(x: int) -> int:
    return x * x


@sky.function
def bump(n: int) -> int:
    counter = sky.counter("fleet-hits")
    for _ in range(n):
        counter.increment()
    return int(counter.value)


agent_pid = sky.function(os.getppid)


def phases(recorder: Recorder, name: str) -> dict[int, set[str]]:
    """node -> the statuses the named bootstrap phase reported."""
    out: dict[int, set[str]] = {}
    for e in recorder.of(sky.BootstrapPhase):
        if e.phase == name:
            out.setdefault(e.node, set()).add(e.status)
    return out


def pool_folders(host: SSHHost) -> list[str]:
    return on_host(host, "ls -d /var/tmp/skyward-*/pools/* ~/.skyward/pools/* ~/.skyward/run/*/pools/* "
                         "2>/dev/null; true").split()


# -- 1. a shared home ------------------------------------------------------------------------------
def test_a_shared_home_fleet_builds_its_environment_once_and_keeps_node_files_apart(shared: SSHHosts) -> None:
    recorder = Recorder()
    unsubscribe = sky.subscribe(recorder)
    try:
        with sky.Compute(provider=provider(shared), nodes=3, options=QUIET) as pool:
            seen = where() @ pool
            assert sorted(s["host"] for s in seen) == sorted(h.name for h in shared)
            # Each node has its own folder of the pool, on its own disk, though the home is shared.
            assert len({s["cwd"] for s in seen}) == 3
            assert all(s["cwd"].startswith("/var/tmp/skyward-") for s in seen), seen
            for h in shared:  # a host sees only its own folder: the others' live on their disks
                assert len(pool_folders(h)) == 1, pool_folders(h)
            assert pool.map(square, range(30)) == [x * x for x in range(30)]
    finally:
        unsubscribe()
    # One host built the shared environment; the others waited on its lock and skipped.
    venv = phases(recorder, "venv")
    assert sorted("done" in s for s in venv.values()) == [False, False, True], venv
    assert all(s == {"skipped"} for s in venv.values() if "done" not in s), venv
    home = shared.shared_home_dir / ".skyward"
    assert len([p for p in (home / "envs").iterdir() if p.is_dir()]) == 1
    # uv came packed once, as an lz4 frame where the hosts have the lz4 command (else gzipped).
    packed = "uv.lz4" if shutil.which("lz4") else "uv.gz"
    assert sorted(p.name for p in (home / "bin").iterdir()) == ["uv", packed], "a temporary uv was left"
    assert not list(home.glob(".incoming.*")), "an upload's staging folder was left behind"
    for h in shared:
        assert pool_folders(h) == [], f"{h.name} kept a pool folder"


def test_the_core_works_on_a_shared_home_collections_healing_and_a_named_pool(shared: SSHHosts) -> None:
    recorder = Recorder()
    with sky.Compute(provider=provider(shared), nodes=3, options=QUIET) as pool:
        unsubscribe = pool.subscribe(recorder)
        assert max(bump(50) @ pool) == 150  # one counter, served by the head, for all three
        # healing: node 1's agent killed; it is started again in its own folder, with its rank
        pid = pool.run(agent_pid(), target=1)
        on_host(shared[1], f"kill -9 {pid}")
        deadline = time.monotonic() + 120
        while not (recorder.of(sky.InstanceReplaced) and pool.current_nodes() == 3):
            assert time.monotonic() < deadline, "node 1 was not replaced"
            time.sleep(0.1)
        assert [s["rank"] for s in where() @ pool] == [0, 1, 2]
        assert pool.map(square, range(10)) == [x * x for x in range(10)]
        unsubscribe()

    # a named pool: started by one client, attached by another (twice), then destroyed
    ssh = provider(shared)
    spec = sky.Spec(provider=ssh, nodes=3)
    description = running_description(ssh, spec, "fleetnamed01")  # what the registry stores
    for _ in range(2):
        again = Pool(spec, QUIET, sky.Worker(), cluster=ssh.attach(description))
        try:
            assert sorted(s["host"] for s in where() @ again) == sorted(h.name for h in shared)
        finally:
            again.close()
    ssh.destroy(description)
    for h in shared:
        assert pool_folders(h) == []
        assert on_host(h, "pgrep -f '[s]kyward[.]bootstrap[.]agent' || true").strip() == ""


# -- 2. several programs at once ---------------------------------------------------------------------
PROGRAM = textwrap.dedent("""
    import json, os, socket, sys, time
    sys.path.insert(0, {repo!r})
    import skyward as sky

    hosts, role, flag = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    ssh = sky.SSH(hosts=[sky.SSHHost(address=h["address"], port=h["port"], user=h["user"], key=h["key"])
                         for h in hosts])
    where = sky.function(lambda: (socket.gethostname(), os.getcwd(), os.getppid()))
    with sky.Compute(provider=ssh, nodes=len(hosts), options=sky.Options(console=False)) as pool:
        first = where() @ pool
        print(json.dumps({{"role": role, "nodes": first}}), flush=True)
        if role == "long":  # outlive the other program's whole pool, then work again
            while not os.path.exists(flag):
                time.sleep(0.1)
            assert where() @ pool == first, "the other program's teardown touched this pool"
            assert pool.map(sky.function(lambda x: x + 1), range(100)) == list(range(1, 101))
        else:
            assert pool.map(sky.function(lambda x: x * 2), range(100)) == [x * 2 for x in range(100)]
    if role == "short":
        open(flag, "w").close()
    print(json.dumps({{"role": role, "ok": True}}), flush=True)
""")


@pytest.fixture
def fresh() -> Iterator[SSHHosts]:
    """Three fresh hosts (nothing installed) sharing a home."""
    hosts = start(shared_home=True)
    try:
        yield hosts
    finally:
        hosts.close()


def test_two_programs_open_pools_on_the_same_hosts_at_once(fresh: SSHHosts, tmp_path: Path) -> None:
    """On fresh hosts, so that both programs bootstrap at the same moment: six nodes want the same
    environment built in the same shared home."""
    shared = fresh
    script = tmp_path / "program.py"
    script.write_text(PROGRAM.format(repo=str(REPO)))
    hosts = json.dumps([{"address": h.address, "port": h.port, "user": h.user, "key": str(h.key_path)}
                        for h in shared])
    flag = str(tmp_path / "short-done")
    procs = [subprocess.Popen([sys.executable, str(script), hosts, role, flag], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for role in ("long", "short")]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    reports = [json.loads(line) for out, _ in outs for line in out.splitlines() if line.startswith("{")]
    nodes = [r["nodes"] for r in reports if "nodes" in r]
    assert len(nodes) == 2 and all(r.get("ok") for r in reports if "ok" in r)
    long_nodes, short_nodes = nodes
    assert {d for _, d, _ in long_nodes}.isdisjoint({d for _, d, _ in short_nodes})  # own folders
    # Own agents: (host, pid) pairs, each host being its own PID namespace (pids repeat across hosts).
    assert {(h, p) for h, _, p in long_nodes}.isdisjoint({(h, p) for h, _, p in short_nodes})
    for h in shared:
        assert pool_folders(h) == []


# -- 3. one pool after another -------------------------------------------------------------------------
def test_twenty_pools_in_a_row_on_the_same_three_hosts(shared: SSHHosts) -> None:
    failures = []
    for i in range(20):
        try:
            with sky.Compute(provider=provider(shared), nodes=3, options=QUIET) as pool:
                assert pool.map(square, range(9)) == [x * x for x in range(9)]
                seen = where() @ pool  # three agents, each in its own folder on its own host
                assert len({(s["host"], s["cwd"]) for s in seen}) == 3, seen
                assert len({s["cwd"] for s in seen}) == 3, seen
        except Exception as exc:  # counted, not raised: the figure is how many of 20 fail
            failures.append(f"pool {i}: {type(exc).__name__}: {exc}")
    assert failures == []


# -- 4. a login user that is not root -------------------------------------------------------------------
@pytest.fixture(scope="module")
def users() -> Iterator[SSHHosts]:
    """Three hosts sharing a home, logged into as a user who is not root and not a sudoer."""
    hosts = start(shared_home=True, user="auto")
    try:
        yield hosts
    finally:
        hosts.close()


def test_a_user_who_is_not_root_runs_a_pool_on_a_shared_home(users: SSHHosts) -> None:
    assert users[0].user != "root"
    with sky.Compute(provider=provider(users), nodes=3, options=QUIET) as pool:
        assert pool.map(square, range(12)) == [x * x for x in range(12)]
        uid = sky.function(os.getuid)() @ pool
        assert all(u != 0 for u in uid)
    home = users.shared_home_dir / ".skyward"
    assert (home / "bin" / "uv").is_file() and home.stat().st_uid == uid[0]


def test_apt_without_sudo_fails_at_once_naming_sudo_and_the_ways_out(users: SSHHosts, tmp_path: Path) -> None:
    # Includes larger than what the channel holds: the command that stops at the sudo check has
    # not read them all, and the client, still sending, gets the node's words all the same.
    project = tmp_path / "project"
    project.mkdir()
    (project / "data.bin").write_bytes(os.urandom(16 << 20))
    t0 = time.monotonic()
    with pytest.raises(sky.ProviderError) as info, sky.Compute(
            provider=provider(users), nodes=3, image=sky.Image(apt=["bash"], includes=[str(project)]),
            options=QUIET):
        pass
    assert time.monotonic() - t0 < 60
    message = str(info.value)
    assert "sudo" in message and "NOPASSWD" in message and "apt=" in message, message
    assert users[0].user in message
    for h in users:  # nothing left running, no pool folder
        assert on_host(h, "pgrep -f '[s]kyward[.]bootstrap' || true").strip() == ""
        assert pool_folders(h) == []


def test_apt_runs_through_passwordless_sudo() -> None:
    hosts = start(n=2, user="auto", sudo="nopasswd")
    try:
        # The hosts share this machine's /usr: a real apt-get would change this machine (and need
        # the network). An apt-get that records who ran it stands in for it, in each host's own
        # home (a tmpfs), first on sudo's secure_path (set in the host's own /etc/sudoers.d).
        shim = 'printf "#!/bin/sh\\necho \\"\\$(id -u) apt-get \\$*\\" >> $HOME/apt-calls\\n" > ~/shims/apt-get'
        for h in hosts:
            on_host(h, f"mkdir -p ~/shims && {shim} && chmod 755 ~/shims/apt-get && touch ~/apt-calls && "
                       "chmod 666 ~/apt-calls && echo \"Defaults secure_path=$HOME/shims:/usr/sbin:/usr/bin:/sbin:/bin\""
                       " | sudo -n tee /etc/sudoers.d/zz-path >/dev/null")
        recorder = Recorder()
        unsubscribe = sky.subscribe(recorder)
        try:
            with sky.Compute(provider=provider(hosts), nodes=2, image=sky.Image(apt=["bash"]),
                             options=QUIET) as pool:
                assert sky.function(os.getuid)() @ pool != [0, 0]
        finally:
            unsubscribe()
        assert set(phases(recorder, "apt")) == {0, 1} and all("done" in s for s in phases(recorder, "apt").values())
        for h in hosts:  # apt-get ran as root (through sudo), once per host
            installs = [line for line in on_host(h, "cat ~/apt-calls").splitlines() if " install " in line]
            assert len(installs) == 1 and installs[0].startswith("0 apt-get install"), installs
    finally:
        hosts.close()


def test_sudo_that_wants_a_password_is_refused_before_anything_runs() -> None:
    hosts = start(n=1, user="auto", sudo="password")
    try:
        with pytest.raises(sky.ProviderError, match="sudo") as info, sky.Compute(
                provider=provider(hosts), nodes=1, image=sky.Image(apt=["bash"]), options=QUIET):
            pass
        assert "password" in str(info.value)
        assert on_host(hosts[0], "pgrep -f '[s]kyward[.]bootstrap' || true").strip() == ""
    finally:
        hosts.close()


# -- 5. bastions -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def behind() -> Iterator[SSHHosts]:
    """Two hosts reachable only through a jump host."""
    hosts = start(n=2, bastion=True)
    try:
        yield hosts
    finally:
        hosts.close()


def _unreachable(address: str) -> bool:
    try:
        socket.create_connection((address, 22), timeout=1).close()
    except OSError:
        return True
    return False


def test_hosts_behind_a_bastion_through_the_jump_parameter(behind: SSHHosts, tmp_path: Path) -> None:
    assert _unreachable(behind[0].address)
    known = tmp_path / "known_hosts"
    ssh = provider(behind, jump=behind.jump, known_hosts=str(known))
    with sky.Compute(provider=ssh, nodes=2, options=QUIET) as pool:
        assert sorted(s["host"] for s in where() @ pool) == sorted(h.name for h in behind)
        assert sum(bump(20) @ pool) > 0  # collections: the head's listener, through the tunnel
        payload = b"x" * (8 << 20)
        assert sky.function(len)(payload) >> pool == len(payload)
    text = known.read_text()
    bastion = behind.bastion
    assert bastion.address in text, "the jump host's key is pinned like the others"
    assert all(h.address in text for h in behind)


def test_a_changed_jump_host_key_is_refused_with_the_line_that_forgets_it(behind: SSHHosts, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    ssh = provider(behind, jump=behind.jump, known_hosts=str(known))
    with sky.Compute(provider=ssh, nodes=1, options=QUIET) as pool:
        where() >> pool
    lines = known.read_text().splitlines()
    bastion = behind.bastion
    # Another key for the bastion, as after a reinstall (or a man in the middle).
    forged = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                            capture_output=True)
    assert forged.returncode == 0
    other = " ".join((tmp_path / "k.pub").read_text().split()[:2])
    known.write_text("".join(
        (f"{line.split()[0]} {other}" if line.split()[0] in (bastion.address, f"[{bastion.address}]:{bastion.port}")
         else line) + "\n" for line in lines))
    with pytest.raises(sky.HostKeyError) as info, sky.Compute(provider=ssh, nodes=1, options=QUIET):
        pass
    message = str(info.value)
    assert bastion.address in message and f"-f {known}" in message, message
    command = next(line.strip() for line in message.splitlines() if line.strip().startswith("ssh-keygen -R"))
    assert subprocess.run(command, shell=True, capture_output=True).returncode == 0
    with sky.Compute(provider=ssh, nodes=1, options=QUIET) as pool:  # the way out works
        where() >> pool


def test_hosts_behind_a_bastion_through_proxyjump_in_ssh_config(
        behind: SSHHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    behind.write_ssh_config(home / ".ssh" / "config")
    monkeypatch.setenv("HOME", str(home))  # Fabric reads ~/.ssh/config
    ssh = sky.SSH(hosts=[h.address for h in behind])  # user, key and the jump all from the config
    with sky.Compute(provider=ssh, nodes=2, options=QUIET) as pool:
        assert sorted(s["host"] for s in where() @ pool) == sorted(h.name for h in behind)


def test_jump_is_checked_where_it_is_given() -> None:
    with pytest.raises(sky.ConfigError, match="jump"):
        sky.SSH(hosts=["10.0.0.1"], jump="me@bastion:99999")
    with pytest.raises(sky.ConfigError, match="jump"):
        sky.SSH(hosts=["10.0.0.1"], jump="")
    with pytest.raises(sky.ConfigError, match="known_hosts"):
        sky.SSH(hosts=["10.0.0.1"], known_hosts="/no/such/folder/known_hosts")


def test_jump_and_known_hosts_come_from_skyward_toml(tmp_path: Path) -> None:
    """A named pool's [pools.NAME.ssh] table takes jump and known_hosts as sky.SSH does."""
    from skyward.named import config
    from skyward.named.pools import provider_from

    (tmp_path / "skyward.toml").write_text(
        '[pools.lab]\nprovider = "ssh"\n[pools.lab.ssh]\nhosts = ["10.0.0.1"]\n'
        f'jump = "me@bastion:2222"\nknown_hosts = "{tmp_path}/kh"\n')
    ssh = provider_from(config.load("lab", project=tmp_path / "skyward.toml").data)
    assert isinstance(ssh, sky.SSH) and ssh.jump == "me@bastion:2222" and ssh.known_hosts == f"{tmp_path}/kh"
    (tmp_path / "skyward.toml").write_text(
        '[pools.lab]\nprovider = "ssh"\n[pools.lab.ssh]\nhosts = ["10.0.0.1"]\njump = "me@bastion:99999"\n')
    with pytest.raises(sky.ConfigError, match="jump"):
        provider_from(config.load("lab", project=tmp_path / "skyward.toml").data)

# -- 6. a quiet console ------------------------------------------------------------------------------------
QUIET_PROGRAM = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {repo!r})
    import paramiko
    import skyward as sky
    from skyward.bootstrap.remote import Remote, Target

    h = json.loads(sys.argv[1])
    ssh = sky.SSH(hosts=[sky.SSHHost(address=h["address"], port=h["port"], user=h["user"], key=h["key"])])
    with sky.Compute(provider=ssh, nodes=1) as pool:
        remote = Remote(Target(h["address"], h["port"], h["user"], h["key"])).open()
        try:
            remote.tunnel(1)  # nothing listens on port 1: the server refuses the channel
        except paramiko.ChannelException:
            print("refused", flush=True)
        remote.close()
        assert sky.function(lambda: 2)() >> pool == 2
""")


def test_paramiko_messages_go_to_the_log_file_not_the_console(shared: SSHHosts, tmp_path: Path) -> None:
    h = shared[0]
    script = tmp_path / "quiet.py"
    script.write_text(QUIET_PROGRAM.format(repo=str(REPO)))
    home = tmp_path / "skyhome"
    env = {**os.environ, "SKYWARD_HOME": str(home)}
    # The client's caches, so that this program does not build them again.
    for name in ("cache",):
        src = Path(os.environ["SKYWARD_HOME"]) / name
        if src.exists():
            (home).mkdir(exist_ok=True)
            os.symlink(src, home / name)
    arg = json.dumps({"address": h.address, "port": h.port, "user": h.user, "key": str(h.key_path)})
    done = subprocess.run([sys.executable, str(script), arg], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused" in done.stdout
    assert "Secsh" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    logged = "".join(p.read_text() for p in (home / "logs").glob("*.log*"))
    assert re.search(r"Secsh channel \d+ open FAILED", logged), logged[-2000:]
