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

    rank: int
    description: dict[str, Any]
    channel: NodeChannel | None
    why: str | None  # why it was not reached

    @property
    def label(self) -> str:
        host = self.description.get("hostname") or (self.description.get("host") or {}).get("address")
        return f"node {self.rank}" + (f" ({host})" if host else "")


@contextlib.contextmanager
def attached(name: str) -> Iterator[tuple[Pool, list[Node]]]:
    """The running pool ``name``, attached for a look, and its nodes in rank order."""
    from ..spec import Options
    from .pools import attach, for_a_look

    record = for_a_look(name)
    # A look replaces nothing: a node lost meanwhile is the programs' to replace (and the
    # registry's to describe); here it is only reported.
    pool = attach(record, Options(console="silent", logging=False, max_provision_attempts=1), audited=False)
    pool.cluster.replace = _no_replacement  # type: ignore[method-assign]
    quiet = logging.NullHandler()  # the pool's own warnings about it would repeat ours
    logging.getLogger("skyward").addHandler(quiet)
    try:
        from .registry import read

        described = ((read(name) or record).get("cluster") or {}).get("nodes", [])
        channels = {ch.node: ch for ch in pool.members.channels}
        missing = pool.cluster.unreachable()
        nodes = []
        for rank, node in enumerate(described):
            index = int(node["index"])
            ch = channels.get(index)
            nodes.append(Node(rank, node, ch, None if ch is not None else missing.get(index, "not attached")))
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
