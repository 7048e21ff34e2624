"""Asleep named pools answer the terminal: ``skyward ssh``, ``cp``, ``exec``, ``install`` and the
dashboard's exec wake a pool of ``nodes = [0, N]`` that sleeps, do their work, and let it sleep
again.

The command wakes the pool as a program would: it attaches as a client (the trail says
``attached ... by skyward ssh``), and its first wait for a node starts one (the pool object
does that, skyward.core.membership), which the pool's recorder writes to the registry and the
trail (``woke``, with the wake's time and price per hour). The command then looks at the pool
the usual way, a second attach that counts as a client while it runs, so the waking client's
autoscaler never puts the pool to sleep under a shell that sits idle. When the command is done,
the waking client leaves like a program: the last client out puts the pool to sleep at once
(no process is left to watch it idle; an idle node would cost money until its ttl), and the
trail says ``asleep`` with what the wake cost. A program attached meanwhile keeps it awake, and
its own autoscaler puts it to sleep once idle.

``--no-wake`` refuses instead, with PoolAsleepError saying how to wake it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import ConfigError, PoolAsleepError
from ..observe import events as ev
from . import sleep
from .cliout import err, money


@dataclass(frozen=True)
class Wake:
    """A wake a command caused: how long it took and how many nodes it started."""

    seconds: float
    nodes: int
    hourly_cost: float | None  # USD per hour of what woke (None: price unknown)


def asleep_error(name: str, ceiling: int | None, command: str) -> PoolAsleepError:
    return PoolAsleepError(
        f"pool {name!r} is asleep (0 of {ceiling} nodes) and --no-wake was given: {command} did not "
        f"run. Run it without --no-wake to wake the pool for it (a node starts, and the pool sleeps "
        f"again once idle), or wake it from a program (its first task does)."
    )


def check_node(name: str, node: int | None) -> None:
    """A ``--node`` for an asleep pool: it wakes with one node, rank 0 (said before it wakes)."""
    if node in (None, 0):
        return
    raise ConfigError(
        f"--node {node}: pool {name!r} has no node right now: it is asleep, and waking it for this "
        f"command starts one node, rank 0. Use --node 0 (or leave --node out), or wake it with more "
        f"nodes from a program first."
    )


@contextlib.contextmanager
def awake(name: str, *, wake: bool, command: str, node: int | None = None,
          say: Callable[[str], None] = err) -> Iterator[Wake | None]:
    """Run the block with pool ``name`` awake: as it is when it has nodes (yields None); when it
    sleeps, woken first (yields the Wake) and left to sleep again after. ``wake`` False (the
    command's --no-wake): an asleep pool raises PoolAsleepError. ``command`` names the waker in
    the trail and in messages (``skyward ssh``); ``node``: the ``--node`` it will ask for."""
    from ..spec import Options
    from .pools import attach, get, status_of

    record = get(name)
    if not status_of(record).asleep:
        yield None
        return
    if not wake:
        raise asleep_error(name, sleep.ceiling(record), f"`{command}`")
    check_node(name, node)
    say(f"pool {name!r} is asleep: waking it for `{command}` (a node starts)")
    started = time.monotonic()
    pool = attach(record, Options(console="silent", logging=False), why=command)
    try:
        pool.members.wait_ready()  # the wake: the pool starts its head node for this wait
        seconds = time.monotonic() - started
        woken = {g: group.members.current_nodes() for g, group in pool.groups.items()}
        nodes = sum(woken.values())
        # The recorder writes the woken nodes to the registry from the event thread: the look
        # that follows reads them there.
        ev.bus.flush(10.0)
        rate = sleep.rate(sleep.prices(record), woken)
        say(f"pool {name!r} woke in {seconds:.1f} s ({nodes} node(s), {money(rate)}/h); it sleeps again "
            f"once idle")
        yield Wake(seconds=seconds, nodes=nodes, hourly_cost=rate)
    finally:
        pool.close()  # the last client out puts it to sleep (its recorder writes that first)
