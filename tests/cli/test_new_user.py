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
