"""Named pools of several groups through the skyward command, on real Local processes: a
skyward.toml with [pools.pipe.groups.*], up, ls and status showing each group, a program that
attaches and routes to one group, exec and resize of one group, down leaving no process."""

from __future__ import annotations

import json

import pytest

from .conftest import CLI

TOML = """
    [pools.pipe]
    ttl = 120
    head = "train"

    [pools.pipe.groups.prep]
    nodes = 2

    [pools.pipe.groups.train]
    nodes = 1
"""

CLIENT = """
    import json, os
    import skyward as sky

    with sky.Compute(name="pipe", options=sky.Options(console="silent")) as pool:
        where = lambda: (sky.instance_info().group, os.getppid())
        train = sky.function(where)() @ pool["train"]
        prep = sky.function(where)() @ pool["prep"]
        print(json.dumps({"groups": sorted(pool.groups), "head": pool.head_group.name,
                          "train": train, "prep": prep}))
"""


def test_a_named_pool_of_two_local_groups_through_the_cli(cli: CLI) -> None:
    cli.toml(TOML)
    up = cli("up", "pipe")
    assert up.code == 0, up
    record = cli.record("pipe")
    assert record["head"] == "train" and list(record["groups"]) == ["prep", "train"]
    agents = {g: [n["pid"] for n in v["cluster"]["nodes"]] for g, v in record["groups"].items()}
    assert len(agents["prep"]) == 2 and len(agents["train"]) == 1

    kept = json.loads((cli.home / "records" / f"{record['id']}.json").read_text())
    assert kept["head"] == "train"
    assert {g: (v["provider"], v["nodes"]) for g, v in kept["groups"].items()} == {
        "prep": ("local", 2), "train": ("local", 1)}
    assert all(v["spec"] for v in kept["groups"].values())
    again = cli("reproduce", record["id"], "--name", "pipe2", "--json")
    assert again.code == 0, again
    copy = cli.record("pipe2")
    assert copy["head"] == "train" and {g: len(v["cluster"]["nodes"]) for g, v in copy["groups"].items()} == {
        "prep": 2, "train": 1}
    assert cli("down", "pipe2").code == 0

    (row,) = cli("ls", "--json").json()
    assert row["nodes"] == 3 and row["state"] == "running"
    assert [(g["name"], g["provider"], g["nodes"], g["head"]) for g in row["groups"]] == [
        ("prep", "local", 2, False), ("train", "local", 1, True)]
    table = cli("ls").out
    assert "  prep" in table and "  train (head)" in table

    status = cli("status", "pipe", "--json")
    assert status.code == 0, status
    assert [(n["group"], n["rank"], n["reachable"]) for n in status.json()["nodes"]] == [
        ("prep", 0, True), ("prep", 1, True), ("train", 0, True)]
    assert "group 'train' (head): local, 1 node(s)" in cli("status", "pipe").out

    client = cli.python(CLIENT)
    assert client.code == 0, client
    got = client.json()
    assert got["groups"] == ["prep", "train"] and got["head"] == "train"
    assert [g for g, _ in got["train"]] == ["train"] and [pid for _, pid in got["train"]] == agents["train"]
    assert sorted(pid for _, pid in got["prep"]) == sorted(agents["prep"])

    ran = cli("exec", "pipe", "--group", "train", "--json", "--", "echo", "hi")
    assert ran.code == 0, ran
    assert [(r["group"], r["node"], r["stdout"]) for r in ran.json()] == [("train", 0, "hi\n")]
    every = cli("exec", "pipe", "--json", "--", "true").json()
    assert [(r["group"], r["node"]) for r in every] == [("prep", 0), ("prep", 1), ("train", 0)]

    unknown = cli("exec", "pipe", "--group", "eval", "--", "true")
    assert unknown.code != 0 and "'prep', 'train'" in unknown.err
    ambiguous = cli("resize", "pipe", "0")
    assert ambiguous.code != 0 and "several groups ('prep', 'train')" in ambiguous.err

    # ssh and cp: --group picks the group, --node the rank within it; --node alone is pool-wide
    # (a Local node's folder is named after its group's cluster: "<pool id>-<group>")
    here = cli("ssh", "pipe", "--group", "train", "--", "pwd")
    assert here.code == 0 and "-train-" in here.out, here
    where = [cli("ssh", "pipe", "--node", str(n), "--", "pwd").out for n in range(3)]
    assert ["-prep-" in where[0], "-prep-" in where[1], "-train-" in where[2]] == [True] * 3, where
    assert where[0] != where[1]
    (cli.cwd / "note.txt").write_text("for train")
    copied = cli("cp", "note.txt", "pipe:", "--group", "train")
    assert copied.code == 0, copied
    seen = cli("exec", "pipe", "--json", "--", "cat note.txt 2>/dev/null || echo none").json()
    assert [(r["group"], r["stdout"].strip()) for r in seen] == [
        ("prep", "none"), ("prep", "none"), ("train", "for train")]
    beyond = cli("ssh", "pipe", "--node", "3", "--", "true")
    assert beyond.code != 0 and "numbered 0 to 2 group after group" in beyond.err, beyond

    resized = cli("resize", "pipe", "--group", "prep", "0")
    assert resized.code == 0, resized
    assert cli.record("pipe")["groups"]["prep"]["cluster"]["nodes"] == []
    assert len(cli.record("pipe")["groups"]["train"]["cluster"]["nodes"]) == 1
    (row,) = cli("ls", "--json").json()
    assert row["state"] == "running" and [g["nodes"] for g in row["groups"]] == [0, 1]
    logs = cli("logs", "pipe", "--group", "train", "--json")
    assert logs.code == 0, logs
    assert [(r["group"], r["node"]) for r in logs.json()] == [("train", 0)]

    down = cli("down", "pipe")
    assert down.code == 0, down
    assert cli.wait_no_processes(10) == []
    assert cli("ls", "--json").json() == []


@pytest.mark.parametrize(("text", "words"), [
    ('[pools.pipe]\nhead = "eval"\n[pools.pipe.groups.prep]\nnodes = 1\n', ["head = 'eval'", "'prep'"]),
    ("[pools.pipe.groups.prep]\nnodse = 1\n", ["unknown key", "Did you mean 'nodes'?"]),
    ("[pools.pipe.groups.1prep]\nnodes = 1\n", ["group name '1prep' is not valid"]),
])
def test_group_tables_that_cannot_be_a_pool_are_refused(cli: CLI, text: str, words: list[str]) -> None:
    (cli.cwd / "skyward.toml").write_text(text)
    up = cli("up", "pipe")
    assert up.code != 0
    for word in words:
        assert word in up.err, up


def test_nodes_flag_is_refused_for_a_pool_of_groups(cli: CLI) -> None:
    cli.toml(TOML)
    up = cli("up", "pipe", "--nodes", "3")
    assert up.code != 0 and "--nodes does not apply to a pool of several groups" in up.err, up


def test_preview_shows_each_group(cli: CLI) -> None:
    cli.toml(TOML)
    shown = cli("preview", "pipe", "--json")
    assert shown.code == 0, shown
    out = shown.json()
    assert out["nodes"] == 3 and out["hourly_cost"] == 0
    assert [(g["name"], g["head"], g["provider"], g["nodes"], len(g["resources"])) for g in out["groups"]] == [
        ("prep", False, "local", 2, 2), ("train", True, "local", 1, 1)]
    text = cli("preview", "pipe").out
    assert "3 node(s) in 2 groups" in text and "group 'train' (head): 1 local node(s)" in text
    assert cli("ls", "--json").json() == []  # nothing was created
