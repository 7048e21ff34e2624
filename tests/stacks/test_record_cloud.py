"""A cloud pool's record and lock, through the fake workspace on SSH test hosts booted as cloud
nodes: the lock (packages, the image id the first update resolved, instance type, region) is in
the stack's config, and reproducing the pool pins that image id in the plan the program gets --
the program then declares the instance with it, looking nothing up."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")

from sshhosts import SSHHosts, SSHHostsUnavailable  # noqa: E402
from stackfakes import FakeWorkspace, fresh_mocks  # noqa: E402
from test_end_to_end import boot  # noqa: E402

import skyward as sky  # noqa: E402
from skyward.records import record  # noqa: E402
from skyward.stacks import aws  # noqa: E402
from skyward.stacks.plan import PoolPlan  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "record"))
from pkgindex import Index  # noqa: E402

pytestmark = pytest.mark.timeout(600)
QUIET = sky.Options(console=False, logging=False)


class PlacedWorkspace(FakeWorkspace):
    """The fake workspace, exporting what the real program's first update resolves."""

    def __init__(self, ami: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.ami = ami

    def outputs(self, name: str) -> dict[str, Any]:
        out = super().outputs(name)
        if out:
            out["placement"] = {"ami": self.ami, "subnet": "subnet-0a", "zone": "us-east-1a"}
        return out


@pytest.fixture(scope="module")
def hosts() -> Iterator[SSHHosts]:
    made = SSHHosts(1)
    try:
        made.start()
    except SSHHostsUnavailable as e:
        pytest.skip(f"SSH test hosts unavailable: {e}")
    try:
        yield made
    finally:
        made.close()


def aws_on(ws: FakeWorkspace, hosts: SSHHosts) -> Any:
    return sky.AWS(workspace=ws, user=hosts.user, detect_address=False, allow_ssh_from=["10.0.0.0/8"],
                   install="wheelhouse")  # the test hosts have no index


@sky.function
def probe() -> str:
    import skyprobe  # type: ignore[import-not-found]

    return str(skyprobe.VERSION)


def test_the_lock_is_in_the_stack_config_and_reproduce_pins_the_image_id(
        hosts: SSHHosts, home: Path, tmp_path: Path) -> None:
    index = Index(tmp_path / "index")
    index.publish("1.0")
    image = sky.Image(pip=["skyprobe"], pip_indexes=[sky.PipIndex(url=index.url, packages=("skyprobe",))])
    ws = PlacedWorkspace("ami-0recorded1", node_outputs=boot(hosts))
    with sky.Compute(provider=aws_on(ws, hosts), image=image, options=QUIET) as pool:
        assert probe() >> pool == "1.0"
        first = pool.id
    lock = record.read(first)["lock"]
    cloud = lock["cloud"]
    assert cloud["image"] == "ami-0recorded1" and cloud["region"] == "us-east-1"
    assert cloud["instance_type"] == record.read(first)["offer"]["instance_type"]
    in_stack = json.loads(ws.configs[cloud["stack"]]["skyward:lock"].value)
    assert in_stack["cloud"]["image"] == "ami-0recorded1"
    assert {p["name"]: p["version"] for p in in_stack["packages"]}["skyprobe"] == "1.0"
    assert in_stack["packages"] == lock["packages"]

    # A newer AMI (and package) came out; the reproduction still gets the recorded ones.
    index.publish("2.0")
    ws2 = PlacedWorkspace("ami-0newer2", node_outputs=boot(hosts))
    with sky.Compute(reproduce=first, provider=aws_on(ws2, hosts), options=QUIET) as pool:
        assert probe() >> pool == "1.0"
        again = pool.id
    stack = record.read(again)["lock"]["cloud"]["stack"]
    planned = ws2.plans[stack][0]
    assert planned["image"] == "ami-0recorded1" and planned["instance_type"] == cloud["instance_type"]
    assert record.read(again)["lock"]["cloud"]["image"] == "ami-0recorded1"

    # The program given that plan declares the instance with the recorded image, looking none up.
    mocks = fresh_mocks()
    seen: list[Any] = []

    @pulumi.runtime.test
    def declare() -> Any:
        declared = aws.program(PoolPlan.from_dict(planned))
        return declared.instances[0].ami.apply(seen.append)

    declare()
    assert seen == ["ami-0recorded1"]
    assert not [c for c in mocks.calls if c.token == "aws:ec2/getAmi:getAmi"]
