"""sky.AWS / sky.GCP configs: a missing Pulumi CLI fails at once, says how to install it, and
leaves nothing behind; settings are checked where they are written."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import skyward as sky
from skyward.errors import ConfigError, PulumiNotFoundError


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize("provider", [sky.AWS(), sky.GCP(project="p")], ids=["aws", "gcp"])
def test_without_the_pulumi_cli_a_cloud_pool_fails_at_once_and_writes_nothing(
    provider: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SKYWARD_HOME", str(home))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no pulumi anywhere
    before = set(os.listdir(tmp_path))
    started = time.monotonic()
    with pytest.raises(PulumiNotFoundError) as info, sky.Compute(provider=provider, nodes=2):
        pytest.fail("the pool must not open")
    assert time.monotonic() - started < 5
    text = str(info.value)
    assert "Pulumi CLI was not found" in text
    assert f"curl -fsSL https://get.pulumi.com | sh -s -- --install-root {home / 'pulumi'}" in text
    assert "skyward.stacks.cli" in text and "sky.Local()" in text
    assert _files(home) == [] and set(os.listdir(tmp_path)) == before


def test_the_cli_under_skyward_home_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skyward.stacks import cli

    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert cli.find() is None
    exe = tmp_path / "pulumi" / "bin" / "pulumi"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert cli.find() == exe


def test_provider_settings_are_checked_where_they_are_written() -> None:
    with pytest.raises(ConfigError, match="list of CIDRs"):
        sky.AWS(allow_ssh_from="1.2.3.4/32")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_duration"):
        sky.AWS(max_duration=0)
    with pytest.raises(ConfigError, match="not in the region"):
        sky.GCP(zone="europe-west4-a", region="us-central1")
    assert sky.GCP(zone="europe-west4-b").zone_for(sky.Spec(provider=sky.GCP(zone="europe-west4-b"))) == "europe-west4-b"
    # us-east1 has no zone a: the first real zone
    assert sky.GCP().zone_for(sky.Spec(provider=sky.GCP(), region="us-east1")) == "us-east1-b"


def test_the_whole_internet_is_never_allowed_to_ssh() -> None:
    from skyward.stacks.network import check_cidrs, client_cidrs

    with pytest.raises(ConfigError, match="whole internet"):
        check_cidrs(["0.0.0.0/0"], "sky.AWS(allow_ssh_from=...)")
    with pytest.raises(ConfigError, match="whole internet"):
        check_cidrs(["::/0"], "sky.AWS(allow_ssh_from=...)")
    with pytest.raises(ConfigError, match="not an address"):
        check_cidrs(["my-laptop"], "sky.AWS(allow_ssh_from=...)")
    assert client_cidrs(["203.0.113.9", "198.51.100.0/24"], False, "x") == ("203.0.113.9/32", "198.51.100.0/24")
    with pytest.raises(ConfigError, match="nothing could reach"):
        client_cidrs([], False, "x")


def test_disks_are_validated_and_local_refuses_them() -> None:
    with pytest.raises(ConfigError, match="size_gb"):
        sky.Disk(0)
    for bad in ("/", "/tmp", "data", "/my data"):
        with pytest.raises(ConfigError, match="mount"):
            sky.Disk(10, mount=bad)
    spec = sky.Spec(provider=sky.AWS(), volumes=[sky.Disk(100)])
    assert sky.AWS().check(spec) is None
    assert sky.Local().check(sky.Spec(volumes=[sky.Disk(100)])) is not None


def test_gcp_without_a_project_fails_before_anything_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no gcloud
    # any workspace: the checks of a real one (SDK, CLI) are not what this test is about
    provider = sky.GCP(workspace=lambda name, program: None, detect_address=False, allow_ssh_from=["10.0.0.0/8"])
    spec = sky.Spec(provider=provider)
    with pytest.raises(sky.ConfigError, match="gcloud config set project"):
        provider.preflight(spec)
    assert not (tmp_path / "home").exists()

    # gcloud's configured project is used when nothing else names one
    (tmp_path / "bin").mkdir()
    gcloud = tmp_path / "bin" / "gcloud"
    gcloud.write_text("#!/bin/sh\n[ \"$*\" = 'config get-value project' ] && echo from-gcloud\n")
    gcloud.chmod(0o755)
    provider.preflight(spec)
    assert provider._stack_args(spec, provider.offer(spec))["settings"]["project"] == "from-gcloud"


@pytest.mark.parametrize("image", [
    "projects/debian-cloud/global/images/family/debian-12",
    "projects/cos-cloud/global/images/family/cos-stable",
    "debian-12-bookworm-v20250101",
])
def test_gcp_images_without_cloud_init_are_refused(image: str) -> None:
    with pytest.raises(sky.ConfigError, match="cloud-init"):
        sky.GCP(image=image)


def test_gcp_ubuntu_images_are_accepted() -> None:
    sky.GCP(image="projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64")


def test_a_cloud_provider_pickled_before_a_field_was_added_loads_with_its_default() -> None:
    """A named pool's description holds its pickled spec: one written by a skyward without
    ``fanout`` (the newest field) still loads, and one from a newer skyward says so."""
    import pickle

    provider = sky.AWS(region="eu-west-1", fanout=True)
    state = provider.__getstate__()
    older = sky.AWS.__new__(sky.AWS)
    older.__setstate__(state[:-1])
    assert older.region == "eu-west-1" and older.fanout is False
    assert pickle.loads(pickle.dumps(provider)).fanout is True
    with pytest.raises(TypeError, match="newer skyward"):
        sky.AWS.__new__(sky.AWS).__setstate__([*state, "extra"])
