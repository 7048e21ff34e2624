"""`skyward events NAME` on real Local pools: the pool's event journal and audit trail, for a
post-mortem, also of a pool that never came up and of one taken down."""

from __future__ import annotations

import json

from .conftest import CLI


def _events(cli: CLI, name: str) -> list[dict]:  # type: ignore[type-arg]
    out = cli("events", name, "--json")
    assert out.code == 0, out
    return [json.loads(line) for line in out.out.splitlines()]  # one object per line


def test_events_of_a_pool_from_up_to_down(cli: CLI) -> None:
    assert cli("up", "ev", "--provider", "local", "--nodes", "2").code == 0
    items = _events(cli, "ev")
    kinds = [i["event"] for i in items]
    assert kinds[0] == "ClusterRequested" and kinds.count("InstanceBootstrapped") == 2, kinds
    assert "ClusterReady" in kinds and kinds[-1] == "ClusterDetached", kinds  # `up` let go of it
    assert {i["source"] for i in items} == {"event", "audit"}
    assert [i["event"] for i in items if i["source"] == "audit"] == ["provisioned"]
    assert all(i["role"] == "provision" for i in items if i["source"] == "event")
    assert [i["time"] for i in items] == sorted(i["time"] for i in items)

    # A program that loses a node: the loss and the replacement are in the history, seen by it.
    client = cli.python("""
        import os, signal, time
        import skyward as sky

        def kill_my_agent():
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(30)

        with sky.Compute(name="ev", options=sky.Options(console="silent")) as pool:
            try:
                pool.run(sky.function(kill_my_agent)(), target=1)
            except sky.NodeLostError:
                print("lost")
            deadline = time.monotonic() + 30
            while pool.current_nodes() < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
    """)
    assert client.code == 0 and "lost" in client.out, client
    attached = [i for i in _events(cli, "ev") if i.get("role") == "attach"]
    kinds = [i["event"] for i in attached]
    assert "InstanceLost" in kinds and "InstanceReplaced" in kinds and kinds[-1] == "ClusterDetached", kinds
    lost = next(i for i in attached if i["event"] == "InstanceLost")
    assert lost["node"] == 1 and lost["reason"]
    # The registry knows the new node, however soon after it the program left: `down` stops it.
    new = next(i for i in attached if i["event"] == "InstanceReplaced")["new_node"]
    assert new in [n["index"] for n in cli.record("ev")["cluster"]["nodes"]], cli.record("ev")
    trail = cli("history", "ev", "--json").json()
    assert [(e["node"], e["new_node"]) for e in trail if e["event"] == "node replaced"] == [(1, new)], trail

    text = cli("events", "ev")
    assert text.code == 0, text
    assert "pool ev: requesting 2 local node(s)" in text.out and "node 1: lost" in text.out, text
    assert "audit      provisioned by" in text.out and "audit      attached by" in text.out, text
    assert "node lost by" not in text.out  # the trail's copy of an event is not said twice

    assert cli("down", "ev").code == 0
    after = cli("events", "ev", "--tail", "1", "--json")
    (last,) = [json.loads(line) for line in after.out.splitlines()]
    assert (last["source"], last["event"]) == ("audit", "destroyed")  # it outlives the pool


def test_events_of_a_pool_that_never_came_up_say_why(cli: CLI) -> None:
    cli.toml('[pools.bad]\nprovider = "local"\nnodes = 1\n\n'
             '[pools.bad.image]\npip = ["skyward-no-such-package-xyz"]\n')
    up = cli("up", "bad", "--console", "silent")
    assert up.code == 1, up
    items = _events(cli, "bad")
    # the node was asked of the provider; its environment failed
    assert [i["event"] for i in items] == ["ClusterRequested", "InstanceRequested", "Error"], items
    assert "skyward-no-such-package-xyz" in items[2]["message"]
    assert cli("ls", "--json").json() == []  # nothing runs, the history stays


def test_events_of_unknown_names_and_bad_usage(cli: CLI) -> None:
    unknown = cli("events", "never-was")
    assert unknown.code == 1 and "no events for a pool named 'never-was'" in unknown.err, unknown
    assert cli("events", "Bad Name").code == 2
    assert cli("up", "t", "--nodes", "1").code == 0
    assert cli("events", "t", "--tail", "-1").code == 2
    assert cli("events", "t", "--tail", "0").out == ""
