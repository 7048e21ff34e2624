"""What a CLI command does to a running named pool's nodes without taking a task slot
(``skyward logs -f``, ``skyward install``): attach to the pool as a look (no audit entry, no
healing), find each node's channel, and run a small function in each node's agent, beside its
workers.

The function travels as the agent's one such request, HEALTH (see bootstrap/agent.py): the
agent runs it in a thread of its own, so a node whose slots are all busy with long tasks still
answers at once. It is pickled by reference, so it must live in a module the nodes have
(skyward.named.nodeops) and take the agent's ``InstanceInfo`` (or None) as its last argument.
"""

from __future__ import annotations

import contextlib
import logging
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ProviderError, SkywardError

if TYPE_CHECKING:
    from ..bootstrap.channel import NodeChannel
    from ..core.pool import Pool


@dataclass
class Node:
    """One node of the pool as the registry describes it, and its channel when reached."""

    rank: int  # within its group
    description: dict[str, Any]
    channel: NodeChannel | None
    why: str | None  # why it was not reached
    group: str = "default"  # its group (skyward.core.group)
    cluster: Any = None  # its group's provider handle
    grouped: bool = False  # its pool has several groups (its label says which)

    @property
    def label(self) -> str:
        host = self.description.get("hostname") or (self.description.get("host") or {}).get("address")
        where = f"{self.group} " if self.grouped else ""
        return f"{where}node {self.rank}" + (f" ({host})" if host else "")


@contextlib.contextmanager
def attached(name: str, group: str | None = None) -> Iterator[tuple[Pool, list[Node]]]:
    """The running pool ``name``, attached for a look, and its nodes in rank order: those of
    ``group``, or of every group in group order (a pool of several groups)."""
    from ..spec import Options
    from .groupviews import group_view, group_views
    from .pools import attach, for_a_look

    record = for_a_look(name)
    # A look replaces nothing: a node lost meanwhile is the programs' to replace (and the
    # registry's to describe); here it is only reported.
    if group is not None:
        group_view(record, group, "")  # an unknown group fails before anything connects
    pool = attach(record, Options(console="silent", logging=False, max_provision_attempts=1), audited=False)
    for part in pool.groups.values():
        part.cluster.replace = _no_replacement  # type: ignore[method-assign]
    quiet = logging.NullHandler()  # the pool's own warnings about it would repeat ours
    logging.getLogger("skyward").addHandler(quiet)
    try:
        from .registry import read

        views = group_views(read(name) or record)
        nodes = []
        for g, view in views.items():
            if group not in (None, g) or g not in pool.groups:
                continue
            members, cluster = pool.groups[g].members, pool.groups[g].cluster
            channels = {ch.node: ch for ch in members.channels}
            missing = cluster.unreachable()
            for rank, node in enumerate((view.get("cluster") or {}).get("nodes", [])):
                index = int(node["index"])
                ch = channels.get(index)
                nodes.append(Node(rank, node, ch, None if ch is not None else missing.get(index, "not attached"),
                                  g, cluster, len(views) > 1))
        yield pool, nodes
    finally:
        try:
            pool.close()
        finally:
            logging.getLogger("skyward").removeHandler(quiet)


def _no_replacement(lost: Any) -> Any:
    raise ProviderError(f"node {lost.index} was lost; a CLI command only looks, and replaces no node")


def send(channel: NodeChannel, fn: Callable[..., Any], done: Callable[[Any], None]) -> None:
    """Run ``fn(info)`` in the node's agent; ``done`` gets its value, or the exception it raised
    (a lost node: NodeLostError)."""
    from ..bootstrap import serialize
    from ..bootstrap.frames import Kind
    from ..core.dispatch import decode_result

    def finished(result: Any) -> None:
        try:
            value = decode_result(result, getattr(fn, "__qualname__", "a node call"), channel.node)
        except BaseException as exc:
            done(exc)
            return
        done(value)

    flags, body, buffers = serialize.dumps(fn)
    try:
        channel.submit(Kind.HEALTH, flags, body, list(buffers), finished)
    except SkywardError as exc:
        done(exc)


def call(channel: NodeChannel, fn: Callable[..., Any], timeout: float) -> Any:
    """``send`` and wait at most ``timeout`` seconds for the value (TimeoutError past it)."""
    answer: queue.SimpleQueue[Any] = queue.SimpleQueue()
    send(channel, fn, answer.put)
    try:
        value = answer.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"no answer within {timeout:g} s") from None
    if isinstance(value, BaseException):
        raise value
    return value
