"""sky.Container against a real podman: the base image (Debian bookworm from Debian's mirror, no
registry needed; built once by base_image.sh and cached in podman's store), and checks that a
test left no container or network of its pools behind."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

BASE = "localhost/skyward-test-base:bookworm"
HERE = Path(__file__).parent


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=check
    )


def pool_containers(pool_id: str | None = None) -> list[str]:
    """Containers (any state) of skyward pools; of one pool with ``pool_id``."""
    label = f"skyward.pool={pool_id}" if pool_id else "skyward.pool"
    return podman("ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}").stdout.split()


def pool_networks(pool_id: str | None = None) -> list[str]:
    out = podman("network", "ls", "--format", "json").stdout
    nets = json.loads(out or "[]")
    found = []
    for n in nets:
        labels = n.get("labels") or n.get("Labels") or {}
        if "skyward.pool" in labels and (pool_id is None or labels["skyward.pool"] == pool_id):
            found.append(n.get("name") or n.get("Name"))
    return found


@pytest.fixture(scope="session")
def base_image() -> str:
    """The image every test pool starts from; skips only where podman is not installed."""
    if shutil.which("podman") is None:
        pytest.skip(
            "podman is not installed (apt-get install podman runc debootstrap; .ci/run does it)"
        )
    info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False)
    assert info.returncode == 0, f"podman is installed but does not work here: {info.stderr}"
    built = subprocess.run(
        ["bash", str(HERE / "base_image.sh"), BASE], capture_output=True, text=True, timeout=900
    )
    assert built.returncode == 0, f"could not build the test base image: {built.stderr[-2000:]}"
    return BASE


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """The test's pools leave no container and no network (others' pools are not counted)."""
    before_c, before_n = set(pool_containers()), set(pool_networks())
    yield
    left_c = [c for c in pool_containers() if c not in before_c]
    left_n = [n for n in pool_networks() if n not in before_n]
    if left_c:
        podman("rm", "-f", "-t", "0", *left_c, check=False)
    for n in left_n:
        podman("network", "rm", "-f", n, check=False)
    assert not left_c and not left_n, f"left behind: containers {left_c}, networks {left_n}"
