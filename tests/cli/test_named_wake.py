"""An asleep named pool answers the terminal: `skyward ssh`, `cp`, `exec` and
`install` wake it (saying so on stderr, with the wake's time; the trail records the wake and what
it cost, as for a program), do their work and let it sleep again; with --no-wake they refuse
with an error that says the pool is asleep and how to wake it. No error reads "nodes 0 to -1"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import CLI
from .wheelindex import WheelIndex

pytestmark = pytest.mark.timeout(300)


def _asleep(cli: CLI, name: str) -> None:
    record = cli.record(name)
    assert record["cluster"]["nodes"] == [] and record["asleep_since"], record
    assert cli.wait_no_processes(15) == []  # no agent runs


def test_ssh_cp_and_exec_wake_an_asleep_pool_which_sleeps_again(cli: CLI, tmp_path: Path) -> None:
    up = cli("up", "demo", "--provider", "local", "--nodes", "0:2", "--ttl", "120")
    assert up.code == 0, up
    _asleep(cli, "demo")

    refused = cli("ssh", "demo", "--no-wake", "--", "echo", "hello")
    assert refused.code != 0 and "is asleep (0 of 2 nodes)" in refused.err, refused
    assert "without --no-wake" in refused.err and "0 to -1" not in refused.err, refused
    for args in (("exec", "demo", "--no-wake", "--", "true"), ("cp", "--no-wake", "demo:x", str(tmp_path))):
        no = cli(*args)
        assert no.code != 0 and "is asleep" in no.err and "--no-wake" in no.err, no
    assert cli.record("demo")["cluster"]["nodes"] == []  # nothing woke it

    far = cli("ssh", "demo", "--node", "3", "--", "true")  # said before anything wakes
    assert far.code != 0 and "0 to -1" not in far.err and "no node right now" in far.err, far
    assert "asleep" in far.err and "--node 0" in far.err, far

    ran = cli("ssh", "demo", "--", "echo", "hello from $PWD")
    assert ran.code == 0 and "hello from" in ran.out, ran
    assert re.search(r"pool 'demo' is asleep: waking it", ran.err), ran
    assert re.search(r"pool 'demo' woke in \d+\.\d s", ran.err), ran
    _asleep(cli, "demo")  # and asleep again once the command is done

    ran = cli("exec", "demo", "--", "echo", "exec here")
    assert ran.code == 0 and "exec here" in ran.out and "woke in" in ran.err, ran
    _asleep(cli, "demo")

    src = tmp_path / "data.txt"
    src.write_text("payload\n")
    up_cp = cli("cp", str(src), "demo:data.txt")
    assert up_cp.code == 0 and "woke in" in up_cp.err, up_cp
    _asleep(cli, "demo")

    trail = cli("history", "demo", "--json").json()
    events = [e["event"] for e in trail]
    assert events.count("woke") == 3 and events.count("asleep") == 3, events
    woke = [e for e in trail if e["event"] == "woke"]
    assert all(e["seconds"] > 0 and e["nodes"] == 1 and e["hourly_cost"] == 0.0 for e in woke), woke
    assert [e["by"] for e in trail if e["event"] == "attached"] == ["skyward ssh", "skyward exec", "skyward cp"]
    assert all(e["cost"] == 0.0 for e in trail if e["event"] == "asleep")
    status = cli("status", "demo", "--json")
    assert status.json()["state"] == "asleep" and len(status.json()["wakes"]) == 3


def test_an_out_of_range_node_names_the_pools_nodes(cli: CLI) -> None:
    up = cli("up", "two", "--provider", "local", "--nodes", "2", "--ttl", "120")
    assert up.code == 0, up
    far = cli("ssh", "two", "--node", "5", "--", "true")
    assert far.code != 0 and "--node 5: pool 'two' has nodes 0 to 1" in far.err, far
    assert cli("down", "two").code == 0


def test_install_wakes_an_asleep_pool(cli: CLI, tmp_path: Path) -> None:
    ix = WheelIndex(tmp_path / "index")
    ix.publish("skywake", "1.0")
    cli.toml(f'[pools.lv]\nprovider = "local"\nnodes = [0, 2]\nttl = 120\n\n[pools.lv.image]\n'
             f'pip_indexes = [{{ url = "{ix.url}", packages = ["skywake"] }}]\n')
    assert cli("up", "lv").code == 0
    refused = cli("install", "lv", "skywake", "--no-wake")
    assert refused.code != 0 and "is asleep" in refused.err and "--no-wake" in refused.err, refused
    done = cli("install", "lv", "skywake", timeout=180)
    assert done.code == 0 and "woke in" in done.err and "skywake==1.0" in done.err, done
    _asleep(cli, "lv")
    assert "installed" in [e["event"] for e in cli("history", "lv", "--json").json()]


def test_the_dashboards_exec_wakes_an_asleep_pool(cli: CLI) -> None:
    from .dashboard_helpers import dashboard

    cli.toml('[pools.nap]\nprovider = "local"\nnodes = [0, 2]\nttl = 300\n')
    with dashboard(cli) as d:
        made = d.api("POST", "/api/pools", json={"name": "nap"})
        assert made.status_code == 201 and made.json()["state"] == "asleep", made.text
        ran = d.api("POST", "/api/pools/nap/exec", json={"command": "echo woken"})
        assert ran.status_code == 200, ran.text
        (only,) = ran.json()
        assert only["exit_code"] == 0 and "woken" in only["stdout"], only
        detail = d.api("GET", "/api/pools/nap").json()
        assert detail["state"] == "asleep" and len(detail["wakes"]) == 1, detail  # asleep again
        assert d.api("DELETE", "/api/pools/nap").status_code == 200
    trail = [e["event"] for e in cli("history", "nap", "--json").json()]
    assert "woke" in trail and "asleep" in trail and "exec" in trail, trail
