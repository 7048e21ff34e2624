"""A pool's CONFIGURE messages: every node's holds its group's peer list (and, in a pool of
several groups, the pool's), so at 1,000 nodes each is about 120 KB. The lists are encoded
once for all the nodes (membership._SharedJSON), to the same bytes json.dumps gives."""

from __future__ import annotations

import json
from typing import Any

import pytest

from skyward.core import membership
from skyward.core.membership import _SharedJSON


def config(node: int, peers: list[dict[str, Any]], wide: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "topology": {"node": node, "total_nodes": len(wide), "peers": wide, "group_peers": peers,
                     "accelerator": None, "network": {"interface": "eth0", "bandwidth_gbps": None},
                     "name": "pool-ü", "share": 0.5, "ranks": [1, 2]},
        "worker": {"processes": 2, "reuse": True}, "metrics": [{"kind": "cpu", "interval": 1.0}],
        "spill": None, "plugins": None, "state": ["10.0.0.1", 5000],
    }


def test_each_node_gets_the_bytes_json_dumps_gives() -> None:
    peers = [{"node": i, "private_ip": f"10.0.0.{i}", "public_ip": None} for i in range(40)]
    wide = peers + [{"node": 40 + i, "private_ip": f"10.0.1.{i}", "public_ip": "1.2.3.4"} for i in range(10)]
    shared = _SharedJSON()
    for node in range(50):
        assert shared.dumps(config(node, peers, wide)) == json.dumps(config(node, peers, wide)).encode()
    # another list (a new object): encoded for itself
    assert shared.dumps(config(0, peers[:20], wide)) == json.dumps(config(0, peers[:20], wide)).encode()


def test_a_large_peer_list_is_encoded_once_for_all_the_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    peers = [{"node": i, "private_ip": f"10.0.{i // 250}.{i % 250}", "public_ip": None} for i in range(1000)]
    encoded: list[int] = []
    real = json.dumps

    def counting(value: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(value, list) and len(value) == 1000:
            encoded.append(1)
        return real(value, *args, **kwargs)

    monkeypatch.setattr(membership.json, "dumps", counting)
    shared = _SharedJSON()
    for node in range(100):
        shared.dumps(config(node, peers, peers))
    assert len(encoded) == 1

