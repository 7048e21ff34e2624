"""The Pulumi provider SDKs a cloud pool accepts are those whose schema has what
the stack programs declare (pulumi-gcp built on terraform-provider-google >= 6.25 for
``scheduling.termination_time``), and an older one ends the pool before anything is written."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

import skyward as sky
from skyward.errors import ConfigError
from skyward.providers import cloud

ROOT = Path(__file__).parents[2]


def _floors(requirements: list[str]) -> dict[str, str]:
    return {m.group(1): m.group(2) for r in requirements if (m := re.match(r"^(pulumi-(?:aws|gcp))>=([\d.]+)$", r))}


def test_pyproject_floors_are_the_ones_the_code_checks_and_the_tests_run_with() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert _floors(extras["aws"]) == {"pulumi-aws": cloud.SDK_FLOORS["pulumi-aws"]}
    assert _floors(extras["gcp"]) == {"pulumi-gcp": cloud.SDK_FLOORS["pulumi-gcp"]}
    for package, floor in cloud.SDK_FLOORS.items():  # what this suite runs with meets them
        installed = tuple(int(x) for x in importlib.metadata.version(package).split(".")[:2])
        assert installed >= tuple(int(x) for x in floor.split(".")), (package, installed, floor)


@pytest.mark.parametrize("provider,package", [(sky.GCP(project="p"), "pulumi-gcp"), (sky.AWS(), "pulumi-aws")])
def test_an_sdk_older_than_the_floor_ends_the_pool_before_anything(
    provider: object, package: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "7.0.0" if name == package else real(name))
    provider = dataclasses.replace(provider, workspace=object())  # type: ignore[type-var]
    with pytest.raises(ConfigError, match=rf"{package} 7\.0\.0 is installed.*>={re.escape(cloud.SDK_FLOORS[package])}"):
        provider.preflight(sky.Spec(provider=provider))  # type: ignore[attr-defined]
