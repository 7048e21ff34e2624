"""`skyward preview` without a pool name: the pool the flags describe."""

from __future__ import annotations

import pytest

from .conftest import CLI


def test_preview_of_flags_alone_needs_no_name_and_no_skyward_toml(cli: CLI) -> None:
    result = cli("preview", "--provider", "local", "--nodes", "3", "--json")
    assert result.code == 0, result
    got = result.json()
    assert (got["name"], got["provider"], got["nodes"]) == (None, "local", 3)
    assert got["sources"] == ["command line"] and len(got["resources"]) == 3
    text = cli("preview", "--provider", "local", "--nodes", "2")
    assert text.code == 0, text
    assert text.out.startswith("a pool of --provider local --nodes 2 would be 2 local node(s)"), text
    assert cli.processes() == []  # nothing was started


def test_preview_of_flags_alone_ignores_pools_of_skyward_toml(cli: CLI) -> None:
    cli.toml("[pools.preview]\nnodes = 5\n")  # a pool that happens to be called like the default
    got = cli("preview", "--nodes", "1", "--json").json()
    assert got["nodes"] == 1 and got["name"] is None


def test_preview_of_a_cloud_from_flags_has_an_unnamed_stack(cli: CLI) -> None:
    pytest.importorskip("pulumi_aws")
    result = cli("preview", "--provider", "aws", "--accelerator", "T4", "--json")
    assert result.code == 0, result
    got = result.json()
    assert got["name"] is None and got["offer"]["instance_type"].startswith("g4dn.")
    assert not got["stack"].startswith("preview-"), got["stack"]  # no pool name in it
    assert any(r["type"] == "aws:ec2/instance:Instance" for r in got["resources"])


def test_preview_without_name_or_flags_says_what_to_give(cli: CLI) -> None:
    result = cli("preview")
    assert result.code != 0
    assert "needs a pool name or flags" in result.err and "--provider aws" in result.err, result


def test_preview_of_flags_refuses_a_config_file_it_would_not_read(cli: CLI) -> None:
    path = cli.toml("[pools.x]\nnodes = 1\n")
    result = cli("preview", "--nodes", "1", "--config", str(path))
    assert result.code != 0 and "read for named pools only" in result.err, result


@pytest.mark.parametrize(("text", "first"), [("v5litepod-4", "tpu-v5litepod-4"), ("trn1:16", "trn1.32xlarge"),
                                             ("Inferentia1", "inf1.xlarge"), ("T4G", "g5g.xlarge")])
def test_offers_takes_every_spelling_of_the_new_accelerators(cli: CLI, text: str, first: str) -> None:
    result = cli("offers", "--accelerator", text, "--json")
    assert result.code == 0, result
    assert result.json()[0]["instance_type"] == first


def test_a_consumer_card_is_a_known_name_that_no_cloud_rents(cli: CLI) -> None:
    result = cli("offers", "--accelerator", "GTX_1080_Ti", "--json")
    assert result.code == 0 and result.json() == [], result
