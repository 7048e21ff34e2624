"""A cluster's nodes from claim to release: the lifecycle every provider shares.

``NodeTable`` holds a cluster's node records (each provider's own kind: ``N``) by index, the
nodes of an attached pool not handed out yet (``described``), the described ones that could
not be reached (``unreachable``), the next index and the lock around all of them. Every
provider starts its nodes through ``start`` and ``start_each``: the described ones first,
reconnected; then new ones claimed with the next indices and brought up. The provider says
only what differs about its machines: how a described node is reached again (``reconnect``),
how new ones are claimed and brought up, and how nodes are let go of (``release``).

New nodes come up one of two ways. ``begin``: each on its own, in parallel (SSH hosts,
containers); ``start_each`` hands out each as it is ready and releases a node that fails (it
comes as its exception). ``together``: all of a start's new nodes at once, in one step that
succeeds or fails for all of them (one Slurm job; Local's agents, forked here and greeted in
turn); ``start_each`` then hands them out as ``start`` does. Either way ``start`` waits for all
and, when any fails, releases every new node of that start in one call and raises the first
failure; the described nodes it reconnected stay."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import logging
    from typing import TypeAlias

    from .base import NodeEndpoint

# (concurrent.futures loads when nodes start in parallel: a Local pool's nodes start
# before the client has loaded them, see Local.launch.)
N = TypeVar("N")

if TYPE_CHECKING:
    # begin(count) claims ``count`` new nodes and says how each comes up (on a thread of its own).
    Begin: TypeAlias = Callable[[int], tuple[list[N], Callable[[N], NodeEndpoint]]]
    # together(count) claims ``count`` new nodes and says how they come up all at once: their
    # endpoints in index order, or an exception for all of them.
    Together: TypeAlias = Callable[[int], tuple[list[N], Callable[[list[N]], list[NodeEndpoint]]]]


class NodeTable(Generic[N]):
    """One cluster's nodes (``index_of`` reads a record's index: ``.index`` by default)."""

    def __init__(self, index_of: Callable[[N], int] = attrgetter("index")) -> None:
        self.lock = threading.Lock()
        self.nodes: dict[int, N] = {}  # claimed or handed out, until released
        self.described: list[N] = []  # running nodes of an attached pool, not handed out yet
        self.unreachable: dict[int, str] = {}  # described nodes that could not be reached: why
        self.next = 0
        self._index = index_of

    # -- restore and describe -------------------------------------------------------------------
    def restore(self, described: Iterable[N], next_index: int | None = None) -> None:
        """The nodes another process started (its description), handed out first by ``start``."""
        with self.lock:
            self.described = sorted(described, key=self._index)
            self.next = next_index if next_index is not None else (
                max((self._index(n) for n in self.described), default=-1) + 1)

    def all(self) -> list[N]:
        """Every node this cluster holds, handed out or described, in index order (``describe``)."""
        with self.lock:
            return self.all_locked()

    def all_locked(self) -> list[N]:
        """``all`` for a caller that holds ``lock`` (with the rest of its description)."""
        return sorted([*self.nodes.values(), *self.described], key=self._index)

    def find(self, index: int) -> N | None:
        """Node ``index``, handed out or still described."""
        with self.lock:
            return self.nodes.get(index) or next((n for n in self.described if self._index(n) == index), None)

    # -- claim, reconnect, release ------------------------------------------------------------------
    def claim(self, count: int, make: Callable[[int], N]) -> list[N]:
        """``count`` new nodes, with the next indices (``make(index)``: the provider's record)."""
        with self.lock:
            return self.claim_locked(count, make)

    def claim_locked(self, count: int, make: Callable[[int], N]) -> list[N]:
        """``claim`` for a caller that holds ``lock``."""
        made = []
        for _ in range(count):
            node = make(self.next)
            self.next += 1
            self.nodes[self._index(node)] = node
            made.append(node)
        return made

    def take_described(self, count: int) -> list[N]:
        """Up to ``count`` described nodes, in index order, to hand out (``reconnect`` them)."""
        with self.lock:
            taken, self.described = self.described[:count], self.described[count:]
            return taken

    def add(self, node: N) -> None:
        with self.lock:
            self.nodes[self._index(node)] = node

    def mark_unreachable(self, index: int, why: str) -> None:
        with self.lock:
            self.unreachable[index] = why

    def replaced(self, index: int) -> None:
        with self.lock:
            self.unreachable.pop(index, None)

    def held(self, indices: Iterable[int]) -> list[N]:
        """The nodes of these indices that the table holds (others are ignored)."""
        with self.lock:
            return [self.nodes[i] for i in indices if i in self.nodes]

    def forget(self, nodes: Iterable[N]) -> None:
        """These nodes are released: the table no longer holds them."""
        with self.lock:
            for n in nodes:
                self.nodes.pop(self._index(n), None)

    def clear(self) -> list[N]:
        """Every node, handed out or described, taken out of the table (``close``, ``detach``)."""
        with self.lock:
            return self.clear_locked()

    def clear_locked(self) -> list[N]:
        """``clear`` for a caller that holds ``lock``."""
        everything = [*self.nodes.values(), *self.described]
        self.nodes.clear()
        self.described = []
        return everything

    # -- starting ---------------------------------------------------------------------------------
    def start_each(self, count: int, *, reconnect: Callable[[list[N]], list[NodeEndpoint]],
                   begin: Begin[N] | None = None, together: Together[N] | None = None,
                   release: Callable[[list[N]], Any], workers: int = 8) -> Iterator[NodeEndpoint | BaseException]:
        """``count`` nodes, each as soon as it is ready: the described ones first (``reconnect``
        marks those it cannot reach unreachable), then new ones from ``begin``, brought up in
        parallel; a new node that fails is released and comes as its exception. With
        ``together`` the new nodes come as ``start`` gives them (and a failure is raised)."""
        if together is not None:
            yield from self.start(count, reconnect=reconnect, together=together, release=release)
            return
        assert begin is not None, "NodeTable.start_each needs begin= or together="
        described = self.take_described(count)
        if described:
            yield from reconnect(described)
            count -= len(described)
        if count <= 0:
            return
        from concurrent.futures import ThreadPoolExecutor, as_completed

        nodes, bring_up = begin(count)
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(nodes)))) as pool:
            futures = {pool.submit(bring_up, n): n for n in nodes}
            for f in as_completed(futures):
                try:
                    yield f.result()
                except BaseException as exc:
                    release([futures[f]])
                    yield exc

    def start(self, count: int, *, reconnect: Callable[[list[N]], list[NodeEndpoint]],
              begin: Begin[N] | None = None, together: Together[N] | None = None,
              release: Callable[[list[N]], Any], workers: int = 8, log: logging.Logger | None = None,
              ) -> list[NodeEndpoint]:
        """``count`` nodes, all at once, in index order: the described ones first, then new ones
        brought up in parallel. When any new node fails, every new node of this start is released
        in one go (those that came up too) and the first failure is raised; the described nodes
        it reconnected stay. ``log``: where more than one failure is said (the first is raised)."""
        described = self.take_described(count)
        endpoints = reconnect(described) if described else []
        count -= len(described)
        if count <= 0:
            return endpoints
        if together is not None:
            new, bring_up_all = together(count)
            try:
                return endpoints + bring_up_all(new)
            except BaseException:
                release(new)  # nothing left running of this start
                raise
        assert begin is not None, "NodeTable.start needs begin= or together="
        from concurrent.futures import ThreadPoolExecutor

        nodes, bring_up = begin(count)
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(nodes)))) as pool:
            futures = [pool.submit(bring_up, n) for n in nodes]
        errors: list[BaseException] = []
        for f in futures:
            try:
                endpoints.append(f.result())
            except BaseException as exc:
                errors.append(exc)
        if errors:
            release(nodes)  # nothing left running of this start
            if len(errors) > 1 and log is not None:
                log.error("%d nodes failed to start; the first error follows", len(errors))
            raise errors[0]
        return sorted(endpoints, key=lambda e: e.index)
