"""Bad input fails at the call site, with the value, the rule and the next step."""

from __future__ import annotations

import re
import sys

import pytest

import skyward as sky


@sky.function
def one() -> int:
    return 1


@pytest.mark.parametrize("nodes", [0, -1])
def test_nodes_must_be_positive(nodes: int) -> None:
    with pytest.raises(sky.ConfigError, match=rf"nodes={nodes} .*at least 1 node"):
        sky.Compute(nodes=nodes)


def test_nodes_of_wrong_type() -> None:
    with pytest.raises(sky.ConfigError, match="nodes='two'"):
        sky.Compute(nodes="two")  # type: ignore[arg-type]
    with pytest.raises(sky.ConfigError, match="min=5"):
        sky.Nodes(desired=2, min=5)


def test_unknown_accelerator_suggests() -> None:
    with pytest.raises(sky.AcceleratorError, match=r"A1000.*A100"):
        sky.Compute(accelerator="A1000")


def test_accelerator_strings_are_converted() -> None:
    spec = sky.Spec(accelerator="H100:8")
    assert spec.accelerator == sky.accelerators.H100(count=8)


def test_dispatch_without_active_pool() -> None:
    with pytest.raises(sky.NoActivePoolError, match=r"no active pool|none here"):
        one() >> sky
    with pytest.raises(sky.NoActivePoolError):
        one() @ sky


def test_dispatch_to_something_else() -> None:
    with pytest.raises(sky.DispatchError, match="right-hand side must be a pool"):
        one() >> 42


def test_group_rejects_broadcast_and_async(pool: sky.Pool) -> None:
    group = one() & one()
    with pytest.raises(sky.DispatchError, match="broadcast"):
        group @ pool
    with pytest.raises(sky.DispatchError, match="async"):
        group > pool  # noqa: B015
    assert group >> pool == (1, 1)


def test_and_with_a_result_explains_precedence(pool: sky.Pool) -> None:
    with pytest.raises(sky.DispatchError, match=r"\(a\(\) & b\(\)\) >> pool"):
        one() & one() >> pool


def test_flat_kwargs_mixed_with_specs() -> None:
    with pytest.raises(sky.ConfigError, match="together"):
        sky.Compute(sky.Spec(), nodes=2)


def test_unknown_keyword_is_suggested() -> None:
    with pytest.raises(sky.ConfigError, match=r"'node'.*Did you mean 'nodes'"):
        sky.Compute(node=2)


def test_worker_given_twice() -> None:
    with pytest.raises(sky.ConfigError, match="both"):
        sky.Compute(worker=sky.Worker(), options=sky.Options(worker=sky.Worker()))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: sky.Worker(concurrency=0), "concurrency=0"),
        (lambda: sky.Worker(executor="fork"), "executor='fork'"),
        (lambda: sky.Image(pip="numpy"), r"pip=\['numpy'\]"),
        (lambda: sky.Spec(allocation="sometimes"), "allocation='sometimes'"),
        (lambda: sky.Spec(provider="aws"), "not a provider"),
        (lambda: sky.Spec(ttl=-1), "ttl=-1"),
        (lambda: sky.function(timeout=-5), "timeout=-5"),
        (lambda: sky.Options(console="loud"), "console='loud'"),
        (lambda: sky.PipIndex(url="pypi.org"), "https://"),
    ],
)
def test_invalid_values(make, match: str) -> None:
    with pytest.raises(sky.ConfigError, match=match):
        make()


def test_pool_closed_after_block() -> None:
    with sky.Compute(nodes=1) as pool:
        pass
    with pytest.raises(sky.PoolClosedError):
        one() >> pool


def test_local_refuses_another_python() -> None:
    other = f"3.{sys.version_info.minor + 1}"  # valid for an Image, not the interpreter Local reuses
    with pytest.raises(sky.ProviderError, match="Python"), sky.Compute(image=sky.Image(python=other)):
        pass


@pytest.mark.parametrize("python", ["2.7", "3.6", "3.10"])
def test_image_refuses_a_python_the_agent_cannot_run(python: str) -> None:
    with pytest.raises(sky.ConfigError, match=r"needs Python 3\.11 or newer"):
        sky.Image(python=python)


@pytest.mark.parametrize("host", ["me@10.0.0.1:99999", "10.0.0.1:0", "[::1]:65536"])
def test_ssh_refuses_a_port_out_of_range(host: str) -> None:
    with pytest.raises(sky.ConfigError, match="is not a TCP port: ports go from 1 to 65535"):
        sky.SSH(hosts=[host])


def test_ssh_refuses_out_of_range_ports_given_as_numbers() -> None:
    with pytest.raises(sky.ConfigError, match=r"sky\.SSH\(port=70000\)"):
        sky.SSH(hosts=["10.0.0.1"], port=70000)
    with pytest.raises(sky.ConfigError, match="port -1 of host 'h'"):
        sky.SSHHost("h", port=-1)
    assert sky.SSH(hosts=["me@10.0.0.1:65535"]).hosts == ("me@10.0.0.1:65535",)


def test_local_refuses_missing_gpus() -> None:
    with pytest.raises(sky.ProviderError, match="H100"), sky.Compute(accelerator=sky.accelerators.H100(count=8)):
        pass


def test_errors_share_one_root() -> None:
    for name in sky.__all__:
        obj = getattr(sky, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == "skyward.errors":
            assert issubclass(obj, sky.SkywardError)


def test_plugins_must_be_plugin_objects() -> None:
    with pytest.raises(sky.ConfigError, match=r"plugins=.*sky\.plugins\.torch\(\)"), sky.Compute(plugins=["torch"]):
        pass


@pytest.mark.parametrize(("volumes", "shown"), [
    (["/data"], "'/data'"),
    ([5], "5"),
    ([{"bucket": "data", "mount": "/data"}], "{'bucket': 'data', 'mount': '/data'}"),
    ([sky.Disk(10), "/scratch"], "'/scratch'"),
])
def test_a_volume_that_is_not_one_is_refused_where_it_is_given(volumes: list, shown: str) -> None:
    rule = r"a volume is sky\.Volume\(bucket, mount\) or sky\.Disk\(size_gb, mount=\.\.\.\)"
    with pytest.raises(sky.ConfigError, match=rf"volumes=\[.*\] is not valid: {re.escape(shown)} is not a volume; {rule}"):
        sky.Compute(volumes=volumes)
    with pytest.raises(sky.ConfigError, match=re.escape(shown)):
        sky.Spec(volumes=volumes)


@pytest.mark.parametrize("volumes", ["/data", sky.Disk(10), 5])
def test_volumes_is_a_list(volumes: object) -> None:
    with pytest.raises(sky.ConfigError, match=rf"volumes={re.escape(repr(volumes))} is not valid: a list"):
        sky.Compute(volumes=volumes)  # type: ignore[arg-type]
