"""The node side of plugins, inside one worker process: around_app, around_process, decorate.

* ``around_app(info)`` hooks are entered once per worker process, in plugin order, when the
  worker starts (before its first task: a rendezvous such as torch's must see every rank
  join even if only one node ever gets a task), and exited in reverse when it stops. The
  registry below makes entering idempotent: a hook already entered in this process is not
  entered again.
* ``around_process(info)`` hooks are entered once per process of the process executor, on
  its first task, after the around_app hooks; exited in reverse, before them.
* ``decorate(fn)`` hooks wrap every call: the first plugin listed is the outermost wrapper.

A hook that fails makes every task of this worker fail with ``PluginError`` (naming the
plugin and the node) instead of a worker that dies and is restarted in a loop.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from skyward.errors import PluginError

# (position, plugin name) -> the ExitStack holding that plugin's entered around_app context.
_entered: dict[tuple[int, str], ExitStack] = {}


class NodePlugins:
    def __init__(self, plugins: list[Any], process_executor: bool) -> None:
        self.plugins = plugins
        self.process_executor = process_executor
        self.error: PluginError | None = None
        self._process_stack: ExitStack | None = None
        self._process_lock = threading.Lock()
        decorators = [p.decorate for p in plugins if p.decorate is not None]
        self._decorators = decorators

    def enter_app(self, info: Any) -> None:
        for position, p in enumerate(self.plugins):
            if p.around_app is None or (position, p.name) in _entered:
                continue
            stack = ExitStack()
            try:
                stack.enter_context(p.around_app(info))
            except BaseException as exc:
                stack.close()
                self.error = _failed(p.name, "around_app", info, exc)
                return
            _entered[(position, p.name)] = stack

    def enter_process(self, info: Any) -> None:
        """around_process hooks, on the first task of a process-executor worker."""
        if not self.process_executor or self._process_stack is not None:
            return
        with self._process_lock:
            if self._process_stack is not None:
                return
            stack = ExitStack()
            for p in self.plugins:
                if p.around_process is None:
                    continue
                try:
                    stack.enter_context(p.around_process(info))
                except BaseException as exc:
                    self.error = _failed(p.name, "around_process", info, exc)
                    break
            self._process_stack = stack

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if not self._decorators:
            return fn
        return functools.reduce(lambda f, d: d(f), reversed(self._decorators), fn)

    def exit(self) -> None:
        """Exit around_process, then around_app hooks, each in reverse order of entry."""
        if self._process_stack is not None:
            stack, self._process_stack = self._process_stack, None
            _close_quietly(stack)
        for key in sorted(_entered, reverse=True):
            _close_quietly(_entered.pop(key))


def _close_quietly(stack: ExitStack) -> None:
    try:
        stack.close()
    except BaseException as exc:  # the worker is stopping: say so, keep stopping
        import sys

        print(f"skyward: a plugin hook failed while exiting: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def _failed(name: str, hook: str, info: Any, exc: BaseException) -> PluginError:
    where = f"node {getattr(info, 'node', '?')} (worker {getattr(info, 'worker', 0)})"
    err = PluginError(
        f"plugin {name!r}: its {hook} hook failed on {where} with {type(exc).__name__}: {exc}. "
        f"Tasks on this worker cannot run; fix the cause (a missing package: add it with "
        f"Image(pip=[...])) and open the pool again."
    )
    err.__cause__ = exc
    return err
