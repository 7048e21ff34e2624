"""Output control for tasks: sky.stdout(only=), sky.stderr(only=), sky.silent, sky.redirect_output.

On a node, sys.stdout/sys.stderr are the worker's task streams, which consult the context
variables below per task, so filters on one task never affect another running beside it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar

from skyward.errors import ConfigError

from . import context

F = TypeVar("F", bound=Callable[..., Any])
Only = Literal["head"] | Callable[[Any], bool]

STDOUT, STDERR = 1, 2


def _predicate(only: Only) -> Callable[[], bool]:
    if only != "head" and not callable(only):
        raise ConfigError(
            f"only={only!r} is not valid: pass 'head' or a function taking an InstanceInfo and "
            f"returning True for the workers that should print (e.g. lambda i: i.node < 2)."
        )

    def keep() -> bool:
        from .info import instance_info  # pydantic loads on the node, not on the client

        info = instance_info()
        return info.is_head if only == "head" else bool(only(info))  # type: ignore[operator]

    return keep


def _filter(var: Any, only: Only) -> Callable[[F], F]:
    keep = _predicate(only)

    def decorate(fn: F) -> F:
        target = getattr(fn, "fn", fn)  # accept both orders of @sky.function and this

        @functools.wraps(target)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            token = var.set(not keep()) if context.on_node() else None
            try:
                return target(*args, **kwargs)
            finally:
                if token is not None:
                    var.reset(token)

        if target is not fn:  # decorated a RemoteFunction: rebuild it around the wrapper
            return type(fn)(wrapper, timeout=fn.timeout)  # type: ignore[attr-defined, no-any-return]
        return wrapper  # type: ignore[return-value]

    return decorate


def stdout(only: Only = "head") -> Callable[[F], F]:
    """Keep a task's stdout only on the workers selected by ``only``."""
    return _filter(context.suppress_stdout, only)


def stderr(only: Only = "head") -> Callable[[F], F]:
    """Keep a task's stderr only on the workers selected by ``only``."""
    return _filter(context.suppress_stderr, only)


def silent(fn: F) -> F:
    """Silence both streams of a task on every worker."""
    return stdout(lambda _i: False)(stderr(lambda _i: False)(fn))


class CallbackWriter(io.TextIOBase):
    """A text stream that hands every write to a callback."""

    def __init__(self, callback: Callable[[str], Any]) -> None:
        self._callback = callback

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if s:
            self._callback(s)
        return len(s)


@contextlib.contextmanager
def redirect_output(callback: Callable[[str], Any]) -> Iterator[tuple[CallbackWriter, CallbackWriter]]:
    """Route stdout and stderr written in the block to ``callback(text)``."""
    out, err = CallbackWriter(callback), CallbackWriter(callback)
    if getattr(sys.stdout, "skyward_task_stream", False):
        # On a node: per task, so tasks running beside this one keep their own output.
        token = context.redirect.set(lambda _stream, text: callback(text))
        try:
            yield out, err
        finally:
            context.redirect.reset(token)
        return
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err
