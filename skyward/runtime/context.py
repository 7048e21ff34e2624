"""Per-process and per-task state on a node, set by the worker before a task runs.

Kept free of heavy imports: the worker imports it at start, user code reads it through
``instance_info()``, ``shard()`` and the output helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from skyward.errors import NoActivePoolError

# The topology of the pool as this node sees it (a plain dict, see skyward.core.membership.Membership.topology).
_topology: dict[str, Any] | None = None
_version = 0

# The worker process's way up to the client for nested dispatch (bootstrap.worker.Worker,
# set when the worker starts; None outside workers). Used by the joblib backend on nodes.
hub: Any = None

# Where the pool's collection server listens, from CONFIGURE ({"host", "port", "token"}; None
# when collections are off, {"error": ...} when the head node could not serve them).
state: dict[str, Any] | None = None
# Called in the worker after a task's function returned, before its result is sent (the
# collections flush their buffered eventual writes there).
task_done_hooks: list[Callable[[], None]] = []

# Id of the task the current thread is running (0 outside tasks).
current_task: ContextVar[int] = ContextVar("skyward_current_task", default=0)
# Output filters set by sky.stdout / sky.stderr / sky.silent for the running task.
suppress_stdout: ContextVar[bool] = ContextVar("skyward_suppress_stdout", default=False)
suppress_stderr: ContextVar[bool] = ContextVar("skyward_suppress_stderr", default=False)
# A callback installed by sky.redirect_output for the running task: (stream, text) -> None.
redirect: ContextVar[Callable[[int, str], None] | None] = ContextVar("skyward_redirect", default=None)


def configure(topology: dict[str, Any]) -> None:
    global _topology, _version
    _topology = topology
    _version += 1


def topology() -> dict[str, Any]:
    if _topology is None:
        raise NoActivePoolError(
            "instance_info() and shard() describe the node a task runs on, and no task is running "
            "here. Call them inside a @sky.function dispatched to a pool, or pass node= and "
            "total_nodes= to shard() explicitly."
        )
    return _topology


def version() -> int:
    return _version


def on_node() -> bool:
    return _topology is not None
