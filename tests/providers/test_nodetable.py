"""The node table every provider starts its nodes through (providers/nodetable.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from skyward.errors import ProviderError
from skyward.providers.base import NodeEndpoint
from skyward.providers.nodetable import NodeTable


@dataclass
class _Node:
    index: int
    described: bool = False


def _endpoint(node: _Node) -> NodeEndpoint:
    return NodeEndpoint(index=node.index, private_ip=f"10.0.0.{node.index}", public_ip=None,
                        hostname=f"n{node.index}", connect=lambda: None)


class _Machines:
    """A provider's side of the table: which nodes were released, and in how many calls."""

    def __init__(self, table: NodeTable[_Node], failing: frozenset[int] = frozenset()) -> None:
        self.table, self.failing = table, failing
        self.releases: list[list[int]] = []

    def reconnect(self, nodes: list[_Node]) -> list[NodeEndpoint]:
        for n in nodes:
            self.table.add(n)
        return [_endpoint(n) for n in nodes]

    def begin(self, count: int) -> tuple[list[_Node], Callable[[_Node], NodeEndpoint]]:
        return self.table.claim(count, _Node), self.bring_up

    def bring_up(self, node: _Node) -> NodeEndpoint:
        if node.index in self.failing:
            raise ProviderError(f"node {node.index} did not come up")
        return _endpoint(node)

    def release(self, nodes: list[_Node]) -> None:
        self.releases.append(sorted(n.index for n in nodes))
        self.table.forget(nodes)

    def kw(self) -> dict[str, object]:
        return {"reconnect": self.reconnect, "begin": self.begin, "release": self.release}


def test_a_start_hands_out_the_described_nodes_first_then_new_ones_in_index_order() -> None:
    table: NodeTable[_Node] = NodeTable()
    table.restore([_Node(1, True), _Node(0, True)], next_index=5)
    m = _Machines(table)
    got = table.start(4, **m.kw())  # type: ignore[arg-type]
    assert [e.index for e in got] == [0, 1, 5, 6]
    assert sorted(table.nodes) == [0, 1, 5, 6] and table.described == [] and table.next == 7
    assert [n.index for n in table.all()] == [0, 1, 5, 6] and m.releases == []


def test_when_a_new_node_fails_every_new_node_goes_in_one_release_and_the_reconnected_stay() -> None:
    table: NodeTable[_Node] = NodeTable()
    table.restore([_Node(0, True)], next_index=1)
    m = _Machines(table, failing=frozenset({2, 3}))
    with pytest.raises(ProviderError, match="node 2 did not come up"):  # the first failure, by index
        table.start(4, **m.kw())  # type: ignore[arg-type]
    assert m.releases == [[1, 2, 3]]  # one call: a cloud's stack shrinks once
    assert sorted(table.nodes) == [0]  # the described node it reconnected is still the pool's


def test_each_node_comes_as_it_is_ready_and_a_failed_one_is_released_on_its_own() -> None:
    table: NodeTable[_Node] = NodeTable()
    m = _Machines(table, failing=frozenset({1}))
    got = list(table.start_each(3, **m.kw()))  # type: ignore[arg-type]
    assert sorted(g.index for g in got if isinstance(g, NodeEndpoint)) == [0, 2]
    (error,) = [g for g in got if isinstance(g, BaseException)]
    assert "node 1" in str(error) and m.releases == [[1]]
    assert sorted(table.nodes) == [0, 2]


def test_find_clear_and_unreachable() -> None:
    table: NodeTable[_Node] = NodeTable()
    table.restore([_Node(3, True), _Node(4, True)])
    assert table.next == 5 and table.find(4) == _Node(4, True) and table.find(9) is None
    (taken,) = table.take_described(1)
    table.add(taken)
    table.mark_unreachable(3, "its host does not answer")
    assert table.unreachable == {3: "its host does not answer"}
    table.replaced(3)
    assert table.unreachable == {} and table.held([3, 4, 7]) == [_Node(3, True)]
    assert sorted(n.index for n in table.clear()) == [3, 4]
    assert table.all() == [] and table.find(3) is None


class _Together(_Machines):
    """Nodes that come up in one step (one Slurm job): all of them, or an error for all."""

    def together(self, count: int) -> tuple[list[_Node], Callable[[list[_Node]], list[NodeEndpoint]]]:
        return self.table.claim(count, _Node), self.bring_up_all

    def bring_up_all(self, nodes: list[_Node]) -> list[NodeEndpoint]:
        return [self.bring_up(n) for n in nodes]

    def kw(self) -> dict[str, object]:
        return {"reconnect": self.reconnect, "together": self.together, "release": self.release}


def test_nodes_that_come_up_together_are_handed_out_after_the_described_ones() -> None:
    table: NodeTable[_Node] = NodeTable()
    table.restore([_Node(0, True)], next_index=2)
    m = _Together(table)
    assert [e.index for e in table.start(3, **m.kw())] == [0, 2, 3]  # type: ignore[arg-type]
    assert [e.index for e in table.start_each(2, **m.kw())] == [4, 5]  # type: ignore[arg-type]
    assert sorted(table.nodes) == [0, 2, 3, 4, 5] and m.releases == []


def test_when_nodes_that_come_up_together_fail_they_all_go_in_one_release() -> None:
    table: NodeTable[_Node] = NodeTable()
    table.restore([_Node(0, True)], next_index=1)
    m = _Together(table, failing=frozenset({2}))
    with pytest.raises(ProviderError, match="node 2 did not come up"):
        table.start(3, **m.kw())  # type: ignore[arg-type]
    assert m.releases == [[1, 2]] and sorted(table.nodes) == [0]
    with pytest.raises(ProviderError, match="node 2 did not come up"):  # start_each raises it too
        table.next = 1
        list(table.start_each(2, **m.kw()))  # type: ignore[arg-type]
    assert m.releases == [[1, 2], [1, 2]] and sorted(table.nodes) == [0]
