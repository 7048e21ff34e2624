"""What a dispatch operator points at: the pool type's marker and the active pool.

The operators (skyward.core.function) and the collections' client side (skyward.runtime.collections)
reach a pool through this module instead of importing skyward.core.pool, which imports them: the pool
registers itself as the active one here, and is recognised by the ``DispatchTarget`` base class.
"""

from __future__ import annotations

import contextvars
import importlib
import threading
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
# The pools whose `with` block is open in this process, with the thread each was entered in.
# A ContextVar does not follow a thread the program starts (threading.Thread and
# ThreadPoolExecutor run in a fresh context, joblib's threading backend too), so from such a
# thread the one pool open elsewhere is the active one.
_open: list[tuple[Pool, int]] = []
_open_lock = threading.Lock()


def active_pool() -> Pool | None:
    """The pool of the innermost ``with`` block in this context; else, in a thread that opened
    no pool, the one pool whose block is open in another thread (None when none or several)."""
    found: Pool | None = _active.get()
    if found is not None:
        return found
    others = _elsewhere()
    return others[0] if len(others) == 1 else None


def _elsewhere() -> list[Pool]:
    here = threading.get_ident()
    with _open_lock:
        if any(ident == here for _, ident in _open):
            return []  # this thread's own blocks decide (a fresh Context here means: none)
        pools: list[Pool] = []
        for pool, _ in _open:
            if pool not in pools:
                pools.append(pool)
        return pools


def none_active() -> str:
    """Why there is no active pool here, for an error message that ends with the next step."""
    others = len(_elsewhere())
    if others > 1:
        return (f"this thread is in no pool's `with` block, and {others} pools are open in other "
                f"threads, so which one is meant is not known")
    return "there is no open pool's `with` block in this thread or any other"


def enter(pool: Pool) -> contextvars.Token[Any]:
    """Make ``pool`` the active pool; ``leave`` with the token undoes it."""
    with _open_lock:
        _open.append((pool, threading.get_ident()))
    return _active.set(pool)


def leave(token: contextvars.Token[Any]) -> None:
    pool, here = _active.get(), threading.get_ident()
    _active.reset(token)
    with _open_lock:
        for i in range(len(_open) - 1, -1, -1):
            if _open[i][0] is pool and _open[i][1] == here:
                del _open[i]
                break
