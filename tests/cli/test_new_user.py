"""Named pools as a new user meets them (issue 19): `skyward down` of a pool in use, a pool with
one dead node, `preview` of a named or running pool, and the small things (a second copy of a
startup error, a bare `skyward`, `down` of a name that does not exist, the prices' date)."""

from __future__ import annotations

import pytest

from .conftest import CLI


# -- item 8: preview ------------------------------------------------------------------------------
def test_preview_of_a_named_cloud_pool_uses_the_names_up_would(cli: CLI) -> None:
    pytest.importorskip("pulumi_aws")
    cli.toml('[pools.train]\nprovider = "aws"\nnodes = 1\n')
    result = cli("preview", "train", "--json")
    assert result.code == 0, result
    got = result.json()
    assert got["stack"] == "train-<id>", got["stack"]  # what `up` names it: <pool name>-<id>
    (key,) = [r for r in got["resources"] if r["type"] == "aws:ec2/keyPair:KeyPair"]
    assert key["detail"].startswith("skyward-train-<id>:"), key
    text = cli("preview", "train")
    assert "stack train-<id>" in text.out, text


def test_the_python_preview_has_the_hourly_cost_the_cli_shows() -> None:
    pytest.importorskip("pulumi_aws")
    import skyward as sky

    spec = sky.Spec(provider=sky.AWS(), nodes=2)
    plan = spec.provider.preview(spec)
    per_node = plan["offer"]["hourly_cost_per_node"]
    assert plan["hourly_cost_per_node"] == per_node > 0
    assert plan["hourly_cost"] == round(per_node * 2, 4)


def test_preview_of_a_running_pool_describes_it_instead_of_failing(cli: CLI) -> None:
    assert cli("up", "live", "--provider", "local", "--nodes", "2").code == 0  # no skyward.toml
    result = cli("preview", "live", "--json")
    assert result.code == 0, result
    got = result.json()
    assert (got["name"], got["provider"], got["nodes"]) == ("live", "local", 2)
    assert any("running now" in n and "skyward down live" in n for n in got["notes"]), got
    text = cli("preview", "live")
    assert text.code == 0 and "running now" in text.out, text
    assert "not running and not defined" not in text.err


# -- item 10: the small things ---------------------------------------------------------------------
def test_a_startup_failure_is_printed_once(cli: CLI) -> None:
    cli.toml('[pools.broken]\nprovider = "local"\n[pools.broken.image]\nincludes = ["no_such_folder"]\n')
    result = cli("up", "broken")
    assert result.code != 0, result
    assert result.err.count("does not exist") == 1, result  # not once by the console, once by the CLI
    assert cli("ls", "--json").json() == []


def test_down_of_an_unknown_pool_says_only_that(cli: CLI) -> None:
    result = cli("down", "ghost")
    assert result.code == 1 and "no pool named 'ghost'" in result.err, result
    assert "stopping" not in result.err, result


def test_attaching_does_not_say_nodes_started(cli: CLI) -> None:
    assert cli("up", "att", "--nodes", "2").code == 0
    client = cli.python("""
        import skyward as sky
        with sky.Compute(name="att", options=sky.Options(console="log")) as pool:
            pass
    """)
    assert client.code == 0, client
    assert "started" not in client.err, client
    assert "node 0: attached" in client.err and "node 1: attached" in client.err, client


def test_skyward_with_no_arguments_prints_help_and_exits_2(cli: CLI) -> None:
    result = cli()
    assert result.code == 2, result
    assert "usage: skyward" in result.out + result.err and "up" in result.out + result.err


def test_offers_say_when_the_prices_are_from(cli: CLI) -> None:
    rows = cli("offers", "--limit", "3", "--json").json()
    dates = sorted({r["as_of"] for r in rows})
    table = cli("offers", "--limit", "3")
    assert table.code == 0, table
    assert all(d in table.out for d in dates) and "as of" in table.out, table
