"""Pools of several groups (skyward.core.group) on real Local nodes: routing by group, pool-wide
and group places in instance_info, collections shared across groups, a group that sleeps and
wakes while the other stays up, a lost node replaced within its group, and the errors."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import skyward as sky
from tests.helpers import free_port, wait_for

pytestmark = pytest.mark.timeout(180)
QUIET = sky.Options(console=False)


@sky.function
def where() -> tuple[str, int, int, int, int, int]:
    info = sky.instance_info()
    return info.group, info.group_rank, info.group_size, info.node, info.total_nodes, os.getpid()


@sky.function
def group_of(_: object) -> str:
    return sky.instance_info().group


@sky.function
def bump(name: str) -> str:
    sky.counter(name).increment()
    return sky.instance_info().group


def two_groups(**extra: sky.Spec) -> sky.Compute:
    return sky.Compute(groups={"prep": sky.Spec(nodes=2), "train": sky.Spec(nodes=1), **extra}, options=QUIET)


def test_work_goes_to_the_group_it_names_and_the_pool_spans_them() -> None:
    with two_groups() as pool:
        assert pool.current_nodes() == 3
        everywhere = where() @ pool
        assert [w[:5] for w in everywhere] == [("prep", 0, 2, 0, 3), ("prep", 1, 2, 1, 3), ("train", 0, 1, 2, 3)]
        assert [w[:5] for w in where() @ pool["train"]] == [("train", 0, 1, 2, 3)]
        assert set(pool["prep"].map(group_of, range(60))) == {"prep"}
        assert set(pool["train"].map(group_of, range(10))) == {"train"}
        assert (where() >> pool["train"])[0] == "train"
        assert (where() > pool["prep"]).result()[0] == "prep"
        assert {w[0] for w in sky.gather(*[where() for _ in range(4)]) >> pool["prep"]} == {"prep"}
        # the whole pool: every group takes a share
        assert sorted(set(pool.map(group_of, range(60)))) == ["prep", "train"]
        assert {(where() >> pool)[0] for _ in range(12)} == {"prep", "train"}
        assert {w[0] for w in sky.gather(*[where() for _ in range(6)]) >> pool} == {"prep", "train"}
        assert pool.run(where(), target=2)[0] == "train"  # a pool-wide rank
        assert pool["prep"].current_nodes() == 2 and pool["train"].concurrency == 1
        assert [(n.group, n.rank) for n in pool.snapshot().nodes] == [("prep", 0), ("prep", 1), ("train", 0)]


def test_a_one_spec_pool_is_one_group() -> None:
    with sky.Compute(nodes=2, options=QUIET) as pool:
        assert list(pool.groups) == ["default"]
        got = where() @ pool["default"]
        assert [w[:5] for w in got] == [("default", 0, 2, 0, 2), ("default", 1, 2, 1, 2)]


def test_collections_are_the_pools_for_every_group() -> None:
    with two_groups() as pool:
        assert sorted(bump("seen") @ pool) == ["prep", "prep", "train"]
        assert bump("seen") >> pool["train"] == "train"
        assert pool.counter("seen").value == 4


def test_a_group_sleeps_and_wakes_while_the_other_stays_up() -> None:
    with two_groups() as pool:
        train_pid = (where() >> pool["train"])[5]
        pool["prep"].resize(0)
        assert pool["prep"].current_nodes() == 0 and pool.current_nodes() == 1
        assert [w[:5] for w in where() @ pool] == [("train", 0, 1, 0, 1)]  # the pool-wide numbers follow
        assert (where() >> pool["prep"])[0] == "prep"  # wakes it
        assert pool["prep"].current_nodes() >= 1
        assert (where() >> pool["train"])[5] == train_pid  # untouched


def test_a_lost_node_is_replaced_within_its_group() -> None:
    with two_groups() as pool:
        train = pool.groups["train"]
        by_index = {n["index"]: n["pid"] for n in train.cluster.describe()["nodes"]}
        old = where() >> pool["train"]
        (gone,) = train.members.channels
        os.kill(by_index[gone.node], signal.SIGKILL)
        wait_for(lambda: [ch for ch in train.members.ready() if ch is not gone], 60, "the train node's replacement")
        new = where() >> pool["train"]
        assert new[:5] == old[:5] and new[5] != old[5]
        assert pool["prep"].current_nodes() == 2


@sky.function(timeout=120)
def all_reduce(busy: str) -> tuple[str, int, int, float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return sky.instance_info().group, dist.get_rank(), dist.get_world_size(), t.item()


@sky.function
def work_a_while(seconds: float) -> str:
    time.sleep(seconds)
    return sky.instance_info().group


def test_torch_world_is_the_group_it_runs_on() -> None:
    pytest.importorskip("torch")
    groups = {"prep": sky.Spec(nodes=1), "train": sky.Spec(nodes=2, plugins=[sky.plugins.torch()])}
    with sky.Compute(groups=groups, options=QUIET) as pool:
        busy = work_a_while(3) > pool["prep"]  # the other group works meanwhile
        got = all_reduce("x") @ pool["train"]
        assert sorted(got) == [("train", 0, 2, 3.0), ("train", 1, 2, 3.0)]
        assert busy.result(timeout=30) == "prep"


def test_head_names_the_group_that_holds_the_collections() -> None:
    with sky.Compute(groups={"prep": sky.Spec(nodes=1), "train": sky.Spec(nodes=1)}, head="train",
                     options=QUIET) as pool:
        assert pool.head_group.name == "train"
        assert sorted(bump("h") @ pool) == ["prep", "train"]
        assert pool.counter("h").value == 2
        assert (where() >> pool)[0] in ("prep", "train")


def test_bad_groups_say_what_to_do() -> None:
    with two_groups() as pool, pytest.raises(sky.ConfigError, match=r"no group called 'nope'.*'prep', 'train'"):
        pool["nope"]
    with sky.Compute(groups={"a": sky.Spec(nodes=1), "b": sky.Spec(nodes=1)}, options=QUIET) as pool, \
            pytest.raises(sky.ConfigError, match="say which group"):
        pool.resize(2)
    with pytest.raises(sky.ConfigError, match="got nodes too"):
        sky.Compute(groups={"a": sky.Spec()}, nodes=2)
    with pytest.raises(sky.ConfigError, match="group name '1x' is not valid"):
        sky.Compute(groups={"1x": sky.Spec()})
    with pytest.raises(sky.ConfigError, match=r"a group is a sky\.Spec"):
        sky.Compute(groups={"a": 3})  # type: ignore[dict-item]
    with pytest.raises(sky.ConfigError, match="head='c' names no group"):
        sky.Compute(groups={"a": sky.Spec()}, head="c")
    with pytest.raises(sky.ConfigError, match="this pool has none"):
        sky.Compute(nodes=1, head="a")
    with pytest.raises(sky.ConfigError, match="not valid: give a dict"):
        sky.Compute(groups={})


def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == me:
                    found.add(int(pid))
        except OSError:
            pass
    return found


def test_a_group_that_cannot_start_leaves_nothing_running(tmp_path: Path) -> None:
    before = _children()
    key = tmp_path / "key"
    key.write_text("not a key")
    bad = sky.Spec(provider=sky.SSH(hosts=[sky.SSHHost(address="127.0.0.1", port=free_port(), user="nobody",
                                                       key=str(key))]), nodes=1)
    with pytest.raises(Exception, match="group 'bad'"), \
            sky.Compute(groups={"ok": sky.Spec(nodes=1), "bad": bad}, options=QUIET):
        pass
    wait_for(lambda: _children() <= before, 30, "the ok group's nodes to be gone")


def _pid(_: object) -> int:
    return os.getpid()


def test_joblib_runs_on_the_group_it_is_given() -> None:
    joblib = pytest.importorskip("joblib")
    with two_groups() as pool:
        pids = {name: {w[5] for w in where() @ pool[name]} for name in ("prep", "train")}
        for name in ("train", "prep"):
            with joblib.parallel_config(backend="skyward", group=name):
                got = joblib.Parallel(n_jobs=2)(joblib.delayed(_pid)(i) for i in range(12))  # (1: joblib runs it here)
            assert set(got) <= pids[name], name
        with joblib.parallel_config(backend="skyward", group="nope"), \
                pytest.raises(sky.ConfigError, match="no group called 'nope'"):
            joblib.Parallel(n_jobs=2)(joblib.delayed(_pid)(i) for i in range(2))


def test_an_elastic_group_grows_and_shrinks_on_its_own_work() -> None:
    options = sky.Options(console=False, autoscale_cooldown=0.2, autoscale_idle_timeout=1.0,
                          reconcile_tick_interval=0.1)
    groups = {"steady": sky.Spec(nodes=1), "burst": sky.Spec(nodes=(1, 3))}
    with sky.Compute(groups=groups, options=options) as pool:
        futures = [work_a_while(1.5) > pool["burst"] for _ in range(6)]
        wait_for(lambda: pool["burst"].current_nodes() == 3, 30, "the burst group to grow to 3")
        assert pool["steady"].current_nodes() == 1
        assert {f.result(timeout=60) for f in futures} == {"burst"}
        wait_for(lambda: pool["burst"].current_nodes() == 1, 30, "the burst group to shrink back")
        assert pool["steady"].current_nodes() == 1


def test_events_and_console_lines_name_the_group() -> None:
    from skyward.observe import events
    from skyward.observe.console import describe

    seen: list[sky.Event] = []
    with two_groups() as pool:
        unsubscribe = pool.subscribe(seen.append)
        where() @ pool
        events.bus.flush()
        unsubscribe()
    started = [e for e in seen if isinstance(e, sky.TaskStarted)]
    assert sorted(e.group for e in started) == ["prep", "prep", "train"]
    line = describe(sky.InstanceBootstrapped(pool="p", node=0, group="train"), "pool p")
    assert line == "train node 0: ready"
    assert describe(sky.InstanceBootstrapped(pool="p", node=0), "pool p") == "node 0: ready"
    assert "group" not in repr(sky.InstanceBootstrapped(pool="p", node=0))


def test_a_pool_of_groups_is_reproduced_with_its_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    with sky.Compute(groups={"prep": sky.Spec(nodes=2), "train": sky.Spec(nodes=1)}, head="train",
                     options=QUIET) as pool:
        first = pool.id
    with sky.Compute(reproduce=first, options=QUIET) as again:
        assert list(again.groups) == ["prep", "train"] and again.head_group.name == "train"
        assert [w[:2] for w in where() @ again] == [("prep", 0), ("prep", 1), ("train", 0)]


def test_a_failing_health_check_replaces_the_node_within_its_group(tmp_path: Path) -> None:
    flag = tmp_path / "sick"

    def healthy(info: sky.InstanceInfo) -> bool | str:
        if info.group == "train" and flag.exists() and os.getpid() == int(flag.read_text()):
            return "disk full"
        return True

    seen: list[sky.Event] = []
    checker = sky.HealthChecker(healthy, interval=0.2, timeout=5, consecutive_failures=2)
    with sky.Compute(groups={"prep": sky.Spec(nodes=1), "train": sky.Spec(nodes=1)},
                     options=sky.Options(console=False, health_checker=checker)) as pool:
        unsubscribe = pool.subscribe(seen.append)
        train = pool.groups["train"]
        (agent,) = [n["pid"] for n in train.cluster.describe()["nodes"]]
        prep_pid = (where() >> pool["prep"])[5]
        flag.write_text(str(agent))  # the train node's agent turns sick
        wait_for(lambda: [e for e in seen if isinstance(e, sky.InstanceReplaced)], 60, "the replacement")
        (replaced,) = [e for e in seen if isinstance(e, sky.InstanceReplaced)]
        assert replaced.group == "train" and "disk full" in replaced.reason
        wait_for(lambda: pool["train"].current_nodes() == 1, 60, "the train node back")
        assert (where() >> pool["train"])[0] == "train"
        assert (where() >> pool["prep"])[5] == prep_pid  # the other group untouched
        unsubscribe()


def test_a_group_with_min_joins_its_other_nodes_later() -> None:
    groups = {"prep": sky.Spec(nodes=1), "train": sky.Spec(nodes=sky.Nodes(desired=3, min=1))}
    with sky.Compute(groups=groups, options=QUIET) as pool:
        assert pool["train"].current_nodes() >= 1
        wait_for(lambda: pool["train"].current_nodes() == 3, 60, "the train group's other nodes")
        assert sorted(w[1] for w in where() @ pool["train"]) == [0, 1, 2]


def test_diff_compares_two_pools_of_groups_group_by_group() -> None:
    from skyward.records import record

    with sky.Compute(groups={"prep": sky.Spec(nodes=1), "train": sky.Spec(nodes=1)}, options=QUIET) as a:
        pass
    with sky.Compute(groups={"prep": sky.Spec(nodes=1, ttl=300), "eval": sky.Spec(nodes=1)}, head="eval",
                     options=QUIET) as b:
        pass
    found = record.diff(record.read(a.id), record.read(b.id))
    rows = {(d["what"], d["key"]) for d in found}
    assert ("spec of group prep", "ttl") in rows
    assert ("group removed", "train") in rows and ("group added", "eval") in rows
    assert ("head group", "head") in rows
    assert not [d for d in found if d["what"] == "spec"]  # no pool-wide spec row: it is per group
