"""sky.SSH end to end against real sshd hosts (tests/sshhosts.py): bootstrap from a shipped
wheelhouse (the hosts have no route out), the agent through an SSH tunnel, host keys, failures."""

from __future__ import annotations

import json
import logging
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import helpers
import pytest
from sshhosts import SSHHost, SSHHosts

import skyward as sky

pytestmark = pytest.mark.timeout(300)
QUIET = sky.Options(console=False)


def provider(hosts: SSHHosts | list[SSHHost], **kw: Any) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts], **kw)


def on_host(host: SSHHost, command: str, tmp_known: str = "/dev/null") -> str:
    argv = [*host.ssh_argv(tmp_known, strict="no"), command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


def open_and_close(**kw: Any) -> None:
    with sky.Compute(**kw):
        pass


class Recorder(helpers.Recorder):
    def pool_ids(self) -> set[str]:
        return {e.pool for e in self.of(sky.ClusterRequested)}


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    unsubscribe = sky.subscribe(rec)
    try:
        yield rec
    finally:
        unsubscribe()


def assert_nothing_left(hosts: SSHHosts | list[SSHHost], pool_id: str) -> None:
    """No process of the pool and no pool folder on any host."""
    for h in hosts:
        out = on_host(h, f"pgrep -af {shlex.quote(pool_id)} | grep -v pgrep; "
                         f"ls -d ~/.skyward/pools/{pool_id}* /var/tmp/skyward-*/pools/{pool_id}-* "
                         f"~/.skyward/run/*/pools/{pool_id}-* 2>/dev/null; true")
        assert out.strip() == "", f"{h.name} still has: {out}"


# -- a 3-host pool ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ssh_pool(three_hosts: SSHHosts) -> Iterator[sky.Pool]:
    with sky.Compute(provider=provider(three_hosts), nodes=3, options=QUIET) as pool:
        yield pool


@sky.function
def whoami() -> dict[str, Any]:
    import socket

    info = sky.instance_info()
    return {"hostname": socket.gethostname(), "node": info.node, "ip": info.peers[info.node].private_ip,
            "peers": [p.private_ip for p in info.peers], "head": (info.head_addr, info.head_port)}


def test_broadcast_reaches_three_distinct_hosts(ssh_pool: sky.Pool, three_hosts: SSHHosts) -> None:
    answers = whoami() @ ssh_pool
    assert [a["node"] for a in answers] == [0, 1, 2]
    assert len({a["ip"] for a in answers}) == 3
    assert {a["ip"] for a in answers} == {h.address for h in three_hosts}
    if three_hosts.mode == "netns":
        assert sorted(a["hostname"] for a in answers) == sorted(h.name for h in three_hosts)
    for a in answers:
        assert a["peers"] == [h.address for h in three_hosts]
        assert a["head"] == (three_hosts[0].address, ssh_pool.cluster.head_port)


@sky.function
def listen_on_head_port() -> str:
    import socket

    info = sky.instance_info()
    with socket.create_server(("0.0.0.0", info.head_port)) as server:
        server.settimeout(30)
        conn, (addr, _) = server.accept()
        with conn:
            data = conn.recv(100)
    return f"{data.decode()} from {addr}"


@sky.function
def dial_head() -> str:
    import socket
    import time

    info = sky.instance_info()
    for _ in range(100):  # the head may not be listening yet
        try:
            with socket.create_connection((info.head_addr, info.head_port), timeout=5) as s:
                s.sendall(f"hello from node {info.node}".encode())
                return "sent"
        except ConnectionRefusedError:
            time.sleep(0.1)
    return "refused"


def test_a_node_reaches_the_head_on_its_private_address(ssh_pool: sky.Pool, three_hosts: SSHHosts) -> None:
    """The path torch/jax rendezvous take: node -> head's private address, head port."""
    server = ssh_pool.run_async(listen_on_head_port(), target=0)
    assert ssh_pool.run(dial_head(), target=2) == "sent"
    assert server.result(timeout=60) == f"hello from node 2 from {three_hosts[2].address}"


def test_only_sshd_listens_outside_loopback_and_the_agent_wants_the_pools_key(
    ssh_pool: sky.Pool, three_hosts: SSHHosts,
) -> None:
    if three_hosts.mode != "netns":
        pytest.skip("needs one network namespace per host")
    # The head's agent also serves the pool's collections, on its private address only (never
    # 0.0.0.0; tests/ssh/test_collections.py checks that it refuses a wrong token).
    served = (ssh_pool.shared.served or (None, None))[1]
    state = [f"{served['host']}:{served['port']}"] if served and "port" in served else []
    for host, node in zip(three_hosts, sorted(ssh_pool.cluster._nodes.values(), key=lambda n: n.index),
                          strict=True):
        listening = on_host(host, "ss -ltnH").split("\n")
        exposed = [line.split()[3] for line in listening if line.strip()
                   and not line.split()[3].startswith(("127.", "[::1]"))]
        expected = [f"{host.address}:{host.port}"] + (state if node.index == 0 else [])
        assert sorted(exposed) == sorted(expected), listening
        # the agent listens on no TCP port at all: a Unix socket in the pool's folder
        assert node.agent_port is None and node.agent_socket.startswith(node.pool_dir + "/")
        agent_tcp = [line.split()[3] for line in on_host(host, "ss -ltnpH").split("\n")
                     if f"pid={node.agent_pid}," in line]
        assert agent_tcp == (state if node.index == 0 else []), agent_tcp  # the collections' only
        probe = (
            "import json,socket,struct\n"
            f"s=socket.socket(socket.AF_UNIX);s.connect({node.agent_socket!r})\n"
            "body=json.dumps({'token':'wrong','ttl':5}).encode()\n"
            "s.sendall(struct.pack('!BBHQQ',1,0,0,0,len(body))+body)\n"
            "s.settimeout(10)\n"
            "got=b''\n"
            "while True:\n"
            "    try: chunk=s.recv(100)\n"
            "    except ConnectionResetError: chunk=b''\n"
            "    if not chunk: break\n"
            "    got+=chunk\n"
            # only the listener's challenge (20-byte header, 32-byte nonce), then closed
            "print('closed' if len(got)==52 and got[0]==41 else 'answered %r' % got)\n"
        )
        assert on_host(host, f"python3 -c {shlex.quote(probe)}").strip() == "closed"
    assert len(whoami() @ ssh_pool) == 3  # the real token still works


def test_map_and_large_payloads_through_the_tunnel(ssh_pool: sky.Pool) -> None:
    blob = bytes(range(256)) * (8 * 4096)  # 8 MiB

    @sky.function
    def echo_len(b: bytes) -> tuple[int, int]:
        return len(b), sum(b[:1000])

    assert (echo_len(blob) >> ssh_pool) == (len(blob), sum(blob[:1000]))
    assert ssh_pool.map(lambda x: x * x, range(500)) == [x * x for x in range(500)]


# -- bootstrap from the wheelhouse; the warm path ---------------------------------------------
def test_pip_packages_come_from_the_shipped_wheelhouse_and_phases_are_skipped_next_time(
    ssh_hosts: Any, recorder: Recorder,
) -> None:
    hosts = ssh_hosts(2)
    # The hosts cannot reach any index: prove it, so the install below can only be the wheelhouse.
    offline = on_host(hosts[0], "python3 -c \"import urllib.request as u; u.urlopen('https://pypi.org', timeout=3)\" "
                                "2>&1; echo rc=$?")
    assert "rc=0" not in offline

    @sky.function
    def six_version() -> str:
        import six

        return six.__version__

    image = sky.Image(pip=["six==1.16.0"], env={"GREETING": "hi"})
    seconds = []
    for _ in range(2):
        t0 = time.monotonic()
        with sky.Compute(provider=provider(hosts), nodes=2, image=image, options=QUIET) as pool:
            seconds.append(time.monotonic() - t0)
            assert six_version() @ pool == ["1.16.0", "1.16.0"]
            assert sky.function(lambda: __import__("os").environ["GREETING"])() >> pool == "hi"
    first, second = sorted(recorder.pool_ids(), key=lambda p: [e.pool for e in recorder.events].index(p))
    phases = recorder.of(sky.BootstrapPhase)
    cold = {(e.node, e.phase): e.status for e in phases if e.pool == first and e.status != "started"}
    warm = {(e.node, e.phase): e.status for e in phases if e.pool == second and e.status != "started"}
    for node in (0, 1):
        for phase in ("python", "venv", "deps", "skyward"):
            # (a new environment gets skyward's wheel in the deps phase's uv run)
            assert cold[(node, phase)] == ("skipped" if phase == "skyward" else "done"), cold
            assert warm[(node, phase)] == "skipped", warm
        assert warm[(node, "env")] == "done"  # per pool, always
    assert cold[(-1, "wheelhouse")] == "done"  # this machine's part, shown as progress too
    print(f"bootstrap of 2 hosts: cold {seconds[0]:.2f} s, warm {seconds[1]:.2f} s")
    for pid in (first, second):
        assert_nothing_left(hosts, pid)


# -- failures ---------------------------------------------------------------------------------
def test_a_failing_apt_phase_names_host_phase_code_and_output(three_hosts: SSHHosts, recorder: Recorder) -> None:
    with pytest.raises(sky.BootstrapError) as info:
        open_and_close(provider=provider(three_hosts[:1]), nodes=1,
                       image=sky.Image(apt=["skyward-no-such-package"]), options=QUIET)
    err = info.value
    assert err.phase == "apt" and err.exit_code not in (None, 0)
    assert three_hosts[0].address in err.host
    assert any("skyward-no-such-package" in line for line in err.output)
    assert "apt-get install" in str(err) and f"exited with code {err.exit_code}" in str(err)
    print(err)
    (pool_id,) = recorder.pool_ids()
    assert_nothing_left(three_hosts[:1], pool_id)


def test_a_missing_pip_requirement_fails_before_any_node_is_touched(three_hosts: SSHHosts, local_index: str,
                                                                   recorder: Recorder) -> None:
    # Every pool resolves its packages once on the client (its lock, skyward/records/resolver.py), so a
    # requirement the index does not have fails there, naming it, before any host runs a script.
    with pytest.raises(sky.ProviderError, match="skyward-no-such-package") as info:
        open_and_close(provider=provider(three_hosts[:2], install="index"), nodes=2, options=QUIET,
                       image=sky.Image(pip=["skyward-no-such-package==0.0.1"], env={"UV_INDEX_URL": local_index}))
    assert "Check the requirement names and versions" in str(info.value)
    for pool_id in recorder.pool_ids():
        assert_nothing_left(three_hosts[:2], pool_id)


def test_one_host_failing_stops_the_others(three_hosts: SSHHosts, recorder: Recorder) -> None:
    """Host 2 fails its shell_vars phase; hosts 0 and 1 got agents running: all are stopped."""
    if three_hosts.mode != "netns":
        pytest.skip("needs hosts with hostnames of their own")
    probe = f"test $(hostname) != {three_hosts[2].name}"
    with pytest.raises(sky.BootstrapError) as info:
        open_and_close(provider=provider(three_hosts), nodes=3, options=QUIET,
                       image=sky.Image(shell_vars={"PROBE": probe}))
    assert three_hosts[2].address in info.value.host
    assert info.value.phase == "shell_vars"
    (pool_id,) = recorder.pool_ids()
    assert_nothing_left(three_hosts, pool_id)


def test_bootstrap_timeout_stops_the_script(three_hosts: SSHHosts, recorder: Recorder) -> None:
    t0 = time.monotonic()
    with pytest.raises(sky.BootstrapError, match="bootstrap_timeout=3") as info:
        open_and_close(provider=provider(three_hosts[:1]), nodes=1, options=QUIET,
                       image=sky.Image(shell_vars={"SLOW": "sleep 60; echo late"}, bootstrap_timeout=3))
    assert time.monotonic() - t0 < 30
    assert info.value.phase == "shell_vars" and info.value.exit_code is None
    (pool_id,) = recorder.pool_ids()
    time.sleep(0.5)
    assert "sleep 60" not in on_host(three_hosts[0], "ps -eo args")
    assert_nothing_left(three_hosts[:1], pool_id)


def test_a_changed_host_key_is_refused_until_forgotten(ssh_hosts: Any) -> None:
    hosts = ssh_hosts(1)
    with sky.Compute(provider=provider(hosts), nodes=1, options=QUIET) as pool:
        assert whoami() >> pool
    hosts[0].restart(new_host_key=True)
    with pytest.raises(sky.HostKeyError, match="changed") as info:
        open_and_close(provider=provider(hosts), nodes=1, options=QUIET)
    message = str(info.value)
    command = next(line.strip() for line in message.splitlines() if line.strip().startswith("ssh-keygen -R"))
    subprocess.run(command, shell=True, check=True, capture_output=True)  # the documented way out
    with sky.Compute(provider=provider(hosts), nodes=1, options=QUIET) as pool:
        assert whoami() >> pool


def test_unreachable_host_and_bad_key_give_clear_errors(ssh_hosts: Any, tmp_path: Any) -> None:
    hosts = ssh_hosts(1)
    wrong = tmp_path / "id_wrong"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    h = hosts[0]
    bad_key = sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(wrong))])
    with pytest.raises(sky.ProviderError, match="refused"):
        open_and_close(provider=bad_key, nodes=1, options=QUIET)
    hosts[0].stop()
    with pytest.raises(sky.ProviderError, match="could not connect"):
        open_and_close(provider=provider(hosts), nodes=1, options=sky.Options(console=False, ssh_timeout=2))


def test_a_host_lost_mid_task_moves_its_task_to_another_node(ssh_hosts: Any, recorder: Recorder) -> None:
    hosts = ssh_hosts(3, mode="netns")  # killing a netns host kills everything on it

    @sky.function
    def slow(i: int) -> tuple[int, str]:
        import socket
        import time

        time.sleep(3)
        return i, socket.gethostname()

    with sky.Compute(provider=provider(hosts), nodes=3, options=QUIET) as pool:
        pending = sky.gather(slow(0), slow(1), slow(2))
        futures = pool.run_async(pending.items[0]), pool.run_async(pending.items[1]), pool.run_async(pending.items[2])
        time.sleep(1.0)
        hosts[1].kill()
        results = [f.result(timeout=60) for f in futures]
        assert [i for i, _ in results] == [0, 1, 2]
        assert results[1][1] != hosts[1].name  # ran again elsewhere
        assert pool.current_nodes() == 2  # no spare host, and this one does not come back
        lost = recorder.of(sky.InstanceLost)
        assert [e.node for e in lost] == [1]
        # The pool goes on with the nodes it has (its replacement waits for the host).
        assert sorted(pool.map(lambda x: x + 1, range(10))) == list(range(1, 11))


def test_ssh_config_errors() -> None:
    with pytest.raises(sky.ConfigError, match="hosts is a list"):
        sky.SSH(hosts="10.0.0.1")  # type: ignore[arg-type]
    with pytest.raises(sky.ConfigError, match="at least one host"):
        sky.SSH(hosts=[])
    with pytest.raises(sky.ConfigError, match="install"):
        sky.SSH(hosts=["a"], install="magic")  # type: ignore[arg-type]
    with pytest.raises(sky.ConfigError, match="no such file"):
        sky.SSH(hosts=["a"], key="/nonexistent/key")
    with pytest.raises(sky.ProviderError, match="3 node"):
        sky.Compute(provider=sky.SSH(hosts=["a", "b"]), nodes=3).open()
    parsed = sky.SSH(hosts=["me@h1:2222", "h2", "[::1]:22"], user="you", port=23)._parsed
    assert [(h.user, h.address, h.port) for h in parsed] == [("me", "h1", 2222), ("you", "h2", 23), ("you", "::1", 22)]


def test_known_hosts_file_records_first_contact(ssh_pool: sky.Pool, three_hosts: SSHHosts) -> None:
    from skyward.bootstrap.remote import known_hosts_path

    text = known_hosts_path().read_text()
    for h in three_hosts:
        kind, blob = h.host_public_key.split()
        assert f"[{h.address}]:{h.port} {kind} {blob}" in text or f"{h.address} {kind} {blob}" in text
    assert oct(known_hosts_path().stat().st_mode & 0o777) == "0o600"
    json.dumps(whoami() >> ssh_pool)  # still usable


def test_plugins_transform_the_image_and_run_their_ops_as_the_last_phase(
    three_hosts: SSHHosts, recorder: Recorder,
) -> None:
    import dataclasses

    plugin = (
        sky.plugins.Plugin.create("probe")
        .with_image_transform(lambda image, cluster: dataclasses.replace(
            image, env={**image.env, "PROBE_NODES": str(cluster.node_count)}))
        .with_bootstrap(lambda cluster: ('echo "op ran with $PROBE_NODES" > "$POOL/probe.txt"',))
    )

    @sky.function
    def read_probe() -> tuple[str, str]:
        import os

        with open("probe.txt") as f:  # the agent runs in the pool's folder
            return os.environ["PROBE_NODES"], f.read().strip()

    with sky.Compute(provider=provider(three_hosts[:2]), nodes=2, plugins=[plugin], options=QUIET) as pool:
        assert read_probe() @ pool == [("2", "op ran with 2")] * 2
    phases = [(e.node, e.phase, e.status) for e in recorder.of(sky.BootstrapPhase)]
    assert (0, "plugins", "done") in phases and (1, "plugins", "done") in phases
    last = [p for n, p, s in phases if n == 0 and s == "done"][-1]
    assert last == "plugins"


def test_a_host_alias_from_ssh_config(three_hosts: SSHHosts, tmp_path: Any, monkeypatch: Any) -> None:
    """sky.SSH(hosts=["alias"]) resolves HostName, Port, User and IdentityFile from ~/.ssh/config."""
    h = three_hosts[0]
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        f"Host sky-test-alias\n  HostName {h.address}\n  Port {h.port}\n  User {h.user}\n"
        f"  IdentityFile {h.key_path}\n"
    )
    monkeypatch.setenv("HOME", str(tmp_path))
    with sky.Compute(provider=sky.SSH(hosts=["sky-test-alias"]), nodes=1, options=QUIET) as pool:
        answer = whoami() >> pool
    assert answer["ip"] == h.address


@pytest.mark.parametrize("forbidden", [
    {"AllowTcpForwarding": "no"},  # (OpenSSH then refuses streamlocal forwarding too)
    {"AllowStreamLocalForwarding": "no"},  # the agent's Unix socket: no TCP port to fall back on
])
def test_a_node_whose_sshd_forbids_forwarding_is_reached_through_a_relay(
    ssh_hosts: Any, forbidden: dict[str, str], caplog: pytest.LogCaptureFixture,
) -> None:
    hosts = ssh_hosts(1, sshd_options=forbidden)
    caplog.set_level(logging.INFO, logger="skyward")
    with sky.Compute(provider=provider(hosts), nodes=1, options=QUIET) as pool:
        assert (whoami() >> pool)["ip"] == hosts[0].address
        assert pool.map(lambda x: x * 2, range(100)) == [x * 2 for x in range(100)]
        blob = bytes(3 * 1024 * 1024)
        assert sky.function(len)(blob) >> pool == len(blob)
    assert "relaying over an exec channel" in caplog.text


def test_describe_attach_and_destroy_a_running_ssh_pool(three_hosts: SSHHosts) -> None:
    """What named pools (`skyward up` / sky.Compute(name=...)) rely on: a second client reaches
    the running agents from the description, leaves them running, and destroy stops them."""
    from skyward.core.pool import Pool

    ssh = provider(three_hosts[:2])
    spec = sky.Spec(provider=ssh, nodes=2)
    description = helpers.running_description(ssh, spec, "named01")  # what the registry stores
    assert ssh.probe(description) is True

    for _ in range(2):  # attach twice: the first client leaves the nodes running
        pool = Pool(spec, QUIET, sky.Worker(), cluster=ssh.attach(description))
        try:
            answers = whoami() @ pool
        finally:
            pool.close()
        assert [a["ip"] for a in answers] == [h.address for h in three_hosts[:2]]
    assert ssh.probe(description) is True
    # Each node's log is in its own folder of the pool, on the node's local disk.
    for i, n in enumerate(description["nodes"]):
        assert re.fullmatch(rf"/var/tmp/skyward-\d+/pools/named01-{i}/agent.log", n["log"]), n["log"]

    ssh.destroy(description)
    assert ssh.probe(description) is False
    assert_nothing_left(three_hosts[:2], "named01")


def test_includes_travel_as_one_archive_minus_excludes(three_hosts: SSHHosts, tmp_path: Any,
                                                       monkeypatch: Any) -> None:
    pkg = tmp_path / "shipped_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("VALUE = 42\n")
    (pkg / "notes.secret").write_text("do not ship\n")
    monkeypatch.chdir(tmp_path)

    @sky.function
    def use_it() -> tuple[int, bool]:
        import os

        import shipped_pkg  # type: ignore[import-not-found]

        here = os.path.dirname(shipped_pkg.__file__)
        return shipped_pkg.VALUE, os.path.exists(os.path.join(here, "notes.secret"))

    image = sky.Image(includes=["shipped_pkg"], excludes=["*.secret"])
    with sky.Compute(provider=provider(three_hosts[:1]), nodes=1, image=image, options=QUIET) as pool:
        assert use_it() >> pool == (42, False)


def test_connecting_is_retried_while_a_host_boots(ssh_hosts: Any, recorder: Recorder) -> None:
    hosts = ssh_hosts(1)
    hosts[0].stop()
    booting = threading.Timer(2.0, hosts[0].start)
    booting.start()
    try:
        t0 = time.monotonic()
        with sky.Compute(provider=provider(hosts), nodes=1,
                         options=sky.Options(console=False, ssh_timeout=30)) as pool:
            assert (whoami() >> pool)["ip"] == hosts[0].address
        assert time.monotonic() - t0 >= 2.0
    finally:
        booting.join()


def _simple_index(root: Any, requirements: list[str]) -> Any:
    """A PEP 503 index of real wheels (downloaded by this machine's pip) under root/simple."""
    import hashlib
    import re
    import sys

    files = root / "files"
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-deps",
                    "-d", str(files), f"uv=={__import__('importlib.metadata').metadata.version('uv')}"],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "-w", str(files), *requirements],
                   check=True, capture_output=True)
    projects: dict[str, list[str]] = {}
    for wheel in sorted(files.glob("*.whl")):
        name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        projects.setdefault(name, []).append(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>')
    for name, links in projects.items():
        (root / "simple" / name).mkdir(parents=True)
        (root / "simple" / name / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
    return root


@pytest.fixture(scope="module")
def local_index(three_hosts: SSHHosts, tmp_path_factory: Any) -> Iterator[str]:
    """A package index served on the hosts' network (they reach nothing else)."""
    import functools
    import http.server

    from skyward.bootstrap import wheelhouse

    root = _simple_index(tmp_path_factory.mktemp("index"), ["six==1.16.0", *wheelhouse.agent_requirements()])

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer((three_hosts.client_address or "127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{server.server_address[0]}:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_index_mode_nodes_fetch_uv_and_packages_from_their_index(three_hosts: SSHHosts, local_index: str) -> None:
    """install="index" (the cloud default): nothing but skyward's own wheel is uploaded; the node
    fetches uv and every package from its index (here one this test serves on the hosts' network)."""
    host = three_hosts[2]
    on_host(host, "rm -rf ~/.skyward/bin/uv")  # a node that never had uv
    image = sky.Image(pip=["six==1.16.0"], env={"UV_INDEX_URL": local_index})
    with sky.Compute(provider=provider([host], install="index"), nodes=1, image=image, options=QUIET) as pool:
        assert sky.function(lambda: __import__("six").__version__)() >> pool == "1.16.0"
    assert on_host(host, "~/.skyward/bin/uv --version").startswith("uv ")


def test_a_host_cut_off_the_network_is_noticed_and_its_task_moves(ssh_hosts: Any, recorder: Recorder) -> None:
    """No FIN, no RST: the host just goes silent (a spot instance powered off, a network cut).
    The client notices from unanswered pings well before TCP would give up."""
    hosts = ssh_hosts(2, mode="netns")

    @sky.function
    def slow(i: int) -> tuple[int, str]:
        import socket
        import time

        time.sleep(4)
        return i, socket.gethostname()

    with sky.Compute(provider=provider(hosts), nodes=2, options=QUIET) as pool:
        futures = [pool.run_async(slow(i)) for i in range(2)]  # round robin: nodes 0 and 1
        time.sleep(1.0)
        hosts[1].disconnect()
        try:
            t0 = time.monotonic()
            results = [f.result(timeout=90) for f in futures]
            waited = time.monotonic() - t0
        finally:
            hosts[1].reconnect()
        assert [i for i, _ in results] == [0, 1]
        assert results[1][1] == hosts[0].name  # ran again on the node still there
        (lost,) = recorder.of(sky.InstanceLost)
        assert lost.node == 1 and "no answer" in lost.reason
        assert waited < 40, waited
        print(f"lost node noticed, task moved: {waited:.1f} s")
        # The host answers again: it is bootstrapped again in its place (tests/ssh/test_healing.py).
        deadline = time.monotonic() + 120
        while pool.current_nodes() != 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.current_nodes() == 2


def test_a_login_that_succeeds_at_once_does_not_load_the_retry_library(three_hosts: SSHHosts, tmp_path: Any) -> None:
    """tenacity (and tornado, which it imports) loads only when a first attempt fails in a way
    that may pass: about 17 ms of every SSH pool's and `skyward exec`'s start otherwise. The
    retries themselves are tested above (a host that boots meanwhile)."""
    import sys

    h = three_hosts[0]
    code = ("import sys\n"
            "from skyward.bootstrap.remote import Remote, Target\n"
            f"r = Remote(Target({h.address!r}, {h.port}, {h.user!r}, {str(h.key_path)!r}, "
            f"known_hosts={str(tmp_path / 'known_hosts')!r})).open()\n"
            "try:\n"
            "    print(r.run('echo up')[1].strip(), 'tenacity' in sys.modules)\n"
            "finally:\n"
            "    r.close()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["up", "False"], done.stdout + done.stderr
