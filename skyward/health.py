"""sky.HealthChecker: a check the pool runs on every node, replacing nodes that keep failing it.

The check runs in the node's agent, beside the workers and never in a task slot, so a node busy
with long tasks still answers it; one function object per node runs every check there, so it
may keep state between calls. The client judges the answers: ``True`` is healthy; ``False``, a
string (the reason), an exception, or no answer within ``timeout`` is a failure. After
``consecutive_failures`` failures in a row the node is replaced like a lost one, with a reason
that says "health check". A node gets no tasks until its first check has passed (it is
warming), and a new pool is handed over only once its nodes have warmed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError


@dataclass(frozen=True, slots=True)
class HealthChecker:
    """``fn(info)`` on each node every ``interval`` seconds (``info``: the node's
    ``sky.InstanceInfo``); ``initial_delay``: seconds after a node joins before its first check."""

    fn: Callable[[Any], Any]
    interval: float = 30.0
    timeout: float = 15.0
    consecutive_failures: int = 3
    initial_delay: float = 0.0

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigError(
                f"HealthChecker(fn={self.fn!r}) is not valid: pass a function taking the node's "
                f"InstanceInfo and returning True when the node is healthy."
            )
        for name in ("interval", "timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"HealthChecker({name}={value!r}) is not valid: use a positive number of seconds.")
        if isinstance(self.initial_delay, bool) or not isinstance(self.initial_delay, int | float) or self.initial_delay < 0:
            raise ConfigError(
                f"HealthChecker(initial_delay={self.initial_delay!r}) is not valid: use seconds >= 0."
            )
        n = self.consecutive_failures
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(
                f"HealthChecker(consecutive_failures={n!r}) is not valid: use an int >= 1 (how many "
                f"failed checks in a row replace a node)."
            )


# On a node: each pool's check as it first arrived there, kept between calls (see NodeCheck).
_LIVE: dict[str, Callable[[Any], Any]] = {}


@dataclass(frozen=True, slots=True)
class NodeCheck:
    """What travels to a node for each check: the check and a key naming it (pool and checker).

    Every check arrives as a fresh copy of ``fn``; the node runs the first copy it got for the
    key, so a check keeps its own state from call to call (a counter, a warm-up that passes on
    its third try, a handle it opened), as a check running in one loop on the node would."""

    key: str
    fn: Callable[[Any], Any]

    def __call__(self, info: Any) -> Any:
        return _LIVE.setdefault(self.key, self.fn)(info)


def verdict(value: Any) -> str | None:
    """None when a check's return value means healthy, else the reason it failed."""
    if value is True:
        return None
    if isinstance(value, str):
        return value or "the health check returned an empty reason"
    if value is False or value is None:
        return f"the health check returned {value!r}"
    return f"the health check returned {value!r} (return True when healthy, False or a reason when not)"
