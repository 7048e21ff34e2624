"""sky.SSH(fanout=True): the client logs into the first host; that host starts the others with
OpenSSH, signing with the client's key through a forwarded agent. Real sshd hosts in their own
network namespaces (tests/sshhosts.py), which reach each other over their bridge."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sshhosts import SSHHost, SSHHosts, SSHHostsUnavailable

import skyward as sky
from skyward.bootstrap import remote as remote_mod
from skyward.errors import ConfigError

pytestmark = pytest.mark.timeout(600)
QUIET = sky.Options(console=False)


@pytest.fixture(scope="module")
def hosts() -> Iterator[SSHHosts]:
    hosts = SSHHosts(4, mode="netns")
    try:
        hosts.start()
    except SSHHostsUnavailable as e:
        pytest.skip(f"netns SSH test hosts unavailable: {e}")
    try:
        yield hosts
    finally:
        hosts.close()


def provider(hosts: Any, known: Path, **kw: Any) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts], known_hosts=str(known), **kw)


def on_host(host: SSHHost, command: str) -> str:
    argv = [*host.ssh_argv("/dev/null", strict="no"), command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


class Logins:
    """Counts the client's own SSH logins, by host address."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hosts: list[str] = []
        login = remote_mod.Remote._login

        def counted(remote: remote_mod.Remote) -> remote_mod.Remote:
            self.hosts.append(remote.target.host)
            return login(remote)

        monkeypatch.setattr(remote_mod.Remote, "_login", counted)


@contextlib.contextmanager
def unreachable_from_here(hosts: list[SSHHost]) -> Iterator[None]:
    """The client (this namespace) loses its routes to ``hosts`` (blackholed); the hosts still
    reach each other over their bridge. The routes are removed whatever happens."""
    added: list[str] = []
    try:
        for h in hosts:
            subprocess.run(["ip", "route", "add", "blackhole", f"{h.address}/32"], check=True)
            added.append(h.address)
        yield
    finally:
        for address in added:
            subprocess.run(["ip", "route", "del", "blackhole", f"{address}/32"], check=False)


@sky.function
def where() -> str:
    return socket.gethostname()


def test_fanout_is_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"fanout='yes'\) is not valid"):
        sky.SSH(hosts=["10.0.0.1"], direct=True, fanout="yes")  # type: ignore[arg-type]
    assert sky.SSH(hosts=["10.0.0.1"], fanout=True).fanout  # (direct is not needed)
    with pytest.raises(ConfigError, match=r"AWS\(fanout=1\) is not valid"):
        sky.AWS(fanout=1)  # type: ignore[arg-type]


@sky.function
def echo(blob: bytes) -> bytes:
    return blob


def _muxes(host: SSHHost) -> list[str]:
    return on_host(host, "pgrep -f '[s]kyward[.]bootstrap[.]mux' || true").split()


@pytest.mark.parametrize("mux", ["one multiplexer", "a channel per link"])
def test_without_direct_the_client_reaches_the_others_only_through_the_first(
        hosts: SSHHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mux: str) -> None:
    """A cloud pool seen from outside its network: the client can reach the first host and no
    other (routes to them blackholed here), so everything else goes through the first host's
    login: the starts, every agent's link (sealed; all in one channel, through the first host's
    multiplexer, or with SKYWARD_SSH_MUX=0 a direct-tcpip channel each), the release."""
    if mux != "one multiplexer":
        monkeypatch.setenv("SKYWARD_SSH_MUX", "0")
    known = hosts.write_known_hosts(tmp_path / "known_hosts")
    with unreachable_from_here(list(hosts)[1:]):
        logins = Logins(monkeypatch)
        ssh = provider(hosts, known, fanout=True)
        with sky.Compute(provider=ssh, nodes=len(hosts), options=QUIET) as pool:
            names = where() @ pool
            blob = bytes(range(256)) * 8192  # 2 MiB each way through the first host
            assert echo(blob) @ pool == [blob] * len(hosts)
            pool_id = pool.id
            running = _muxes(hosts[0])
            assert len(running) == (1 if mux == "one multiplexer" else 0), running
        assert sorted(names) == sorted(h.name for h in hosts)
        assert logins.hosts == [hosts[0].address], logins.hosts
        deadline = time.monotonic() + 10  # the multiplexer ends with the pool (its channel closed)
        while _muxes(hosts[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _muxes(hosts[0])
    for h in hosts:  # released through the first host: nothing of the pool is left
        left = on_host(h, f"pgrep -f '[s]kyward[.]bootstrap[.]agent' || true; "
                          f"find /tmp /var/tmp /run $HOME -name '*{pool_id}*' 2>/dev/null || true").strip()
        assert left == "", (h.name, left)


def test_the_first_host_starts_the_others_and_releases_them(hosts: SSHHosts, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    known = hosts.write_known_hosts(tmp_path / "known_hosts")  # every host key known: all fan out
    logins = Logins(monkeypatch)
    ssh = provider(hosts, known, direct=True, fanout=True)
    with sky.Compute(provider=ssh, nodes=len(hosts), options=QUIET) as pool:
        names = where() @ pool
        pool_id = pool.id
    assert sorted(names) == sorted(h.name for h in hosts)
    # One login of the client's own: the first host's (its release reuses it).
    assert logins.hosts == [hosts[0].address], logins.hosts
    for h in hosts:  # every node released: no agent of the pool, no folder of it
        left = on_host(h, f"pgrep -f '[s]kyward[.]bootstrap[.]agent' || true; "
                          f"find /tmp /var/tmp /run $HOME -name '*{pool_id}*' 2>/dev/null || true").strip()
        assert left == "", (h.name, left)


def test_a_host_whose_key_the_client_does_not_know_gets_the_clients_own_login(
        hosts: SSHHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("".join(h.known_hosts_line + "\n" for h in list(hosts)[:3]))  # the last one: unknown
    logins = Logins(monkeypatch)
    ssh = provider(hosts, known, direct=True, fanout=True)
    with sky.Compute(provider=ssh, nodes=len(hosts), options=QUIET) as pool:
        assert sorted(where() @ pool) == sorted(h.name for h in hosts)
    assert sorted(logins.hosts) == sorted([hosts[0].address, hosts[-1].address]), logins.hosts
    assert hosts[-1].known_hosts_line.split()[-1] in known.read_text()  # recorded on first contact


def test_a_host_the_first_cannot_log_into_falls_back_to_the_client(
        hosts: SSHHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    known = hosts.write_known_hosts(tmp_path / "known_hosts")
    # The first host forgets its way to host 1: its ssh fails, the client's own login works.
    on_host(hosts[0], f"ip route add blackhole {hosts[1].address}/32")
    try:
        logins = Logins(monkeypatch)
        ssh = provider(list(hosts)[:2], known, direct=True, fanout=True, )
        with sky.Compute(provider=ssh, nodes=2, options=sky.Options(console=False, ssh_timeout=20)) as pool:
            assert sorted(where() @ pool) == sorted(h.name for h in list(hosts)[:2])
        assert hosts[1].address in logins.hosts
    finally:
        on_host(hosts[0], f"ip route del blackhole {hosts[1].address}/32")


def test_a_named_pool_started_by_fanout_is_attached_and_destroyed(hosts: SSHHosts, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from helpers import running_description

    from skyward.core.pool import Pool

    known = hosts.write_known_hosts(tmp_path / "known_hosts")
    ssh = provider(hosts, known, direct=True, fanout=True)
    spec = sky.Spec(provider=ssh, nodes=len(hosts))
    logins = Logins(monkeypatch)
    description = running_description(ssh, spec, "fanned")  # as `skyward up` starts it
    assert logins.hosts == [hosts[0].address]
    assert description["fanout"] is True
    try:
        # `skyward exec`: each agent answers on its direct port, nobody logs in
        pool = Pool(spec, QUIET, sky.Worker(), cluster=ssh.attach(description))
        try:
            assert sorted(where() @ pool) == sorted(h.name for h in hosts)
        finally:
            pool.close()
        assert logins.hosts == [hosts[0].address]
    finally:
        ssh.destroy(description)  # `skyward down`: one login, the first host releases the others
    assert logins.hosts == [hosts[0].address] * 2, logins.hosts
    for h in hosts:
        assert on_host(h, "pgrep -f '[s]kyward[.]bootstrap[.]agent' || true").strip() == "", h.name


def test_when_the_first_hosts_connection_goes_the_others_are_reached_again_through_its_new_one(
        hosts: SSHHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without direct=True the first host's login carries every link: when it breaks, the first
    node is restarted in place (a login, a new agent), and the others, whose agents ran on, are
    reached again through that new login: no login to their hosts, the same agents."""
    import time

    known = hosts.write_known_hosts(tmp_path / "known_hosts")
    three = list(hosts)[:3]
    ssh = provider(three, known, fanout=True)
    with sky.Compute(provider=ssh, nodes=3, options=QUIET) as pool:
        assert sorted(where() @ pool) == sorted(h.name for h in three)
        first = pool.cluster.table.nodes[0]  # type: ignore[attr-defined]
        before = {n.host.address: n.agent_pid for n in pool.cluster.table.nodes.values()}  # type: ignore[attr-defined]
        assert first.remote is not None
        logins = Logins(monkeypatch)
        first.remote.close()
        deadline = time.monotonic() + 120
        while True:
            nodes = pool.cluster.table.nodes  # type: ignore[attr-defined]
            if len(nodes) == 3 and 0 not in nodes and all(n.endpoint is not None for n in nodes.values()):
                try:
                    names = where() @ pool
                except Exception:  # (a node lost while it ran: the next try)
                    names = []
                if sorted(names) == sorted(h.name for h in three):
                    break
            assert time.monotonic() < deadline, f"not back in 120 s: {nodes}"
            time.sleep(0.5)
        assert sorted(n.host.address for n in nodes.values()) == sorted(h.address for h in three)
        pids = {n.host.address: n.agent_pid for n in nodes.values()}
        assert pids[three[0].address] != before[three[0].address]  # the first: a new agent
        assert [pids[h.address] for h in three[1:]] == [before[h.address] for h in three[1:]]  # the same
        assert all(n.rejoined and n.remote is None for n in nodes.values() if n.host.address != three[0].address)
        assert logins.hosts == [three[0].address], logins.hosts  # one login, to the first host
        assert sorted(where() @ pool) == sorted(h.name for h in three)


def test_a_relayed_node_whose_agent_died_is_restarted_not_rejoined(hosts: SSHHosts, tmp_path: Path) -> None:
    """A link lost because the agent died (the first host's connection fine): nothing answers
    on its port, so the node is restarted in place as any lost node is, at once."""
    import time

    known = hosts.write_known_hosts(tmp_path / "known_hosts")
    three = list(hosts)[:3]
    with sky.Compute(provider=provider(three, known, fanout=True), nodes=3, options=QUIET) as pool:
        assert sorted(where() @ pool) == sorted(h.name for h in three)
        victim = pool.cluster.table.nodes[1]  # type: ignore[attr-defined]
        on_host(next(h for h in three if h.address == victim.host.address), f"kill -9 {victim.agent_pid}")
        t0 = time.monotonic()
        while True:
            nodes = pool.cluster.table.nodes  # type: ignore[attr-defined]
            if len(nodes) == 3 and 1 not in nodes:
                try:
                    if sorted(where() @ pool) == sorted(h.name for h in three):
                        break
                except Exception:
                    pass
            assert time.monotonic() - t0 < 60, f"not back in 60 s: {nodes}"
            time.sleep(0.3)
        back = next(n for n in nodes.values() if n.host.address == victim.host.address)
        assert back.agent_pid != victim.agent_pid and not back.rejoined


def test_a_named_pool_without_direct_is_attached_and_destroyed_through_its_first_host(
        hosts: SSHHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`skyward up`, `exec`, `down` of a fanned-out pool the client reaches only through its first
    host: each is one login (the first host's), whatever the pool's size."""
    from helpers import running_description

    from skyward.core.pool import Pool

    known = hosts.write_known_hosts(tmp_path / "known_hosts")
    ssh = provider(hosts, known, fanout=True)
    spec = sky.Spec(provider=ssh, nodes=len(hosts))
    with unreachable_from_here(list(hosts)[1:]):
        logins = Logins(monkeypatch)
        description = running_description(ssh, spec, "relayed")
        assert [n["relay_via"] for n in description["nodes"]] == [None, 0, 0, 0]
        try:
            pool = Pool(spec, QUIET, sky.Worker(), cluster=ssh.attach(description))  # `skyward exec`
            try:
                assert sorted(where() @ pool) == sorted(h.name for h in hosts)
            finally:
                pool.close()
        finally:
            ssh.destroy(description)  # `skyward down`
        assert logins.hosts == [hosts[0].address] * 3, logins.hosts  # up, exec, down
    for h in hosts:
        assert on_host(h, "pgrep -f '[s]kyward[.]bootstrap[.]agent' || true").strip() == "", h.name


def test_the_first_host_logs_into_a_cloud_node_at_its_private_address() -> None:
    """A cloud node: the client knows it by a public address, the other nodes by its private
    one, where the first node logs in (its pinned key named so) and its agent listens."""
    import types

    import paramiko

    from skyward.providers.ssh import SSHCluster, SSHHost, _Node
    from skyward.providers.ssh_fanout import Dest, destination

    key = paramiko.ECDSAKey.generate()
    pinned = f"{key.get_name()} {key.get_base64()}"
    cluster: Any = types.SimpleNamespace(_known_hosts=None, direct_address=SSHCluster.direct_address)
    cloud = _Node(1, SSHHost(address="34.120.0.7", user="ubuntu", private_ip="10.1.2.3", host_key=pinned))
    dest = destination(cluster, cloud)  # (nothing is contacted: destination only reads configuration)
    assert isinstance(dest, Dest)
    assert dest.argv == ["-p", "22", "-l", "ubuntu", "10.1.2.3"]
    assert dest.known == [f"10.1.2.3 {pinned}"]
    public_only = _Node(2, SSHHost(address="34.120.0.8", user="ubuntu", host_key=pinned))
    assert "private_ip" in str(destination(cluster, public_only))
