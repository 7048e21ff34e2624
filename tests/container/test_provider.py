"""sky.Container end to end on a real podman: the Image's apt, pip, env and includes through the
SSH nodes' bootstrap, two containers on a network of the pool's own, collections across them, the
runtime's limits, teardown on every exit path (a crashed client included) and the errors."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

import skyward as sky

from .conftest import podman, pool_containers, pool_networks

pytestmark = pytest.mark.timeout(600)
QUIET = sky.Options(console=False)


def open_and_close(**kw: object) -> None:
    with sky.Compute(options=QUIET, **kw):  # type: ignore[arg-type]
        pass


@pytest.fixture(scope="module")
def includes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("inc") / "ctrhelper"
    folder.mkdir()
    (folder / "__init__.py").write_text("ANSWER = 42\n")
    return folder


@pytest.fixture(scope="module")
def pool(base_image: str, includes: Path) -> Iterator[sky.Pool]:
    """Two containers from the Debian base, given apt, pip, env and includes by their Image."""
    image = sky.Image(
        apt=["jq"], pip=["tomli-w"], env={"CTR_GREETING": "hi there"}, includes=[str(includes)]
    )
    with sky.Compute(
        provider=sky.Container(image=base_image), nodes=2, image=image, options=QUIET
    ) as p:
        yield p
    assert pool_containers(p.id) == [] and pool_networks(p.id) == []


@sky.function
def node_facts() -> dict[str, object]:
    import importlib.util
    import socket
    import subprocess
    import sys

    info = sky.instance_info()
    jq = subprocess.run(["jq", "--version"], capture_output=True, text=True)
    import ctrhelper  # the includes

    return {
        "node": info.node,
        "hostname": socket.gethostname(),
        "interface": info.network.interface,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "executable": sys.executable,
        "jq": jq.stdout.strip(),
        "greeting": os.environ.get("CTR_GREETING"),
        "tomli_w": importlib.util.find_spec("tomli_w") is not None,
        "answer": ctrhelper.ANSWER,
        "os": open("/etc/os-release").read(),
        "peers": [p.private_ip for p in info.peers],
    }


def test_the_image_is_installed_in_each_container_by_the_node_bootstrap(pool: sky.Pool) -> None:
    facts = sorted(node_facts() @ pool, key=lambda f: f["node"])  # type: ignore[arg-type, return-value]
    assert [f["node"] for f in facts] == [0, 1]
    for f in facts:
        assert f["jq"].startswith("jq-"), f  # Image.apt through the container's apt
        assert f["tomli_w"] and f["answer"] == 42 and f["greeting"] == "hi there", f
        assert f["python"] == f"{sys.version_info.major}.{sys.version_info.minor}", f
        assert f["executable"].startswith("/opt/skyward/envs/"), (
            f
        )  # the bootstrap's venv, not the client's
        assert "bookworm" in f["os"] and f["interface"] == "eth0", f
    assert len({f["hostname"] for f in facts}) == 2
    # One network of the pool's own, in the range of the pools' subnets (not podman's 10.88/16).
    peers = facts[0]["peers"]
    assert len(peers) == 2 and all(
        ipaddress.ip_address(p) in ipaddress.ip_network("10.217.0.0/16") for p in peers
    )
    (network,) = pool_networks(pool.id)
    assert sorted(pool_containers(pool.id)) == sorted(f["hostname"] for f in facts)
    assert network == f"skyward-{pool.id}"
    # No port published: the agents are reached on Unix sockets in the host's 0700 folders.
    for name in pool_containers(pool.id):
        ports = podman("port", name, check=False).stdout.strip()
        assert ports == "", ports
    record = pool.cluster.describe()
    for n in record["nodes"]:
        folder = Path(n["folder"])
        assert oct(folder.stat().st_mode & 0o777) == "0o700" and (folder / "agent.sock").is_socket()


@sky.function
def count_and_wait() -> int:
    c = sky.counter("hits")
    c.increment(5)
    sky.barrier("both", n=2).wait()
    return int(c.value)


def test_collections_are_shared_across_the_containers(pool: sky.Pool) -> None:
    assert count_and_wait() @ pool == [10, 10]


@sky.function
def meet(port: int) -> str:
    """Node 0 listens on its address on the pool's network; node 1 connects to it there."""
    import socket
    import time

    info = sky.instance_info()
    if info.node == 0:
        with socket.create_server((info.head_addr, port)) as srv:
            srv.settimeout(30)
            conn, peer = srv.accept()
            conn.close()
            return f"accepted {peer[0]}"
    for _ in range(200):
        try:
            socket.create_connection((info.head_addr, port), timeout=2).close()
            return f"connected {info.head_addr}"
        except OSError:
            time.sleep(0.1)
    return "never connected"


def test_the_nodes_reach_each_other_on_the_pools_network(pool: sky.Pool) -> None:
    n0, n1 = sorted(pool.cluster.describe()["nodes"], key=lambda n: n["index"])
    assert sorted(meet(24567) @ pool) == [
        f"accepted {n1['private_ip']}",
        f"connected {n0['private_ip']}",
    ]


def test_vcpus_and_memory_become_the_containers_limits(base_image: str, no_leftovers: None) -> None:
    with sky.Compute(
        provider=sky.Container(image=base_image), nodes=1, vcpus=1, memory_gb=0.5, options=QUIET
    ) as p:
        (name,) = pool_containers(p.id)
        limits = podman(
            "inspect", "--format", "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}", name
        ).stdout.split()
    assert limits == [str(10**9), str(512 * 2**20)], limits


def test_teardown_on_an_exception_removes_containers_and_network(
    base_image: str, no_leftovers: None
) -> None:
    seen: list[str] = []

    def fail() -> None:
        with sky.Compute(provider=sky.Container(image=base_image), nodes=1, options=QUIET) as p:
            seen.append(p.id)
            assert len(pool_containers(p.id)) == 1
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    assert pool_containers(seen[0]) == [] and pool_networks(seen[0]) == []


CRASH = """
    import os, sys
    import skyward as sky
    with sky.Compute(provider=sky.Container(image={image!r}), nodes=1, ttl=4,
                     options=sky.Options(console=False)) as pool:
        print(pool.id, flush=True)
        os._exit(9)  # no teardown at all: as a client that was killed
"""


def test_a_crashed_clients_containers_stop_at_their_lease_and_are_removed(
    base_image: str, no_leftovers: None
) -> None:
    code = textwrap.dedent(CRASH).format(image=base_image)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr[-3000:]
    pool_id = proc.stdout.split()[0]
    wait_for(lambda: pool_containers(pool_id) == [], timeout=60, what="the pool's containers to go", step=0.5)
    # Its agent emptied the node's folder on this machine before it went (the socket, the log, the
    # pool's files). The empty folders and the network outlive it (a later pool sweeps them after
    # ten minutes): this test removes them.
    import glob
    import shutil

    for folder in glob.glob(f"{tempfile.gettempdir()}/sky-ctr-{pool_id}-*"):
        files = [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]
        shutil.rmtree(folder)
        assert files == [], files
    for net in pool_networks(pool_id):
        podman("network", "rm", net)


def test_an_image_that_is_not_there_says_what_podman_said_and_how_to_fix_it(
    base_image: str, no_leftovers: None
) -> None:
    with pytest.raises(sky.ProviderError) as info:
        open_and_close(provider=sky.Container(image="localhost/skyward-no-such-image:1"), nodes=1)
    text = str(info.value)
    assert "podman said" in text and "skyward-no-such-image" in text and "podman pull" in text, text


def test_a_missing_runtime_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(
        sky.ProviderError, match=r"no '/nonexistent/podman' on PATH.*apt-get install podman"
    ):
        open_and_close(provider=sky.Container(binary="/nonexistent/podman"), nodes=1)


def test_another_python_than_the_clients_is_refused_with_the_way_out(
    base_image: str, no_leftovers: None
) -> None:
    with pytest.raises(sky.ProviderError, match=r"nodes want Python 3\.12.*install='index'"):
        open_and_close(
            provider=sky.Container(image=base_image), image=sky.Image(python="3.12"), nodes=1
        )


@sky.function
def python_path() -> str:
    import sys

    return sys.executable


def test_container_with_no_image_takes_the_machines_default_base(
    base_image: str, no_leftovers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Code written as `sky.Container()` runs unchanged where no registry is reachable.
    monkeypatch.setenv("SKYWARD_CONTAINER_IMAGE", base_image)
    with sky.Compute(provider=sky.Container(), nodes=1, options=QUIET) as p:
        (name,) = pool_containers(p.id)
        image = podman("inspect", "--format", "{{.ImageName}}", name).stdout.strip()
        assert (python_path() >> p).startswith("/opt/skyward/envs/")
    assert image == base_image


@sky.function
def hostname() -> str:
    import socket

    return socket.gethostname()


def test_a_lost_container_is_replaced_by_a_new_one_with_its_rank(
    base_image: str, no_leftovers: None
) -> None:
    with sky.Compute(provider=sky.Container(image=base_image), nodes=2, options=QUIET) as p:
        first = sorted(hostname() @ p)
        podman("rm", "-f", "-t", "0", first[1])  # the node's container is gone, agent and all
        wait_for(lambda: first[1] not in pool_containers(p.id), timeout=30, what="the lost container to go", step=0.5)
        again = sorted(hostname() @ p)
    assert (
        again[0] == first[0] and again[1] not in first and again[1].startswith(f"skyward-{p.id}-")
    ), again


def test_bad_settings_are_refused_where_they_are_given() -> None:
    with pytest.raises(sky.ConfigError, match="binary='lxc'"):
        sky.Container(binary="lxc")
    with pytest.raises(sky.ConfigError, match="install='pip'"):
        sky.Container(install="pip")  # type: ignore[arg-type]


@sky.function
def greeting_var() -> str:
    return os.environ.get("GUIDE_VAR", "not set")


@sky.function
def place() -> tuple[int, int, bool]:
    info = sky.instance_info()  # (no assert here: pytest's rewrite of it is not on the nodes)
    if info is None:
        raise RuntimeError("no instance_info on a node")
    return info.node, info.total_nodes, info.is_head


@sky.function
def my_part_summed(data: list[int]) -> int:
    return sum(sky.shard(data))


def test_the_reference_guides_shape_runs_on_a_bare_sky_container(
    base_image: str, no_leftovers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reference's local-containers guide as written: sky.Container() with no image (this
    # machine names its base in SKYWARD_CONTAINER_IMAGE), one node with an Image's env, then
    # three nodes, a broadcast and sky.shard.
    monkeypatch.setenv("SKYWARD_CONTAINER_IMAGE", base_image)
    with sky.Compute(
        provider=sky.Container(), nodes=1, image=sky.Image(env={"GUIDE_VAR": "it works"}), options=QUIET
    ) as p:
        assert greeting_var() >> p == "it works"
    with sky.Compute(provider=sky.Container(), nodes=3, options=QUIET) as p:
        assert sorted(place() @ p) == [(0, 3, True), (1, 3, False), (2, 3, False)]
        parts = my_part_summed(list(range(100))) @ p
        assert sum(parts) == sum(range(100)) and all(0 < s < sum(range(100)) for s in parts), parts


def test_a_docker_image_names_the_nodes_base(base_image: str, no_leftovers: None) -> None:
    image = sky.DockerImage.of(base_image, ubuntu=None)
    with sky.Compute(provider=sky.Container(image=image), nodes=1, options=QUIET) as p:
        (name,) = pool_containers(p.id)
        assert podman("inspect", "--format", "{{.ImageName}}", name).stdout.strip() == base_image
        assert hostname() >> p == name


@sky.function
def serve_upper() -> dict[str, object]:
    """A server on the node's loopback and on a Unix socket there, in the worker (its threads
    outlive the task): each connection gets what it sent, upper-cased."""
    import os
    import socket
    import tempfile
    import threading

    def serve(listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                conn.sendall(data.upper())

    tcp = socket.create_server(("127.0.0.1", 0))
    path = os.path.join(tempfile.mkdtemp(), "upper.sock")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(path)
    unix.listen()
    for listener in (tcp, unix):
        threading.Thread(target=serve, args=(listener,), daemon=True).start()
    return {"port": tcp.getsockname()[1], "socket": path, "node": sky.instance_info().node}


def _ask(stream: Any, data: bytes) -> bytes:
    try:
        stream.sendall(data)
        stream.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := stream.recv(65536):
            answer += chunk
        return answer
    finally:
        stream.close()


def test_a_container_node_is_reached_through_the_runtimes_exec_streams_and_shell(pool: sky.Pool) -> None:
    """No port is published and the container's loopback is its own: a relay on ``exec`` carries
    a stream to a port or a socket there; a shell is the runtime's ``exec``."""
    from skyward.providers.base import ExecShell

    where = serve_upper() >> pool
    node = int(where["node"])  # type: ignore[call-overload]  # a fresh pool: its ranks are its indices
    assert _ask(pool.cluster.open_stream(node, int(where["port"])), b"to the port") == b"TO THE PORT"  # type: ignore[call-overload]
    assert _ask(pool.cluster.open_stream(node, str(where["socket"])), b"to the socket") == b"TO THE SOCKET"
    shell = pool.cluster.shell(node)
    assert isinstance(shell, ExecShell)
    ran = subprocess.run([*shell.argv(False), "hostname"], capture_output=True, text=True, timeout=60)
    hostnames = {f["node"]: f["hostname"] for f in node_facts() @ pool}  # type: ignore[index]
    assert ran.returncode == 0 and ran.stdout.strip() == hostnames[node], ran
