from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: s3server, sshhosts

pytest.importorskip("obstore", reason="the storage extra is not installed: pip install -e '.[storage]'")
pytest.importorskip("moto", reason="moto is not installed: pip install 'moto[server]'")

from s3server import S3Server


@pytest.fixture(scope="package")
def s3() -> Iterator[S3Server]:
    """One moto server on loopback for the storage tests."""
    with S3Server("127.0.0.1") as server:
        yield server


_bucket_counter = [0]


@pytest.fixture
def bucket(s3: S3Server) -> str:
    """A fresh, empty bucket."""
    _bucket_counter[0] += 1
    name = f"test-{os.getpid()}-{_bucket_counter[0]}"
    s3.create_bucket(name)
    return name


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say why storage tests were skipped (FUSE, rclone, the SSH hosts), also without -rs."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if "tests/storage/" in report.nodeid and isinstance(longrepr, tuple) and len(longrepr) == 3:
            reason = str(longrepr[2]).removeprefix("Skipped: ")
            reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("storage tests skipped")
        for reason, count in reasons.items():
            terminalreporter.line(f"{count} test(s): {reason}")
