"""The one error hierarchy. Every error skyward raises on purpose derives from SkywardError.

Messages follow one pattern: the value that was wrong, the rule it broke, and what to do next.
"""

from __future__ import annotations


class SkywardError(Exception):
    """Base of every error raised by skyward itself."""


class ConfigError(SkywardError, ValueError):
    """A spec, option or argument is invalid."""


class AcceleratorError(ConfigError):
    """An accelerator name or count is not known or not valid."""


class NoActivePoolError(SkywardError, RuntimeError):
    """A dispatch or runtime helper needs a pool and none is active."""


class DispatchError(SkywardError, TypeError):
    """An operator was used on something it does not apply to."""


class SerializationError(SkywardError, TypeError):
    """A function, argument or result could not be pickled or unpickled."""


class ProviderError(SkywardError, RuntimeError):
    """A provider could not create, reach or destroy nodes."""


class PoolClosedError(SkywardError, RuntimeError):
    """The pool was used after it was closed."""


class PoolBusyError(SkywardError, RuntimeError):
    """Another skyward command is creating, changing or destroying this named pool right now."""


class PoolExistsError(SkywardError, RuntimeError):
    """A named pool of that name is already running."""


class PoolNotFoundError(SkywardError, LookupError):
    """No named pool of that name is registered."""


class NodeLostError(SkywardError, RuntimeError):
    """The connection to a node's agent was lost while a task was running."""


class WorkerDiedError(SkywardError, RuntimeError):
    """The worker process running a task exited before returning a result."""


class TaskTimeoutError(SkywardError, TimeoutError):
    """A task ran longer than its timeout and was cancelled on the node."""


class TaskCancelledError(SkywardError, RuntimeError):
    """A task was cancelled before it started (a joblib batch after an abort)."""


class PluginError(SkywardError, RuntimeError):
    """A plugin hook failed, on the client or on a node."""


class RemoteError(SkywardError, RuntimeError):
    """A task raised an exception whose type could not be rebuilt on the client."""

    def __init__(self, type_name: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback


class ProtocolError(SkywardError, RuntimeError):
    """A peer sent a frame this side cannot understand (or a wrong token)."""


class RemoteTraceback(Exception):
    """Carries the traceback text of an exception raised on a node (set as ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n--- remote traceback ---\n" + self.text
