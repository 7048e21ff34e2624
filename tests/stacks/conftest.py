"""Shared fixtures of the stack tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SKYWARD_HOME of the test's own, and no Pulumi backend or passphrase from the caller's
    environment (a test module that wants it for every test says
    ``pytestmark = pytest.mark.usefixtures("home")``)."""
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    for name in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"
