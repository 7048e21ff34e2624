"""Task output reaches the client, filtered per worker; instance_info on each node."""

from __future__ import annotations

import subprocess
import sys

import pytest

import skyward as sky


@sky.function
def chatty(tag: str) -> str:
    print(f"out {tag}")
    print(f"err {tag}", file=sys.stderr)
    print("no newline at the end", end="")
    return tag


@sky.stdout(only="head")
@sky.function
def head_only() -> int:
    print("printed by", sky.instance_info().node)
    return sky.instance_info().node


@sky.silent
@sky.function
def quiet() -> int:
    print("you should not see this")
    print("nor this", file=sys.stderr)
    return 1


@sky.function
def captured() -> list[str]:
    lines: list[str] = []
    with sky.redirect_output(lines.append):
        print("kept")
    print("shown")
    return lines


@sky.function
def info() -> dict:
    i = sky.instance_info()
    return {
        "node": i.node, "total": i.total_nodes, "head": i.is_head, "is_head_fn": sky.is_head(i),
        "peers": [(p.node, p.private_ip) for p in i.peers], "head_addr": i.head_addr,
        "head_port": i.head_port, "job": i.job_id, "worker": i.worker,
        "workers_per_node": i.workers_per_node, "global": i.global_worker_index,
        "total_workers": i.total_workers, "hostname": i.hostname, "network": i.network.interface,
        "accelerator": i.accelerator,
    }


@sky.function
def my_shard(data: list[int]) -> list[int]:
    return sky.shard(data)


@sky.function
def run_echo() -> None:
    subprocess.run(["echo", "from a subprocess"], check=True)


def test_stdout_and_stderr_reach_the_client_prefixed(pool: sky.Pool, capfd: pytest.CaptureFixture[str]) -> None:
    assert pool.run(chatty("A"), target=1) == "A"
    out, err = capfd.readouterr()
    assert "[node 1] out A" in out
    assert "[node 1] no newline at the end" in out
    assert "[node 1] err A" in err


def test_fd_level_output_of_subprocesses(pool: sky.Pool, capfd: pytest.CaptureFixture[str]) -> None:
    pool.run(run_echo(), target=0)
    pool.run(chatty("sync"), target=0)  # node output is asynchronous: give it a moment
    import time

    deadline = time.monotonic() + 5
    seen = ""
    while time.monotonic() < deadline and "from a subprocess" not in seen:
        time.sleep(0.05)
        seen += capfd.readouterr().out
    assert "[node 0] from a subprocess" in seen


def test_stdout_only_head(pool: sky.Pool, capfd: pytest.CaptureFixture[str]) -> None:
    assert head_only() @ pool == [0, 1]
    out, _ = capfd.readouterr()
    assert "printed by 0" in out and "printed by 1" not in out


def test_silent(pool: sky.Pool, capfd: pytest.CaptureFixture[str]) -> None:
    assert quiet() @ pool == [1, 1]
    out, err = capfd.readouterr()
    assert "should not see" not in out and "nor this" not in err


def test_redirect_output_on_node_and_client(pool: sky.Pool, capfd: pytest.CaptureFixture[str]) -> None:
    assert pool.run(captured(), target=0) == ["kept", "\n"]
    assert "shown" in capfd.readouterr().out
    lines: list[str] = []
    with sky.redirect_output(lines.append):
        print("on the client")
    assert lines == ["on the client", "\n"]


def test_instance_info_on_each_node(pool: sky.Pool) -> None:
    infos = info() @ pool
    assert [i["node"] for i in infos] == [0, 1]
    assert all(i["total"] == 2 for i in infos)
    assert [i["head"] for i in infos].count(True) == 1 and infos[0]["head"]
    assert [i["is_head_fn"] for i in infos] == [True, False]
    assert all(i["peers"] == [(0, "127.0.0.1"), (1, "127.0.0.1")] for i in infos)
    assert len({i["job"] for i in infos}) == 1 and len({i["head_port"] for i in infos}) == 1
    assert [i["global"] for i in infos] == [0, 1]
    assert all(i["total_workers"] == 2 and i["workers_per_node"] == 1 for i in infos)
    assert all(i["accelerator"] is None and i["network"] == "lo" and i["hostname"] for i in infos)


def test_shard_inside_tasks_covers_everything(pool: sky.Pool) -> None:
    parts = my_shard(list(range(10))) @ pool
    assert sorted(parts[0] + parts[1]) == list(range(10))
    assert not set(parts[0]) & set(parts[1])


def test_instance_info_outside_a_task() -> None:
    with pytest.raises(sky.NoActivePoolError):
        sky.instance_info()
