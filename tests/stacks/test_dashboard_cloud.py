"""What the dashboard serves of a named cloud pool (fake workspace, SSH test hosts as the nodes):
the stack's resources and its Pulumi updates, and nothing secret (host keys, the agents' token,
the stack's secrets). The views are the functions behind /api/pools/NAME and /stack; the API
itself is tested against the real server in tests/cli/test_dashboard_api.py, which cannot
reach this in-memory workspace from its subprocess."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pulumi")

from sshhosts import SSHHosts
from stackfakes import FakeWorkspace
from test_end_to_end import boot
from test_named_cloud import two_hosts  # noqa: F401 - a fixture (home is the suite's)

from skyward.named import pools as named

pytestmark = pytest.mark.timeout(600)


def test_a_cloud_pools_stack_resources_and_updates_without_secrets(
    two_hosts: SSHHosts, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    from skyward.dashboard import views
    from skyward.named import cli

    ws = FakeWorkspace(node_outputs=boot(two_hosts))
    real = named.provider_from

    def with_fake_workspace(data: dict[str, Any]) -> Any:
        provider = real(data)
        return dataclasses.replace(provider, workspace=ws) if provider.kind == "aws" else provider

    monkeypatch.setattr(named, "provider_from", with_fake_workspace)
    project = tmp_path / "project"
    project.mkdir()
    (project / "skyward.toml").write_text(
        f'[pools.cloud]\nprovider = "aws"\nnodes = 2\nttl = 600\n'
        f'[pools.cloud.aws]\nuser = "{two_hosts.user}"\ndetect_address = false\n'
        f'allow_ssh_from = ["10.0.0.0/8"]\ninstall = "wheelhouse"\n'
        f'[pools.cloud.image.env]\nAPI_KEY = "sk-dashboard-cloud-secret"\n'
    )
    monkeypatch.chdir(project)
    assert cli.main(["up", "cloud", "--json"]) == 0
    capsys.readouterr()
    try:
        record = named.get("cloud")
        stack = views.stack("cloud")
        assert stack["stack"] == record["cluster"]["stack"]["name"]
        types = [r["type"] for r in stack["resources"]]
        assert "aws:ec2/securityGroup:SecurityGroup" in types and "aws:ec2/keyPair:KeyPair" in types
        assert types.count("aws:ec2/instance:Instance") == 2
        assert [u["kind"] for u in stack["updates"][stack["stack"]]] == ["update"]

        served = json.dumps([stack, views.named_pool("cloud"), views.named_pools(), views.history("cloud"),
                             views.config_pools(None)])
        described = record["cluster"]
        secrets = [described["token"], "sk-dashboard-cloud-secret",
                   *(n["host_key_private"] for n in described["stack"]["plan"]["nodes"]),
                   *(v for v in described["stack"]["secrets"].values() if isinstance(v, str) and len(v) > 8)]
        for value in secrets:
            assert value not in served
    finally:
        assert cli.main(["down", "cloud"]) == 0
