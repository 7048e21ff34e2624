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


class ProvisioningError(ProviderError):
    """Nodes for a pool could not be had: no offer fits, or they could not be created or prepared."""


class BootstrapError(ProvisioningError):
    """A command preparing a node failed: carries host, phase, command, exit code and output."""

    def __init__(self, *, host: str, phase: str, command: str, exit_code: int | None,
                 output: list[str], why: str = "") -> None:
        self.host, self.phase, self.command = host, phase, command
        self.exit_code, self.output = exit_code, list(output)
        what = why or f"exited with code {exit_code}"
        lines = command.strip().splitlines()
        shown = "\n".join("    " + line for line in lines[:12]) + ("\n    ..." if len(lines) > 12 else "")
        tail = "\n".join("    " + line for line in self.output) or "    (no output)"
        super().__init__(
            f"{host}: bootstrap phase {phase!r} {what}.\n  command:\n{shown}\n  last lines of output:\n"
            f"{tail}\nFix the Image setting this phase comes from (or the host), then open the pool again."
        )


class HostKeyError(ProviderError):
    """An SSH host showed a key other than the one recorded or expected for it."""


class PoolClosedError(SkywardError, RuntimeError):
    """The pool was used after it was closed."""


class InheritedPoolError(PoolClosedError):
    """A pool was used in a process forked from the one that opened it: it belongs to that process."""


class PoolStoppedError(PoolClosedError):
    """A named pool this program used was stopped from outside (``skyward down``): who, when."""


class PoolBusyError(SkywardError, RuntimeError):
    """Another skyward command is creating, changing or destroying this named pool right now."""


class PoolAsleepError(SkywardError, RuntimeError):
    """A named pool sleeps with no node, and the command needs a node that runs."""


class PoolExistsError(SkywardError, RuntimeError):
    """A named pool of that name is already running."""


class PoolNotFoundError(SkywardError, LookupError):
    """No named pool of that name is registered."""


class RecordError(SkywardError, LookupError):
    """A pool's record is missing, was changed since it was written, or cannot be reproduced."""


class NodeLostError(SkywardError, RuntimeError):
    """The connection to a node's agent was lost while a task was running."""


class WorkerDiedError(SkywardError, RuntimeError):
    """The worker process running a task exited before returning a result."""


class TaskTimeoutError(SkywardError, TimeoutError):
    """A task ran longer than its timeout and was cancelled on the node."""


class TaskCancelledError(SkywardError, RuntimeError):
    """A task was cancelled: its caller gave up on it (a joblib call aborted, a gather that failed)."""


class CollectionError(SkywardError, RuntimeError):
    """A distributed collection could not do what was asked (state lost, barrier broken...)."""


class CollectionTimeoutError(CollectionError, TimeoutError):
    """A collection operation waited past its timeout (lock.acquire, barrier.wait, queue.get with raise_on_timeout=True)."""


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


class NoOfferError(ProvisioningError):
    """No offer of any spec's provider satisfies it; the message lists the closest ones."""


# The reference API's spelling; one class, so either name catches it.
NoOffersError = NoOfferError


class PulumiNotFoundError(ProviderError):
    """A cloud pool needs the Pulumi CLI (or the pulumi SDK extra) and it is not installed."""


class StackError(ProviderError):
    """A Pulumi stack operation failed; carries the stack, the operation and the output's tail."""

    def __init__(self, message: str, *, stack: str = "", operation: str = "", output: str = "") -> None:
        super().__init__(message)
        self.stack, self.operation, self.output = stack, operation, output


class StackLockedError(StackError):
    """Another update holds the stack's lock, or a killed one left it behind."""


class PendingOperationsError(StackError):
    """An interrupted update left resource operations whose outcome the stack does not know."""


class RemoteTraceback(Exception):
    """Carries the traceback text of an exception raised on a node (set as ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n--- remote traceback ---\n" + self.text


class ServeError(SkywardError, RuntimeError):
    """A served app's replica could not start or serve (its node's traceback or last log lines
    say why), or an endpoint was asked for something it cannot do."""


class StorageError(SkywardError, RuntimeError):
    """An object-store operation failed: says the bucket, the key and what to check."""
