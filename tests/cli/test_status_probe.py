"""`skyward status` of pools of any size: nodes are probed at most 32 at a
time, the results are kept beside the record, and a pool of more than 64 nodes is shown from
its last probe, with its age, unless --probe asks for a new one."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from skyward.named import cli as skyward_cli
from skyward.named import probe, registry

from .conftest import CLI


def test_status_keeps_its_probe_and_cached_shows_it_without_contacting_the_nodes(cli: CLI) -> None:
    assert cli("up", "st", "--nodes", "2").code == 0
    never = cli("status", "st", "--cached", "--json")
    assert never.code == 0, never  # nothing known to be down
    assert [n["reachable"] for n in never.json()["nodes"]] == [None, None]
    assert never.json()["probe"] == {"live": False, "at": None, "age_seconds": None}
    assert "never probed" in cli("status", "st", "--cached").out

    live = cli("status", "st", "--json")  # 2 nodes: probed every time
    assert live.code == 0 and live.json()["probe"]["live"] is True, live
    assert [n["reachable"] for n in live.json()["nodes"]] == [True, True]

    pid = int(cli.record("st")["cluster"]["nodes"][1]["pid"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pid in cli.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    cached = cli("status", "st", "--cached", "--json")  # what the last probe saw: both up
    assert cached.code == 0, cached
    assert [n["reachable"] for n in cached.json()["nodes"]] == [True, True]
    assert cached.json()["probe"]["live"] is False and cached.json()["probe"]["age_seconds"] >= 0
    text = cli("status", "st", "--cached")
    assert "health as of its last probe" in text.out and "skyward status st --probe" in text.out, text

    again = cli("status", "st", "--probe", "--json")
    assert again.code == 1, again
    assert [n["reachable"] for n in again.json()["nodes"]] == [True, False]
    later = cli("status", "st", "--cached", "--json")
    assert later.code == 1 and [n["reachable"] for n in later.json()["nodes"]] == [True, False], later
    assert cli("status", "st", "--probe", "--cached").code == 2  # one or the other


def _record(name: str, nodes: int) -> dict[str, Any]:
    """A running AWS pool's record as `skyward up` leaves it (what status reads of it)."""
    now = time.time()
    return {
        "name": name, "id": "ab12cd34", "state": "running", "provider": "aws",
        "config": {"provider": "aws", "nodes": nodes, "aws": {"detect_address": False, "allow_ssh_from": ["10.0.0.0/8"]}},
        "cluster": {"provider": "aws", "nodes": [
            {"index": i, "hostname": f"ip-10-0-{i // 256}-{i % 256}", "private_ip": f"10.0.{i // 256}.{i % 256}",
             "host": {"address": "127.0.0.1", "port": 1}, "agent_pid": 4000 + i} for i in range(nodes)]},
        "owner": {"who": "test", "pid": os.getpid(), "host": "elsewhere"}, "created": now, "last_seen": now,
        "ttl": 600, "clients": [], "hourly_cost": 0.1, "offer": f"aws: {nodes} node(s)",
    }


def test_a_1000_node_pool_is_shown_from_its_last_probe_and_no_node_is_contacted(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    def no_contact(record: dict[str, Any]) -> list[dict[str, Any]]:
        raise AssertionError("status contacted the nodes of a 1,000-node pool")

    monkeypatch.setattr(probe, "probe", no_contact)
    record = _record("big", 1000)
    registry.write(record)
    seen = [{"index": i, "hostname": f"h{i}", "private_ip": "x", "reachable": i != 7, "agent_pid": 1}
            for i in range(990)]  # ten nodes came after that probe
    probe.save(record, seen, at=time.time() - 600)

    assert skyward_cli.main(["status", "big", "--json"]) == 1  # node 7 was down
    out = json.loads(capsys.readouterr().out)
    assert len(out["nodes"]) == 1000 and out["probe"]["live"] is False
    assert 599 <= out["probe"]["age_seconds"] < 700
    assert [n["index"] for n in out["nodes"] if n["reachable"] is False] == [7]
    assert [n["index"] for n in out["nodes"] if n["reachable"] is None] == list(range(990, 1000))

    assert skyward_cli.main(["status", "big"]) == 1
    text = capsys.readouterr().out
    assert "health as of its last probe, 10m ago" in text and "contacts the 1000 node(s) now" in text

    # A pool of the same name started since: the old probe is not its probe.
    registry.write({**record, "id": "ffff0000"})
    assert skyward_cli.main(["status", "big", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["probe"]["at"] is None and {n["reachable"] for n in out["nodes"]} == {None}
    registry.remove("big")
    assert registry.read_probe("big") is None  # the probe goes with the record


def test_a_probe_contacts_the_nodes_32_at_a_time(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """100 nodes whose agents answer after 50 ms: contacted in parallel, never more than 32 at once."""
    from skyward.bootstrap import channel
    from skyward.named import pools

    lock = threading.Lock()
    now = {"open": 0, "most": 0}

    class Channel:
        def __init__(self, sock: Any, node: int, **kw: Any) -> None:
            with lock:
                now["open"] += 1
                now["most"] = max(now["most"], now["open"])
            time.sleep(0.05)
            self.facts = {"hostname": f"n{node}", "pid": 10 + node, "python": "3.12", "tasks": 0}
            with lock:
                now["open"] -= 1

        def close(self) -> None:
            pass

    class Endpoint:
        agent_id = ""  # (NodeEndpoint's: no identity to hold the agent to)

        def __init__(self, index: int) -> None:
            self.index = index

        def connect(self) -> None:
            return None

    class Cluster:
        token = "t"

        def start(self, count: int) -> list[Endpoint]:
            return [Endpoint(i) for i in range(count) if i != 3]  # node 3's host does not answer

        def unreachable(self) -> dict[int, str]:
            return {3: "connection refused"}

        def detach(self) -> None:
            pass

    class Provider:
        def attach(self, description: dict[str, Any]) -> Cluster:
            return Cluster()

    monkeypatch.setattr(channel, "NodeChannel", Channel)
    monkeypatch.setattr(pools, "provider_from", lambda config: Provider())
    t0 = time.perf_counter()
    nodes = probe.probe(_record("p", 100))
    took = time.perf_counter() - t0
    assert [n["index"] for n in nodes if not n["reachable"]] == [3] and nodes[3]["error"] == "connection refused"
    assert nodes[42]["agent_pid"] == 52 and nodes[42]["hostname"] == "n42"
    assert now["most"] == probe.PARALLEL == 32
    assert took < 99 * 0.05 / 2  # not one after the other (that is ~5 s)
