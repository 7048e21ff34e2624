"""The client's own address in a cloud pool's SSH rule: with
``detect_address`` (the default) the rule opens port 22 to this machine's public address as
one /32 (or /128), beside what ``allow_ssh_from`` adds, and to nothing wider. The echo service
is never reached here: ``public_address`` is patched, and the rule the program declares is read
back from Pulumi's mocks."""

from __future__ import annotations

from typing import Any

import pytest

pulumi = pytest.importorskip("pulumi")

from stackfakes import FakeWorkspace, fresh_mocks  # noqa: E402

import skyward as sky  # noqa: E402
from skyward.catalogue import Offer  # noqa: E402
from skyward.errors import ProviderError  # noqa: E402
from skyward.stacks import aws, cloudpool, gcp, network  # noqa: E402

AWS_OFFER = Offer("aws", "m7i.large", "us-east-1", 2, 8, "x86_64", on_demand=0.1)
GCP_OFFER = Offer("gcp", "e2-standard-4", "us-central1", 4, 16, "x86_64", on_demand=0.1)
ADDED = "198.51.100.0/24"


pytestmark = pytest.mark.usefixtures("home")  # a SKYWARD_HOME of its own (conftest)


def _plan(kind: str, detected: str | None, monkeypatch: pytest.MonkeyPatch, extra: list[str] | None = None) -> Any:
    asked: list[float] = []

    def echo(timeout: float = 5.0) -> str:
        asked.append(timeout)
        if detected is None:
            raise ProviderError("no echo service in this test")
        return detected

    monkeypatch.setattr(network, "public_address", echo)
    offer, provider = (AWS_OFFER, sky.AWS(region="us-east-1")) if kind == "aws" else (
        GCP_OFFER, sky.GCP(project="proj", zone="us-central1-a"))
    pool = cloudpool.launch(
        kind, sky.Spec(provider=provider), "ab12cd34", offer, lambda plan: None, provider=provider,
        zone="us-central1-a" if kind == "gcp" else None, image=None, user="ubuntu",
        settings={"project": "proj"} if kind == "gcp" else {},
        allow_ssh_from=[ADDED] if extra is None else extra, detect_address=True, max_duration=None,
        plugins={}, connect=FakeWorkspace(), pool_name=None,
    )
    assert len(asked) == 1  # detected once, where the pool is launched
    return pool.plan


def _aws_rule(plan: Any) -> dict[str, list[str]]:
    mocks = fresh_mocks()
    seen: dict[str, list[str]] = {}

    @pulumi.runtime.test
    def go() -> Any:
        declared = aws.program(plan)

        def keep(ingress: list[dict[str, Any]]) -> None:
            (ssh,) = [r for r in ingress if r.get("from_port", r.get("fromPort")) == 22]
            seen["v4"] = list(ssh.get("cidr_blocks", ssh.get("cidrBlocks")) or [])
            seen["v6"] = list(ssh.get("ipv6_cidr_blocks", ssh.get("ipv6CidrBlocks")) or [])

        return declared.security_group.ingress.apply(keep)

    go()
    assert len(mocks.of_type("aws:ec2/securityGroup:SecurityGroup")) == 1
    return seen


def _gcp_rule(plan: Any) -> dict[str, list[str]]:
    fresh_mocks()
    seen: dict[str, list[str]] = {}

    @pulumi.runtime.test
    def go() -> Any:
        declared = gcp.program(plan)
        ssh, ssh6 = declared.firewalls.get("ssh"), declared.firewalls.get("ssh-v6")

        def keep(values: list[Any]) -> None:
            seen["v4"], seen["v6"] = list(values[0] or []), list(values[1] or [])

        return pulumi.Output.all(ssh.source_ranges if ssh else [], ssh6.source_ranges if ssh6 else []).apply(keep)

    go()
    return seen


@pytest.mark.parametrize("kind", ["aws", "gcp"])
def test_the_ssh_rule_opens_to_the_detected_address_alone(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(kind, "203.0.113.77", monkeypatch)
    assert plan.ssh_cidrs == ("203.0.113.77/32", ADDED)
    rule = (_aws_rule if kind == "aws" else _gcp_rule)(plan)
    assert rule == {"v4": ["203.0.113.77/32", ADDED], "v6": []}


@pytest.mark.parametrize("kind", ["aws", "gcp"])
def test_a_detected_ipv6_address_is_one_128(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(kind, "2001:db8:0:0::7", monkeypatch, extra=[])
    assert plan.ssh_cidrs == ("2001:db8::7/128",)
    rule = (_aws_rule if kind == "aws" else _gcp_rule)(plan)
    assert rule == {"v4": [], "v6": ["2001:db8::7/128"]}


def test_the_detected_address_and_an_added_one_are_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan("aws", "203.0.113.77", monkeypatch, extra=["203.0.113.77", ADDED])
    assert plan.ssh_cidrs == ("203.0.113.77/32", ADDED)


def test_no_detected_address_is_no_pool_not_a_wider_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProviderError, match="no echo service"):
        _plan("aws", None, monkeypatch)


def test_the_detected_address_goes_through_the_rule_check(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[list[str]] = []
    real = network.check_cidrs

    def spy(cidrs: Any, where: str) -> tuple[str, ...]:
        checked.append(list(cidrs))
        return real(cidrs, where)

    monkeypatch.setattr(network, "check_cidrs", spy)
    _plan("aws", "203.0.113.77", monkeypatch)
    assert ["203.0.113.77/32"] in checked
