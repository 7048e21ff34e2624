"""Named pools that sleep at zero nodes, on real Local pools: `skyward up NAME --nodes
0:2` starts one asleep, a program's first task wakes it and the registry says so, idle it sleeps
again (the last program to leave puts it to sleep at once), `ls`/`status`/`history` show it
asleep with 0/N nodes and each wake's time and cost, `down --expired` keeps it until its ttl
runs out, and a node found dead is dropped, not replaced."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from skyward.errors import ConfigError
from skyward.named import config as named_config
from skyward.named import pools as named

from .conftest import CLI

pytestmark = pytest.mark.timeout(120)

PRELUDE = """
    import json, os, time
    import skyward as sky

    def registry():
        return json.load(open(f"{os.environ['SKYWARD_HOME']}/registry/NAME.json"))

    def wait(predicate, timeout=30):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    @sky.function
    def where():
        return sky.instance_info().node

    options = sky.Options(console="silent", autoscale_idle_timeout=1.0, reconcile_tick_interval=0.2)
    seen = {}
"""

CLIENT = PRELUDE.replace("NAME", "demo") + """
    with sky.Compute(name="demo", options=options) as pool:
        seen["attached_nodes"] = pool.current_nodes()
        seen["first"] = where() >> pool                      # wakes it
        wait(lambda: len(registry()["cluster"]["nodes"]) == 1)
        seen["awake_pids"] = [n["pid"] for n in registry()["cluster"]["nodes"]]
        wait(lambda: pool.current_nodes() == 0)              # idle: asleep again
        wait(lambda: registry()["cluster"]["nodes"] == [] and registry().get("asleep_since"))
        seen["second"] = where() >> pool                     # wakes it again
        wait(lambda: len(registry()["cluster"]["nodes"]) == 1)
    print(json.dumps(seen))
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_nodes_flag_and_toml_take_zero_to_max_and_refuse_the_rest() -> None:
    assert named_config.parse_nodes("3") == 3
    assert named_config.parse_nodes("0:4") == [0, 4]
    assert named_config.parse_nodes("2:8") == [2, 8]
    for bad in ("0", "4:2", "0:0", "two", "1:2:3", "-1:2", ""):
        with pytest.raises(ConfigError, match=r"--nodes .* is not valid: give N.*DESIRED:MAX.*--nodes 2:8"):
            named_config.parse_nodes(bad)
    assert named_config.check_table({"nodes": [0, 4]}, "t").nodes == [0, 4]
    assert named_config.check_table({"nodes": {"desired": 0, "max": 4}}, "t").nodes == {"desired": 0, "max": 4}
    for bad_value in ([0, 0], 0, {"desired": 0}, {"desired": 3, "max": 2}, [3, 2]):
        with pytest.raises(ConfigError, match="nodes"):
            named_config.check_table({"nodes": bad_value}, "skyward.toml", "pools.demo")


def test_status_of_an_asleep_pool_counts_its_ttl_on_our_clock() -> None:
    now = time.time()
    record: dict[str, Any] = {
        "name": "demo", "state": "running", "provider": "local", "config": {"provider": "local", "nodes": [0, 4]},
        "cluster": {"provider": "local", "nodes": []}, "ttl": 60, "last_seen": now - 30, "created": now - 100,
        "clients": [],
    }
    st = named.status_of(record, now)
    assert (st.state, st.asleep, st.gone) == ("asleep", True, False) and st.expires == pytest.approx(now + 30)
    assert named.status_of(record, now + 31).state == "expired"  # its ttl ran out with no client
    attached = {**record, "clients": [{"id": "x", "host": "elsewhere", "pid": 1}]}
    assert named.status_of(attached, now + 1000).state == "asleep"  # never expires while attached
    assert named.status_of({**record, "ttl": 0}, now + 10**6).state == "asleep"
    # A pool that may not sleep, with no node left, is gone as before.
    fixed = {**record, "config": {"provider": "local", "nodes": 2}}
    assert named.status_of(fixed, now).state == "expired"


def test_a_pool_started_asleep_wakes_sleeps_and_says_so(cli: CLI) -> None:
    bad = cli("up", "demo", "--provider", "local", "--nodes", "4:2")
    assert bad.code == 2 and "--nodes '4:2' is not valid" in bad.err and "--nodes 2:8" in bad.err, bad

    up = cli("up", "demo", "--provider", "local", "--nodes", "0:2", "--ttl", "120")
    assert up.code == 0, up
    assert "is up and asleep: 0/2 local node(s)" in up.out, up
    record = cli.record("demo")
    root = Path(record["cluster"]["root"])
    assert record["cluster"]["nodes"] == [] and record["asleep_since"] and root.is_dir()
    assert cli.processes() == []  # no node runs

    (row,) = cli("ls", "--json").json()
    assert (row["state"], row["nodes"], row["max_nodes"], row["hourly_cost"]) == ("asleep", 0, 2, 0.0)
    listed = cli("ls")
    assert "0/2" in listed.out and "asleep" in listed.out and "expired" not in listed.out, listed
    status = cli("status", "demo")
    assert status.code == 0 and "asleep" in status.out and "0/2 node(s)" in status.out, status
    assert "it has not woken yet" in status.out
    looked = cli("exec", "demo", "--no-wake", "--", "hostname")  # (without --no-wake it wakes: test_named_wake)
    assert looked.code == 1 and "is asleep (0 of 2 nodes)" in looked.err and "without --no-wake" in looked.err, looked

    kept = cli("down", "--expired")  # its ttl has not run out: kept
    assert kept.code == 0 and "no expired pools" in kept.out, kept
    assert cli.record("demo")["cluster"]["nodes"] == []

    client = cli.python(CLIENT)
    assert client.code == 0, client
    seen = client.json()
    assert (seen["attached_nodes"], seen["first"], seen["second"]) == (0, 0, 0)

    # The last program out put it to sleep: no agent runs, the registry says asleep, the
    # folder (the pool's site packages, its node folders) is still there for the next wake.
    record = cli.record("demo")
    assert record["cluster"]["nodes"] == [] and record["clients"] == [] and record["asleep_since"]
    assert not any(_alive(pid) for pid in seen["awake_pids"])
    assert cli.wait_no_processes(10) == []
    assert root.is_dir()

    trail = [e for e in cli("history", "demo", "--json").json()]
    events = [e["event"] for e in trail]
    assert events.count("woke") == 2 and events.count("asleep") == 2, events
    assert events.index("attached") < events.index("woke") < events.index("asleep") < events.index("detached")
    woke = [e for e in trail if e["event"] == "woke"]
    assert all(e["seconds"] > 0 and e["nodes"] == 1 and e["hourly_cost"] == 0.0 for e in woke), woke
    slept = [e for e in trail if e["event"] == "asleep"]
    assert all(e["cost"] == 0.0 and e["awake_seconds"] > 0 for e in slept), slept
    assert "node replaced" not in events

    status = cli("status", "demo", "--json")
    assert status.code == 0, status
    got = status.json()
    assert (got["state"], got["nodes"], got["max_nodes"]) == ("asleep", [], 2)
    assert [(w["nodes"], w["cost"]) for w in got["wakes"]] == [(1, 0.0), (1, 0.0)]
    text = cli("status", "demo").out
    assert "wakes:" in text and "AWAKE FOR" in text, text
    (row,) = cli("ls", "--json").json()
    assert row["state"] == "asleep"


def test_a_node_found_dead_is_dropped_not_replaced_and_an_asleep_pool_expires_with_its_ttl(cli: CLI) -> None:
    cli.toml("""
        [pools.demo]
        provider = "local"
        nodes = { desired = 0, max = 2 }
        ttl = 120

        [pools.brief]
        provider = "local"
        nodes = [0, 1]
        ttl = 1
    """)
    assert cli("up", "demo").code == 0
    up = cli("up", "brief")
    assert up.code == 0, up
    brief_root = Path(cli.record("brief")["cluster"]["root"])

    # A program that wakes the pool and dies without leaving: its node keeps running...
    crashed = cli.python("""
        import json, os, time
        import skyward as sky
        pool = sky.Compute(name="demo", options=sky.Options(console="silent")).open()
        sky.function(os.getpid)() >> pool
        path = f"{os.environ['SKYWARD_HOME']}/registry/demo.json"
        while not json.load(open(path))["cluster"]["nodes"]:  # the recorder wrote the wake
            time.sleep(0.05)
        os._exit(0)
    """)
    assert crashed.code == 0, crashed
    (node,) = cli.record("demo")["cluster"]["nodes"]
    assert _alive(node["pid"])
    os.kill(node["pid"], signal.SIGKILL)  # ...until it dies too
    cli.seen.add(node["pid"])
    deadline = time.monotonic() + 10
    while _alive(node["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)

    # The next program finds it dead: dropped (the pool is asleep), and its first task wakes a new one.
    again = cli.python("""
        import json, os
        import skyward as sky
        with sky.Compute(name="demo", options=sky.Options(console="silent")) as pool:
            before = pool.current_nodes()
            print(json.dumps({"before": before, "node": sky.function(lambda: sky.instance_info().node)() >> pool}))
    """)
    assert again.code == 0, again
    assert again.json() == {"before": 0, "node": 0}
    events = [e["event"] for e in cli("history", "demo", "--json").json()]
    assert "node dropped" in events and "node replaced" not in events, events
    assert cli.record("demo")["cluster"]["nodes"] == []  # and asleep again once it left

    # An asleep pool is removed once its ttl ran out with no client, folder and all.
    time.sleep(1.5)
    gone = cli("down", "--expired")
    assert gone.code == 0 and "removed brief (expired)" in gone.out and "demo" not in gone.out, gone
    assert not brief_root.exists()
    assert [r["name"] for r in cli("ls", "--json").json()] == ["demo"]


GROUPS_TOML = """
    [pools.pipe]
    ttl = 120

    [pools.pipe.groups.prep]
    provider = "local"
    nodes = [0, 1]

    [pools.pipe.groups.train]
    provider = "local"
    nodes = [0, 2]
"""

GROUPS_CLIENT = PRELUDE.replace("NAME", "pipe") + """
    def nodes(group):
        return len(registry()["groups"][group]["cluster"]["nodes"])

    with sky.Compute(name="pipe", options=options) as pool:
        seen["attached"] = pool.current_nodes()
        seen["train"] = where() >> pool["train"]             # wakes the train group alone
        wait(lambda: nodes("train") == 1)
        seen["prep_while_train"] = nodes("prep")
        seen["asleep_while_train"] = bool(registry().get("asleep_since"))
        seen["prep"] = where() >> pool["prep"]               # the other group wakes in an awake pool
        wait(lambda: nodes("prep") == 1)
    print(json.dumps(seen))
"""


def test_a_pool_of_groups_sleeps_and_wakes_as_a_whole(cli: CLI) -> None:
    cli.toml(GROUPS_TOML)
    up = cli("up", "pipe")
    assert up.code == 0 and "is up and asleep: 0/3 local node(s)" in up.out, up
    record = cli.record("pipe")
    assert record["asleep_since"] and all(not g["cluster"]["nodes"] for g in record["groups"].values())
    (row,) = cli("ls", "--json").json()
    assert (row["state"], row["nodes"], row["max_nodes"]) == ("asleep", 0, 3), row

    client = cli.python(GROUPS_CLIENT)
    assert client.code == 0, client
    seen = client.json()
    assert seen["attached"] == 0 and seen["prep_while_train"] == 0 and not seen["asleep_while_train"], seen

    # The last program out put every group to sleep: no node runs, the registry says asleep.
    record = cli.record("pipe")
    assert all(not g["cluster"]["nodes"] for g in record["groups"].values()) and record["asleep_since"], record
    assert cli.wait_no_processes(10) == []
    events = [e["event"] for e in cli("history", "pipe", "--json").json()]
    # One wake (the first group's) and one sleep (the last group's): the groups in between are resizes.
    assert events.count("woke") == 1 and events.count("asleep") == 1, events
    assert events.index("woke") < events.index("asleep") < events.index("detached"), events
    (row,) = cli("ls", "--json").json()
    assert row["state"] == "asleep"

    # A terminal command wakes the head group for itself and puts the pool back to sleep.
    ran = cli("exec", "pipe", "--", "true")
    assert ran.code == 0, ran
    assert all(not g["cluster"]["nodes"] for g in cli.record("pipe")["groups"].values())
    assert cli("ls", "--json").json()[0]["state"] == "asleep"
    assert (down := cli("down", "pipe")).code == 0, down
