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


def _check_only(only: Only) -> None:
    if only != "head" and not callable(only):
        raise ConfigError(
            f"only={only!r} is not valid: pass 'head' or a function taking an InstanceInfo and "
            f"returning True for the workers that should print (e.g. lambda i: i.node < 2)."
        )


class _Filtered:
    """A task function whose stdout/stderr is kept only on some workers.

    A module-level class (not a closure) so that it pickles by reference, with the wrapped
    function and the predicate as its state.
    """

    def __init__(self, fn: Callable[..., Any], streams: tuple[str, ...], only: Only) -> None:
        functools.update_wrapper(self, fn)  # first: it copies fn.__dict__ over ours
        self.fn = fn
        self.streams = streams
        self.only = only

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not context.on_node():
            return self.fn(*args, **kwargs)
        from .info import instance_info  # pydantic loads on the node, not on the client

        info = instance_info()
        keep = info.is_head if self.only == "head" else bool(self.only(info))
        tokens = [(var, var.set(not keep)) for var in self._vars()]
        try:
            return self.fn(*args, **kwargs)
        finally:
            for var, token in reversed(tokens):
                var.reset(token)

    def _vars(self) -> list[Any]:
        return [context.suppress_stdout if s == "stdout" else context.suppress_stderr for s in self.streams]


def _filter(streams: tuple[str, ...], only: Only) -> Callable[[F], F]:
    _check_only(only)

    def decorate(fn: F) -> F:
        from skyward.core.function import RemoteFunction

        if isinstance(fn, RemoteFunction):  # accept both orders of @sky.function and this
            return RemoteFunction(_Filtered(fn.fn, streams, only), timeout=fn.timeout)  # type: ignore[return-value]
        return _Filtered(fn, streams, only)  # type: ignore[return-value]

    return decorate


def stdout(only: Only = "head") -> Callable[[F], F]:
    """Keep a task's stdout only on the workers selected by ``only``."""
    return _filter(("stdout",), only)


def stderr(only: Only = "head") -> Callable[[F], F]:
    """Keep a task's stderr only on the workers selected by ``only``."""
    return _filter(("stderr",), only)


def silent(fn: F) -> F:
    """Silence both streams of a task on every worker."""
    return _filter(("stdout", "stderr"), _never)(fn)


def _never(_info: Any) -> bool:
    return False


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
