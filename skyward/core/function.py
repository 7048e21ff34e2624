"""Lazy functions and the dispatch operators.

``@sky.function`` turns a function into a factory of PendingFunction snapshots; nothing runs
until an operator hands the snapshot to a pool:

    f(x) >> pool     one node              f(x) @ pool   every node (list, by node)
    f(x) > pool      async (a Future)      (f(1) & f(2)) >> pool   a parallel group (tuple)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Generic, ParamSpec, TypeVar, final, overload

from ..errors import ConfigError, DispatchError, NoActivePoolError
from ..runtime import context as _context
from .target import DispatchTarget, StandsForActivePool, active_pool

if TYPE_CHECKING:  # (concurrent.futures loads logging: 15 ms of every @sky.function's first use)
    from concurrent.futures import Future

    from .pool import Pool

P = ParamSpec("P")
T = TypeVar("T")


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigError(f"timeout={timeout!r} is not valid: use a positive number of seconds (or None for the pool default).")
    return float(timeout)


def resolve_pool(target: Any, op: str) -> Pool:
    """The pool a dispatch operator points at: a Pool, a Compute, or the active pool (the
    skyward module, or sky.sky)."""
    if isinstance(target, DispatchTarget):
        return target  # type: ignore[return-value]  # Pool is the one DispatchTarget
    pool = getattr(target, "pool", None)  # a Compute / Session handle
    if isinstance(pool, DispatchTarget):
        return pool  # type: ignore[return-value]
    if isinstance(target, StandsForActivePool):  # the skyward module, or sky.sky
        found = active_pool()
        if found is None:
            raise NoActivePoolError(
                f"`{op} sky` needs an active pool and there is none here. Dispatch inside "
                f"`with sky.Compute(...) as pool:` (in the same thread), or use `{op} pool`."
            )
        return found
    raise DispatchError(
        f"cannot dispatch with {op} to a {type(target).__name__}: the right-hand side must be a "
        f"pool (from `with sky.Compute(...) as pool`) or the skyward module (`{op} sky`)."
    )


@dataclass(frozen=True, slots=True, eq=False)
class PendingFunction(Generic[T]):
    """A call captured for remote execution: fn, args, kwargs and an optional timeout."""

    fn: Callable[..., T]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))

    def with_timeout(self, seconds: float) -> PendingFunction[T]:
        return replace(self, timeout=_check_timeout(seconds))

    def __rshift__(self, target: Any) -> T:
        return resolve_pool(target, ">>").run(self)

    def __matmul__(self, target: Any) -> list[T]:
        return resolve_pool(target, "@").broadcast(self)

    def __gt__(self, target: Any) -> Future[T]:
        return resolve_pool(target, ">").run_async(self)

    def __and__(self, other: Any) -> PendingFunctionGroup:
        if isinstance(other, PendingFunction):
            return PendingFunctionGroup((self, other))
        if isinstance(other, PendingFunctionGroup):
            return PendingFunctionGroup((self, *other.items), other.stream, other.ordered, other.timeout)
        raise DispatchError(_and_error(other))

    def __repr__(self) -> str:
        short = _short_name(self.fn)
        return (f"<PendingFunction {self.name} args={len(self.args)} kwargs={sorted(self.kwargs)}, not run: "
                f"`>> pool` runs it on a pool, {short}.local(...) here>")

    # -- used where its result was meant: say how to run it ------------------------------------
    def _not_run(self, what: str) -> DispatchError:
        return DispatchError(_not_run_message(self, what))

    def __getattr__(self, name: str) -> Any:  # only for attributes a PendingFunction lacks
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # protocol probes (numpy, pickle, copy): a plain "no"
        raise AttributeError(_not_run_message(self, f"read its attribute .{name}"))

    def __bool__(self) -> bool:
        return True  # defined, or len() below would be asked

    def __len__(self) -> int:
        raise self._not_run("take its len()")

    def __iter__(self) -> Iterator[Any]:
        raise self._not_run("iterate over it (or unpack it)")

    def __getitem__(self, key: Any) -> Any:
        raise self._not_run(f"index it ([{key!r}])")

    def __int__(self) -> int:
        raise self._not_run("convert it to int")

    def __float__(self) -> float:
        raise self._not_run("convert it to float")

    def __index__(self) -> int:
        raise self._not_run("use it as an integer")

    def _arith(self, other: Any) -> Any:
        raise self._not_run("compute with it")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _arith
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _arith
    __pow__ = __rpow__ = __lt__ = __le__ = __ge__ = _arith


def _short_name(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or "fn")


def _not_run_message(pending: PendingFunction[Any], what: str) -> str:
    short = _short_name(pending.fn)
    return (
        f"{short}(...) was not run, so there is no result to {what}: calling a @sky.function "
        f"function only captures the call. Run it on a pool with `{short}(...) >> pool` (`@ pool` "
        f"on every node, `> pool` for a Future), or here and now with {short}.local(...)."
    )


@final
class ActivePool(StandsForActivePool):
    """``sky.sky``: the active pool as a dispatch target, like the module itself.

    The reference project exports this singleton, so code written for it dispatches with
    ``f() >> sky.sky`` (``@``, ``>`` and groups too); here that is the same as ``f() >> sky``:
    the pool of the enclosing ``with sky.Compute(...)`` block."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "sky.sky (the active pool)"

    def __reduce__(self) -> str:  # one object: a task that references it unpickles the same one
        return "sky"


sky: Final = ActivePool()
"""The active pool, for ``f() >> sky.sky`` as in the reference project (the same as ``>> sky``)."""


def _and_error(other: Any) -> str:
    return (
        f"`&` joins pending functions, got a {type(other).__name__} on the right. Note that `>>` "
        f"binds tighter than `&`: write `(a() & b()) >> pool`, or sky.gather(a(), b()) >> pool."
    )


@dataclass(frozen=True, slots=True, eq=False)
class PendingFunctionGroup:
    """Pending functions that run in parallel; only ``>>`` dispatches a group.

    ``timeout``: seconds each of its functions may take (None: each keeps its own); set, it is
    every function's timeout, including those joined to the group later with ``&``."""

    items: tuple[PendingFunction[Any], ...]
    stream: bool = False
    ordered: bool = True
    timeout: float | None = None

    def __post_init__(self) -> None:
        timeout = _check_timeout(self.timeout)
        object.__setattr__(self, "timeout", timeout)
        if timeout is not None:  # the pool reads each function's own timeout
            object.__setattr__(self, "items", tuple(replace(p, timeout=timeout) for p in self.items))

    def __and__(self, other: Any) -> PendingFunctionGroup:
        if isinstance(other, PendingFunction):
            return PendingFunctionGroup((*self.items, other), self.stream, self.ordered, self.timeout)
        if isinstance(other, PendingFunctionGroup):
            return PendingFunctionGroup((*self.items, *other.items), self.stream, self.ordered,
                                        self.timeout if self.timeout is not None else other.timeout)
        raise DispatchError(_and_error(other))

    def __rshift__(self, target: Any) -> tuple[Any, ...] | Iterator[Any]:
        return resolve_pool(target, ">>").run_parallel(self)

    def __matmul__(self, target: Any) -> Any:
        raise DispatchError(
            "`@` (broadcast) does not apply to a group: broadcast each function on its own "
            "(`f() @ pool`), or run the group once with `group >> pool`."
        )

    def __gt__(self, target: Any) -> Any:
        raise DispatchError(
            "`>` (async) does not apply to a group: dispatch each function with `f() > pool` "
            "and collect the futures, or stream the group with sky.gather(..., stream=True) >> pool."
        )

    def __len__(self) -> int:
        return len(self.items)

    def with_timeout(self, seconds: float) -> PendingFunctionGroup:
        """The same group with ``seconds`` as its ``timeout``: the timeout of each of its functions."""
        return replace(self, timeout=_check_timeout(seconds))


def gather(*pendings: PendingFunction[Any], stream: bool = False, ordered: bool = True) -> PendingFunctionGroup:
    """A parallel group; with ``stream=True`` dispatching yields results as they complete."""
    for p in pendings:
        if not isinstance(p, PendingFunction):
            raise DispatchError(
                f"sky.gather() takes pending functions (calls of @sky.function functions), got a "
                f"{type(p).__name__}. Did you call a plain function instead of a @sky.function one?"
            )
    return PendingFunctionGroup(tuple(pendings), stream=stream, ordered=ordered)


class RemoteFunction(Generic[P, T]):
    """What ``@sky.function`` returns: calling it captures a PendingFunction."""

    fn: Callable[P, T]

    def __init__(self, fn: Callable[P, T], *, timeout: float | None = None) -> None:
        if isinstance(fn, RemoteFunction):
            fn = fn.fn
        if not callable(fn):
            raise ConfigError(f"@sky.function needs a function, got {fn!r}.")
        functools.update_wrapper(self, fn)  # first: it copies fn.__dict__ over ours
        self.fn = fn
        self.timeout = _check_timeout(timeout)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> PendingFunction[T]:
        if _context.on_node():
            # Inside a task a call is a plain call: helpers marked @sky.function for the
            # client run where the task runs (there is no pool to dispatch to from a node).
            return self.fn(*args, **kwargs)  # type: ignore[return-value]
        return PendingFunction(self.fn, args, kwargs, self.timeout)

    def local(self, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the function here, now, without a pool (``f.local(x)`` is ``f(x)`` undecorated)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<skyward function {getattr(self.fn, '__qualname__', self.fn)}>"


@overload
def function(fn: Callable[P, T], *, timeout: float | None = None) -> RemoteFunction[P, T]: ...
@overload
def function(fn: None = None, *, timeout: float | None = None) -> Callable[[Callable[P, T]], RemoteFunction[P, T]]: ...


def function(fn: Callable[P, T] | None = None, *, timeout: float | None = None) -> Any:
    """Mark a function for remote execution; bare (``@sky.function``) or with ``timeout=``."""
    _check_timeout(timeout)
    if fn is None:
        return lambda f: RemoteFunction(f, timeout=timeout)
    return RemoteFunction(fn, timeout=timeout)


def unwrap(fn: Any) -> Callable[..., Any]:
    """The plain function behind a @sky.function (pool.map accepts both)."""
    return fn.fn if isinstance(fn, RemoteFunction) else fn
