"""A real S3-compatible server for tests: moto's server mode, in a child process.

``S3Server(address)`` serves on ``address`` (loopback, or the SSH test bridge's address so that
test hosts reach it), with any access key accepted. It is stopped and reaped on ``close()``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import free_port


class S3Server:
    access_key = "skyward-test"
    secret_key = "skyward-test-secret"

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.address = address
        self.port = free_port(address)
        self.endpoint = f"http://{address}:{self.port}"
        # Never the machine's AWS settings (AWS_CA_BUNDLE, profiles): a clean server.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", address, "-p", str(self.port)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((address, self.port), 1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"moto server did not start on {self.endpoint}") from None
                time.sleep(0.1)

    def storage(self, **kwargs: object):  # -> sky.Storage
        import skyward as sky

        kw = {"access_key": self.access_key, "secret_key": self.secret_key, "path_style": True, **kwargs}
        return sky.Storage(self.endpoint, **kw)

    def create_bucket(self, name: str) -> None:
        """Buckets are made with a plain signed request (sky.Storage does not create buckets)."""
        # moto accepts unsigned requests; object_store has no create-bucket call.
        import urllib.request

        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fuse_skip_reason() -> str | None:
    from skyward.bootstrap.mounts import fuse_problem, local_rclone

    problem = fuse_problem()
    if problem:
        return f"FUSE mount tests skipped: {problem}"
    if os.geteuid() != 0 and not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "FUSE mount tests skipped: /dev/fuse is not usable by this user"
    try:
        local_rclone()
    except Exception as exc:
        return f"FUSE mount tests skipped: {exc}"
    if not shutil.which("mountpoint"):
        return "FUSE mount tests skipped: no `mountpoint` command"
    return None


needs_fuse = pytest.mark.skipif(fuse_skip_reason() is not None, reason=fuse_skip_reason() or "")


def mounts_under(path: str | Path) -> list[str]:
    """Mount points in /proc/mounts at or under ``path``."""
    path = str(path)
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if p == path or p.startswith(path.rstrip("/") + "/")]


def sigterm_once_mounted(script: Path, check: Callable[[], None], wait: float) -> None:
    """Run a client ``script`` until it prints "mounted", ``check()`` its mounts, then SIGTERM it
    and wait up to ``wait`` s for it to exit (killed and reaped whatever happens)."""
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "mounted"
        check()
        proc.send_signal(signal.SIGTERM)
        proc.wait(wait)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
