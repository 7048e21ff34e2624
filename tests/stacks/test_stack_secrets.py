"""A cloud pool's secrets travel in its stack as Pulumi secrets, never as plain config:
``sky.Storage`` keys, a package index's password and secret ``Image.env`` values are
not in the stack's config (the pool's description, which the update history repeats and the
dashboard serves), not in what skyward saves of the stack when it is removed, and not readable
by another local user (``nobody``) anywhere under SKYWARD_HOME; the program exports them as one
secret output (encrypted in the state), so the stack still says how to make the pool again.

The automation API runs against the fake workspace; the program runs under Pulumi's mocks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")

from stackfakes import FakeWorkspace, fresh_mocks  # noqa: E402

import skyward as sky  # noqa: E402
from skyward.catalogue import Offer  # noqa: E402
from skyward.stacks import cloudpool  # noqa: E402

STORAGE_KEY = "AKIASTACK00000KEY1"
STORAGE_SECRET = "stack-storage-secret-1618"
INDEX_PASSWORD = "stack-index-pass-1414"
ENV_SECRET = "stack-env-secret-1732"
SECRETS = (STORAGE_KEY, STORAGE_SECRET, INDEX_PASSWORD, ENV_SECRET)
OFFER = Offer("aws", "m7i.large", "us-east-1", 2, 8, "x86_64", on_demand=0.1)


pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def secret_spec() -> sky.Spec:
    storage = sky.Storage("https://minio.example.com", STORAGE_KEY, STORAGE_SECRET, path_style=True)
    image = sky.Image(pip_indexes=[sky.PipIndex(f"https://alice:{INDEX_PASSWORD}@pkgs.example.com/simple")],
                      env={"API_KEY": ENV_SECRET, "MODE": "fast"})
    return sky.Spec(provider=sky.AWS(region="us-east-1"), image=image,
                    volumes=[sky.Volume("data", "/data", storage=storage)])


def launched(ws: FakeWorkspace, spec: sky.Spec) -> cloudpool.CloudPool:
    return cloudpool.launch(
        "aws", spec, "ab12cd34", OFFER, lambda plan: None, provider=spec.provider, zone=None, image=None,
        user="ubuntu", settings={}, allow_ssh_from=["198.51.100.7/32"], detect_address=False,
        max_duration=None, plugins={}, connect=ws, pool_name="sec",
    )


def in_clear(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def test_the_stack_config_and_history_hold_no_secret_in_clear(home: Path) -> None:
    ws = FakeWorkspace()
    cloud = launched(ws, secret_spec())
    cloud.start(1)
    stack = cloud.plan.stack
    config = ws.configs[stack]
    plain = {k: v.value for k, v in config.items() if not v.secret}
    assert in_clear(json.dumps(plain)) == [], plain  # every secret config entry is marked secret
    described = json.loads(plain["skyward:pool"])
    storage = described["volumes"][0]["storage"]
    assert storage["endpoint"] == "https://minio.example.com"  # the rest of the pool is described
    assert storage["access_key"].startswith("hmac:") and storage["secret_key"].startswith("hmac:")
    assert described["image"]["pip_indexes"][0]["url"] == "https://***@pkgs.example.com/simple"
    # The program's secret output carries them: the stack still says how to make the pool again.
    kept = json.loads(cloud._secrets["storage"])
    assert [kept[0]["access_key"], kept[0]["secret_key"]] == [STORAGE_KEY, STORAGE_SECRET]
    assert INDEX_PASSWORD in cloud._secrets["indexes"]

    assert in_clear(json.dumps(cloud.stack.history(), default=str)) == []
    cloud.close()  # its history is copied under SKYWARD_HOME before the stack is removed
    for path in home.rglob("*"):
        if path.is_file():
            assert in_clear(path.read_text(errors="replace")) == [], path
    if os.geteuid() == 0 and shutil.which("setpriv"):
        home.parent.chmod(0o755)  # only skyward's own file modes stop nobody
        scan = ("import os,sys\nfor d,_,fs in os.walk(sys.argv[1]):\n for f in fs:\n  try: print(open(os.path.join("
                "d,f),errors='replace').read())\n  except OSError: pass\n")
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-I",
                               "-c", scan, str(home)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert in_clear(proc.stdout) == []


def test_the_dashboard_and_history_mask_an_old_stack_whose_config_held_keys(home: Path) -> None:
    """Stacks made before this change hold the keys in their plain config: what skyward shows of
    their update history masks them."""
    from skyward.dashboard.views import clean
    from skyward.stacks import engine

    old = {"volumes": [{"type": "Volume", "storage": {"type": "Storage", "endpoint": "https://minio.example.com",
                                                       "access_key": STORAGE_KEY, "secret_key": STORAGE_SECRET}}],
           "image": {"pip_indexes": [{"url": f"https://alice:{INDEX_PASSWORD}@pkgs.example.com/simple"}]}}

    class Entry:
        kind, result, message, start_time, end_time, version = "update", "succeeded", "", "t0", None, 1
        resource_changes: dict[str, int] = {}
        environment: dict[str, str] = {}
        config = {"skyward:pool": type("V", (), {"value": json.dumps(old), "secret": False})()}

    summary = engine._summary(Entry())
    assert in_clear(json.dumps(summary)) == [], summary
    assert "minio.example.com" in summary["config"]["skyward:pool"]
    assert in_clear(json.dumps(clean({"updates": {"s": [{"config": {"skyward:pool": json.dumps(old)}}]}}))) == []


@pulumi.runtime.test
def test_the_program_exports_the_secrets_as_a_secret_output() -> Any:
    fresh_mocks()
    ws = FakeWorkspace()
    exported: dict[str, Any] = {}
    real_export = pulumi.export
    cloud = launched(ws, secret_spec())
    program = cloudpool._Program(cloud, lambda plan: None)
    pulumi.export = lambda name, value: exported.__setitem__(name, value)  # type: ignore[assignment]
    try:
        program()
    finally:
        pulumi.export = real_export
    out = exported["secrets"]

    def check(args: list[Any]) -> None:
        secret, value = args
        assert secret is True
        assert STORAGE_SECRET in value and INDEX_PASSWORD in value and ENV_SECRET in value

    return pulumi.Output.all(pulumi.Output.from_input(out).is_secret(), out).apply(check)
