"""Records and reproduce on real sshd test hosts (tests/sshhosts.py): the nodes install exactly
the lock resolved on the client, from the shipped wheelhouse (the hosts have no index); a
reproduction after a newer version came out installs the recorded one; the nodes' own Python version is recorded."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sshhosts import SSHHosts, SSHHostsUnavailable

import skyward as sky
from skyward.named.cli import main
from skyward.records import record

sys.path.insert(0, str(Path(__file__).parent))
from pkgindex import Index

pytestmark = pytest.mark.timeout(600)
QUIET = sky.Options(console=False, logging=False)


@pytest.fixture(scope="module")
def hosts() -> Iterator[SSHHosts]:
    made = SSHHosts(1)
    try:
        made.start()
    except SSHHostsUnavailable as e:
        pytest.skip(f"SSH test hosts unavailable: {e}")
    try:
        yield made
    finally:
        made.close()


def provider(hosts: SSHHosts) -> Any:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path),
                                      host_key=h.host_public_key) for h in hosts])


@sky.function
def probe() -> tuple[str, str]:
    import platform

    import skyprobe  # type: ignore[import-not-found]

    return str(skyprobe.VERSION), platform.python_version()


def test_ssh_nodes_install_the_lock_and_a_reproduction_the_recorded_version(
        hosts: SSHHosts, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = Index(tmp_path / "index")
    index.publish("1.0")
    # (No apt here: see test_the_versions_apt_installed_on_the_node_are_in_the_lock.)
    image = sky.Image(pip=["skyprobe"],
                      pip_indexes=[sky.PipIndex(url=index.url, packages=("skyprobe",))])
    with sky.Compute(provider=provider(hosts), image=image, options=QUIET) as pool:
        version, python = probe() >> pool
        first = pool.id
    assert version == "1.0"
    lock = record.read(first)["lock"]
    versions = {p["name"]: p["version"] for p in lock["packages"]}
    assert versions["skyprobe"] == "1.0"
    # The agent's own dependencies are in the lock too, at the client's versions, with hashes.
    from importlib.metadata import version as installed

    assert versions["cloudpickle"] == installed("cloudpickle")
    assert all(p["hashes"] for p in lock["packages"])
    assert lock["python"] == python  # what the node runs, to the patch release
    assert record.read(first)["provider"] == "ssh"

    index.publish("2.0")
    with sky.Compute(provider=provider(hosts), image=image, options=QUIET) as pool:
        assert (probe() >> pool)[0] == "2.0"
        fresh = pool.id
    with sky.Compute(reproduce=first, options=QUIET) as pool:
        assert (probe() >> pool)[0] == "1.0"
        again = pool.id
    assert record.read(again)["reproduces"] == first
    capsys.readouterr()
    assert main(["diff", first, fresh]) == 1
    assert "skyprobe" in capsys.readouterr().out
    assert main(["diff", first, again]) == 0


def test_the_versions_apt_installed_on_the_node_are_in_the_lock(hosts: SSHHosts, home: Path) -> None:
    # The test hosts share this machine's /usr and dpkg database, and have no network: an
    # apt-get that does nothing stands in for the install (first on PATH), and the real
    # dpkg-query reports what is installed, as it would after a real install on a node.
    # (The hosts' /tmp, /var/tmp and homes are their own tmpfs; /srv is this machine's.)
    if not os.path.isdir("/srv") or not os.access("/srv", os.W_OK):
        pytest.skip("needs a writable /srv that the test hosts see")
    shims = Path(tempfile.mkdtemp(prefix="skyward-apt-shim-", dir="/srv"))
    try:
        _apt_lock(hosts, shims)
    finally:
        shutil.rmtree(shims, ignore_errors=True)


def _apt_lock(hosts: SSHHosts, shims: Path) -> None:
    (shims / "apt-get").write_text("#!/bin/sh\necho \"apt-get $*\" >> \"$(dirname \"$0\")/calls\"\n")
    (shims / "apt-get").chmod(0o755)
    path = f"{shims}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    image = sky.Image(apt=["openssh-server"], env={"PATH": path})
    with sky.Compute(provider=provider(hosts), image=image, options=QUIET) as pool:
        assert (sky.function(lambda: 1)() >> pool) == 1
        pool_id = pool.id
    assert "install" in (shims / "calls").read_text()  # the apt phase ran, through the shim
    from skyward.records.resolver import apt_versions

    assert record.read(pool_id)["lock"]["apt"] == apt_versions(["openssh-server"]) != {}
