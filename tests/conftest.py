from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# A suite started in the background of a non-interactive shell (`bash .ci/run &`) inherits SIGINT
# ignored, and so would every program a test starts and then stops with Ctrl-C (an ignored signal
# stays ignored across exec; a handled one is reset to the default there): restore it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# A run with a thread stuck in a hung call still ends (tests/stuck_threads.py says how).
from stuck_threads import pytest_sessionfinish, pytest_unconfigure  # noqa: F401

import skyward as sky


@pytest.fixture(autouse=True, scope="session")
def skyward_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Keep the suite's caches and logs out of the real ~/.skyward."""
    home = tmp_path_factory.mktemp("skyward-home")
    old = os.environ.get("SKYWARD_HOME")
    os.environ["SKYWARD_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("SKYWARD_HOME", None)
    else:
        os.environ["SKYWARD_HOME"] = old


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SKYWARD_HOME of the test's own (``tmp_path/home``, made by whoever writes there first),
    and no Pulumi backend or passphrase from the caller's environment. Modules whose every test
    needs it say ``pytestmark = pytest.mark.usefixtures("home")``; a module that needs more of
    its own overrides it and asks for this one by the same name."""
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    for name in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.Pool]:
    """A 2-node Local pool shared by the tests of one module."""
    with sky.Compute(nodes=2) as p:
        yield p


def alive(pid: int) -> bool:
    """True while pid is a running (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def pool_dirs() -> set[str]:
    """The working and shared-memory folders of Local pools that exist right now."""
    import glob
    import tempfile

    return set(glob.glob("/dev/shm/skyward-*")) | set(glob.glob(f"{tempfile.gettempdir()}/skyward-*"))


def kill_all(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


@contextlib.contextmanager
def small_tmpfs(size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted for a test (a /dev/shm that fills up); unmounted after."""
    if os.geteuid() != 0:
        pytest.fail("mounting a small tmpfs needs root (the test environment runs as root)")
    folder = Path(tempfile.mkdtemp(prefix="skyward-tmpfs-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        folder.rmdir()


@pytest.fixture
def spill() -> Iterator[Path]:
    """A pool's shared-memory folder in /dev/shm: this process's segments there are forgotten
    and every file removed after the test."""
    from skyward.bootstrap import shm

    folder = Path(tempfile.mkdtemp(prefix="skyward-test-", dir="/dev/shm"))
    try:
        yield folder
    finally:
        shm.forget(folder)
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
