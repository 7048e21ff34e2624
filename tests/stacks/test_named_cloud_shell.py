"""`skyward ssh` and `skyward cp` on a named cloud pool: AWS nodes are SSH hosts of
their stack, reached through the stack's own host keys (given in advance: nothing is trusted on
first use). Through the fake workspace, on the SSH test hosts booted as cloud nodes, with the
CLI run in this process as in test_named_cloud.py (the fake workspace lives in memory)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pulumi")

from sshhosts import SSHHosts, SSHHostsUnavailable
from stackfakes import FakeWorkspace
from test_end_to_end import boot

from skyward.named import pools as named

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[SSHHosts]:
    hosts = SSHHosts(2)
    try:
        hosts.start()
    except SSHHostsUnavailable as e:
        pytest.skip(f"SSH test hosts unavailable: {e}")
    try:
        yield hosts
    finally:
        hosts.close()


def test_ssh_and_cp_on_a_named_cloud_pool(two_hosts: SSHHosts, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from skyward.named import cli

    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
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
        f'[pools.cloud.image]\nenv = {{ GREETING = "hi there" }}\n'
        f'[pools.cloud.aws]\nuser = "{two_hosts.user}"\ndetect_address = false\n'
        f'allow_ssh_from = ["10.0.0.0/8"]\ninstall = "wheelhouse"\n'
    )
    monkeypatch.chdir(project)
    assert cli.main(["up", "cloud", "--json"]) == 0
    capsys.readouterr()
    try:
        # One command, no terminal: this process's stdin, stdout and stderr are plain files here.
        out, err = tmp_path / "out.txt", tmp_path / "err.txt"
        with open(os.devnull) as stdin, open(out, "w") as stdout, open(err, "w") as stderr, \
                monkeypatch.context() as m:
            m.setattr(sys, "stdin", stdin)
            m.setattr(sys, "stdout", stdout)
            m.setattr(sys, "stderr", stderr)
            code = cli.main(["ssh", "cloud", "--node", "1", "--", 'hostname; pwd; echo "$GREETING" >&2; exit 3'])
        assert code == 3
        assert err.read_text() == "hi there\n"
        host, cwd = out.read_text().splitlines()
        assert host == two_hosts[1].name
        assert cwd.startswith("/var/tmp/skyward-"), cwd

        src = tmp_path / "x.txt"
        src.write_text("to the cloud\n")
        assert cli.main(["cp", str(src), "cloud:"]) == 0
        assert cli.main(["cp", "cloud:x.txt", str(tmp_path / "back")]) == 0
        for n in ("node-0", "node-1"):
            assert (tmp_path / "back" / n / "x.txt").read_text() == "to the cloud\n"
        capsys.readouterr()
        assert cli.main(["history", "cloud", "--json"]) == 0
        assert [e["event"] for e in json.loads(capsys.readouterr().out)][-3:] == ["ssh", "cp", "cp"]
    finally:
        assert cli.main(["down", "cloud", "--force"]) == 0
