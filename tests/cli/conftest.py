"""One helper for every CLI test: run the real ``skyward`` command in a subprocess, with its own
SKYWARD_HOME and working directory, and leave no process behind.

Pools started by ``skyward up`` outlive the command by design, so their agents are orphans.
PID 1 here does not reap orphans: while these tests run, this process is a child subreaper
(prctl), the orphans become its children, and the fixture waits for them.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

_PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture(scope="package", autouse=True)
def subreaper() -> Iterator[None]:
    libc = ctypes.CDLL(None, use_errno=True)
    ok = sys.platform.startswith("linux") and libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    yield
    if ok:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


class CLI:
    """``cli("up", "demo", "--nodes", "2")`` runs ``skyward up demo --nodes 2``."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.cwd = root / "project"
        self.cwd.mkdir(parents=True)
        self.env = {**os.environ, "SKYWARD_HOME": str(self.home), "PYTHONUNBUFFERED": "1"}
        self.env.pop("PYTEST_CURRENT_TEST", None)
        self.seen: set[int] = set()

    def __call__(self, *args: str, timeout: float = 90) -> Result:
        return self._run([sys.executable, "-m", "skyward", *args], timeout)

    def start(self, *args: str) -> subprocess.Popen[str]:
        """The command without waiting for it (the caller waits)."""
        return subprocess.Popen([sys.executable, "-m", "skyward", *args], cwd=self.cwd, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def python(self, source: str, timeout: float = 90) -> Result:
        """A client program, run like the user would, in the project folder."""
        return self._run([sys.executable, "-c", textwrap.dedent(source)], timeout)

    def toml(self, text: str) -> Path:
        path = self.cwd / "skyward.toml"
        path.write_text(textwrap.dedent(text))
        return path

    def record(self, name: str) -> dict[str, Any]:
        return json.loads((self.home / "registry" / f"{name}.json").read_text())

    def _run(self, cmd: list[str], timeout: float) -> Result:
        proc = subprocess.run(cmd, cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        self.seen.update(self.processes())
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def processes(self) -> list[int]:
        """Running processes (agents, workers) started with this test's SKYWARD_HOME."""
        marker = f"SKYWARD_HOME={self.home}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if marker in env.split(b"\0") and _alive(int(entry)):
                found.append(int(entry))
        return found

    def wait_no_processes(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.processes()
            if not left:
                return []
            time.sleep(0.1)
        return self.processes()


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, grace: float = 60.0) -> None:
    """A command started in the background, ended as its user would (``sig``: SIGINT is Ctrl-C),
    killed if it is still there after ``grace`` seconds, waited for, and its pipes closed."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _reap(pids: set[int]) -> None:
    for pid in pids:
        for _ in range(50):
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break  # not our child (or reaped already)
            if done:
                break
            time.sleep(0.02)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[CLI]:
    helper = CLI(tmp_path)
    yield helper
    helper("down", "--all", "--force")
    left = helper.wait_no_processes(10)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    helper.seen.update(left)
    time.sleep(0.1)
    _reap(helper.seen)
    assert not left, f"processes left running after the test: {left}"
