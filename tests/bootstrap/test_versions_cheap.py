"""The start's cheap look-ups agree with the slow ones they replace: distribution versions from
the .dist-info folder names (not importlib.metadata), and pinned requirements told apart without
packaging where they are plain ``name==version``."""

from __future__ import annotations

import importlib.metadata

import pytest
from packaging.requirements import Requirement

from skyward.bootstrap.shipment import _pinned
from skyward.bootstrap.wheelhouse import AGENT_PACKAGES, installed_version


@pytest.mark.parametrize("name", [*AGENT_PACKAGES, "uv", "skyward", "typing_extensions", "Typing-Extensions"])
def test_a_version_read_from_the_folder_name_is_the_one_importlib_metadata_reads(name: str) -> None:
    assert installed_version(name) == importlib.metadata.version(name)


def test_a_distribution_that_is_not_installed_is_said_so() -> None:
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        installed_version("no-such-distribution-here")


@pytest.mark.parametrize("requirement", [
    "cloudpickle==3.1.3", "torch==2.13.0+cpu", "a.b-c_d==1.0.post1", "Foo==1!2.0", "numpy>=1", "x==1.*",
    "x[extra]==1", 'x==1; python_version>"3"', "x===1.0", "x == 1.0", "x==1,<2", "x @ https://e.x/x.whl",
])
def test_pinned_says_what_packaging_says(requirement: str) -> None:
    req = Requirement(requirement)
    specs = list(req.specifier)
    expected = (req.url is None and len(specs) == 1 and specs[0].operator in ("==", "===")
                and "*" not in specs[0].version)
    assert _pinned(requirement) == expected
