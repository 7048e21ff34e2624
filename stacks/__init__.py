"""Pulumi stacks for cloud pools: one ephemeral stack per pool, driven by the automation API.

* ``engine``: PoolStack (preview/up/refresh/destroy/remove/history/outputs/export), events,
  errors, Ctrl-C, and the ways out (``unlock``, ``clear_pending``, ``open_stack``);
* ``backend``: project, stack names, backend URL and secrets passphrase;
* ``cli``: finding (or installing) the Pulumi CLI;
* ``aws`` / ``gcp``: the stack programs; ``plan``: their input; ``userdata``: what nodes boot
  with; ``keys``: client and host keys; ``network``: who may reach port 22;
* ``cloudpool``: a pool's life as stack updates, and its nodes as SSH hosts (and their
  description, to reopen a named pool's stack in another process);
* ``preview``: what a pool's stack would create, from the real program under Pulumi's mocks.

Nothing here imports pulumi until an operation runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cli import install
    from .engine import PoolStack, clear_pending, open_stack, unlock

__all__ = ["PoolStack", "clear_pending", "install", "open_stack", "unlock"]


def __getattr__(name: str) -> Any:
    """The names above, imported on first use: the CLI's `skyward ls` looks for orphaned stacks
    (``orphans``) and needs neither the engine nor the CLI finder."""
    if name == "install":
        from .cli import install

        return install
    if name in __all__:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
