"""Replicas for the router tests: uvicorn serving tests/serve/replica_app.py on a Unix socket,
each in a subprocess that the fixture kills and waits for, whatever the test did."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward.serve.router import Router, Upstream
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]


class Replica:
    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.path = folder / f"{name}.sock"
        env = {**os.environ, "REPLICA": name, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.serve.replica_app:app", "--uds", str(self.path),
             "--log-level", "warning", "--no-access-log"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL)

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"replica {self.name} exited with {self.proc.returncode}"
        if not self.path.exists():
            return False
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(self.path))
            except OSError:
                return False
        return True

    def upstream(self, max_concurrency: int = 0) -> Upstream:
        path = str(self.path)

        async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await asyncio.open_unix_connection(path)

        return Upstream(self.name, connect, max_concurrency)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


def start_replicas(folder: Path, *names: str) -> list[Replica]:
    replicas: list[Replica] = []
    try:
        for name in names:
            replicas.append(Replica(name, folder))
        for r in replicas:
            wait_for(r.ready, 60, f"replica {r.name} listening on {r.path}")
    except BaseException:
        for r in replicas:
            r.kill()
        raise
    return replicas


@contextlib.contextmanager
def _running(folder: Path, *names: str) -> Iterator[list[Replica]]:
    replicas = start_replicas(folder, *names)
    try:
        yield replicas
    finally:
        for r in replicas:
            r.kill()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    """Two replicas, a and b, shared by a module's tests (tests that kill one start their own)."""
    with _running(tmp_path_factory.mktemp("replicas"), "a", "b") as replicas:
        yield replicas


@pytest.fixture
def own_pair(tmp_path: Path) -> Iterator[list[Replica]]:
    with _running(tmp_path, "c", "d") as replicas:
        yield replicas


@pytest.fixture
def routers() -> Iterator[list[Router]]:
    """Routers a test starts (append them): closed at the end."""
    made: list[Router] = []
    try:
        yield made
    finally:
        for r in made:
            r.close()
