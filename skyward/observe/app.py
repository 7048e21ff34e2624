"""sky.App: one console for a whole program, however many pools it opens.

    with sky.App(console=True):
        with sky.Compute(nodes=2) as a, sky.Compute(nodes=1) as b:
            ...

Inside the block every pool reports to the App's console (a node line is ``<pool>:<node>``)
instead of opening its own; outside it, each pool has its own console as ``Options.console``
says. Leaving the block stops the console; pools still open keep running, silently.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

from ..errors import ConfigError
from . import console as _console

if TYPE_CHECKING:
    from ..spec import ConsoleMode

_current: contextvars.ContextVar[App | None] = contextvars.ContextVar("skyward_app", default=None)


def current() -> App | None:
    """The App whose ``with`` block this thread is in (None outside one)."""
    app = _current.get()
    return app if app is not None and app.is_active else None


class App:
    """The console as a context manager: ``console`` is True (rich on a terminal, log lines
    otherwise), ``"rich"``, ``"minimal"``, ``"log"``, or False / ``"silent"``."""

    def __init__(self, *, console: bool | ConsoleMode = True) -> None:
        if console not in (True, False, "rich", "minimal", "log", "silent"):
            raise ConfigError(
                f"App(console={console!r}) is not valid: use True, False, 'rich', 'minimal', 'log' or 'silent'."
            )
        self.mode = _console.resolve(console)
        self._view: _console.Console | None = None
        self._token: contextvars.Token[App | None] | None = None

    @property
    def is_active(self) -> bool:
        return self._view is not None

    def __enter__(self) -> App:
        if self._view is not None:
            raise ConfigError("this sky.App is already entered; use one `with` block per App.")
        self._view = _console.Console(self.mode, None, "skyward").start()
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        view, self._view = self._view, None
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        if view is not None:
            view.stop()


__all__ = ["App"]
