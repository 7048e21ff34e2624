"""What a dispatch operator points at: the pool type's marker and the active pool.

The operators (skyward.core.function) and the collections' client side (skyward.runtime.collections)
reach a pool through this module instead of importing skyward.core.pool, which imports them: the pool
registers itself as the active one here, and is recognised by the ``DispatchTarget`` base class.
"""

from __future__ import annotations

import contextvars
import importlib
import types

from ..errors import DispatchError

TYPE_CHECKING = False  # (not from typing: node processes import this; see skyward/__init__)

if TYPE_CHECKING:
    from typing import Any

    from .pool import Pool


class RefusesPlainValues:
    """The right-hand side of the operators: a pending call's operator handles it first; any
    other value pushed at it lands here, and ``1 >> pool`` says what went wrong."""

    __slots__ = ()

    def __rrshift__(self, value: Any) -> Any:
        raise not_pending(value, ">>")

    def __rmatmul__(self, value: Any) -> Any:
        raise not_pending(value, "@")

    def __lt__(self, value: Any) -> Any:  # `value > pool`, reflected
        raise not_pending(value, ">")


class DispatchTarget(RefusesPlainValues):
    """A base of ``skyward.core.pool.Pool``: what ``f() >> x`` accepts as ``x`` without looking
    further (a plain class, so that the check on every call is a fast ``isinstance``)."""

    __slots__ = ()


class StandsForActivePool(RefusesPlainValues):
    """What the right-hand side of an operator may be to mean "the active pool": the skyward
    module (``>> sky``) and ``sky.sky``. A pending call's operator resolves it
    (skyward.core.function.resolve_pool)."""

    __slots__ = ()


def not_pending(value: Any, op: str) -> DispatchError:
    """The error for ``value <op> pool`` when ``value`` is not a pending call: usually the result
    of a plain function that has just run here."""
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return DispatchError(
        f"`{op}` dispatches a pending call to a pool, and the left side is a {type(value).__name__} "
        f"({text}). If it is what a plain function returned, that function already ran here, on "
        f"this machine: mark it with @sky.function, so that calling it captures the call and "
        f"`{op}` runs it on the pool."
    )


class SkywardModule(StandsForActivePool, types.ModuleType):
    """The class of the ``skyward`` module (a module has no operators of its own)."""

    def __reduce__(self) -> Any:  # a task that references `sky` pickles it by name, as any module
        return importlib.import_module, (self.__name__,)


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
