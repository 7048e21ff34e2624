"""What a dispatch operator points at: the pool type's marker and the active pool.

The operators (skyward.core.function) and the collections' client side (skyward.runtime.collections)
reach a pool through this module instead of importing skyward.core.pool, which imports them: the pool
registers itself as the active one here, and is recognised by the ``DispatchTarget`` base class.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .pool import Pool


class DispatchTarget:
    """A base of ``skyward.core.pool.Pool``: what ``f() >> x`` accepts as ``x`` without looking
    further (a plain class, so that the check on every call is a fast ``isinstance``)."""

    __slots__ = ()


_active: contextvars.ContextVar[Any] = contextvars.ContextVar("skyward_active_pool", default=None)


def active_pool() -> Pool | None:
    """The pool of the innermost ``with`` block in this context, if any."""
    found: Pool | None = _active.get()
    return found


def enter(pool: Pool) -> contextvars.Token[Any]:
    """Make ``pool`` the active pool; ``leave`` with the token undoes it."""
    return _active.set(pool)


def leave(token: contextvars.Token[Any]) -> None:
    _active.reset(token)
