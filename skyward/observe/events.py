"""Typed events: everything a pool does is reported here, and the console, the log file and
user callbacks are all views of this one stream.

Emitting is a queue append (nothing at all when nobody listens); a single dispatcher thread
delivers events to subscribers in the order they were emitted, so a slow subscriber delays
other subscribers, never task dispatch.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import MISSING, FrozenInstanceError, dataclass, field, replace
from typing import Any, Literal, TypeVar, dataclass_transform

log = logging.getLogger("skyward.observe.events")


# Every event class is a frozen dataclass whose repr, == and hash are Event's (repr=False,
# eq=False): written once here instead of generated and compiled for each of the classes
# below, which takes a third off what defining them costs every client's start. They behave
# as the generated ones do: the fields in order, equal only to the same class.
@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class Event:
    """Base of every event: the pool it belongs to, when it happened (epoch seconds) and, in a
    pool of several groups (skyward.core.group), the group of the node or part it is about
    (None in a pool of one group, and for what is the whole pool's)."""

    pool: str
    time: float = field(default_factory=time.time)
    group: str | None = None

    def _values(self) -> tuple[object, ...]:
        return tuple([getattr(self, name) for name in self.__dataclass_fields__])

    def __repr__(self) -> str:
        shown = ", ".join([f"{name}={getattr(self, name)!r}" for name in self.__dataclass_fields__
                           if name != "group" or self.group is not None])
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())


_E = TypeVar("_E", bound=type)


@dataclass_transform(kw_only_default=True, frozen_default=True)
def _event(cls: _E) -> _E:
    """``@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)``, made cheaply.

    The dataclass decorator compiles three functions for each class (__init__, __setattr__,
    __delattr__) and asks inspect for a signature to write its docstring: for these ~40 classes
    that is most of what importing this module costs, and every client pays it at start.
    Here the class gets the same fields, params, slots, docstring and pickling as the decorator
    gives; __setattr__/__delattr__ are shared; its __init__ is compiled the first time it is
    looked up (_LazyInit). dataclasses.fields, replace, is_dataclass and
    asdict see a dataclass.
    """
    base: Any = cls.__mro__[1]
    fields = dict(base.__dataclass_fields__)
    own = inspect.get_annotations(cls)
    for name, annotation in own.items():
        default = cls.__dict__.get(name, MISSING)
        f = field() if default is MISSING else field(default=default)
        f.name, f.type, f.kw_only = name, annotation, True
        f._field_type = _PLAIN_FIELD
        fields[name] = f
    namespace = {k: v for k, v in cls.__dict__.items() if k not in own and k not in ("__dict__", "__weakref__")}
    namespace.update(
        __slots__=tuple(own), __dataclass_fields__=fields, __dataclass_params__=_PARAMS, __match_args__=(),
        __setattr__=_frozen_setattr, __delattr__=_frozen_delattr,
        __getstate__=_GETSTATE, __setstate__=_SETSTATE, __init__=_LazyInit(),
    )
    made: Any = type(cls)(cls.__name__, cls.__bases__, namespace)
    made.__qualname__ = cls.__qualname__
    if not made.__doc__:  # as the decorator writes it: the class's signature
        made.__doc__ = made.__name__ + "(*, " + ", ".join(_shown(f) for f in fields.values()) + ")"
    return made


def _shown(f: Any) -> str:
    text = f"{f.name}: {f.type!r}"
    if f.default_factory is not MISSING:
        return text + " = <factory>"
    return text if f.default is MISSING else f"{text} = {f.default!r}"


def _frozen_setattr(self: Event, name: str, value: object) -> None:
    if "__dataclass_fields__" in type(self).__dict__ or name in self.__dataclass_fields__:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _frozen_delattr(self: Event, name: str) -> None:
    if "__dataclass_fields__" in type(self).__dict__ or name in self.__dataclass_fields__:
        raise FrozenInstanceError(f"cannot delete field {name!r}")
    object.__delattr__(self, name)


_frozen_setattr.__name__ = _frozen_setattr.__qualname__ = "__setattr__"
_frozen_delattr.__name__ = _frozen_delattr.__qualname__ = "__delattr__"
# What the decorator gave Event and gives each of its classes alike, taken from Event.
_PLAIN_FIELD = Event.__dataclass_fields__["pool"]._field_type  # type: ignore[attr-defined]
_PARAMS = Event.__dataclass_params__  # type: ignore[attr-defined]
_FACTORY = Event.__init__.__kwdefaults__["time"]  # type: ignore[index]  # "<factory>": call time.time
_GETSTATE = Event.__dict__["__getstate__"]
_SETSTATE = Event.__dict__["__setstate__"]


def _compile_init(cls: Any) -> Any:
    """The class's __init__ as the decorator writes it: its keyword-only fields in order, each
    set with object.__setattr__, ``time`` from time.time unless given."""
    fields = cls.__dataclass_fields__.values()
    names = [f.name for f in fields]
    lines = [f"def __init__(self, *, {', '.join(names)}):", "    if time is _FACTORY: time = _now()"]
    lines += [f"    _set(self, {name!r}, {name})" for name in names]
    scope = {"_FACTORY": _FACTORY, "_now": _now, "_set": object.__setattr__}
    exec("\n".join(lines), scope)
    init = scope["__init__"]
    init.__kwdefaults__ = {f.name: _FACTORY if f.default_factory is not MISSING else f.default
                           for f in fields if f.default is not MISSING or f.default_factory is not MISSING}
    init.__annotations__ = {**{f.name: f.type for f in fields}, "return": None}
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


class _LazyInit:
    """An event class's __init__ until it is first looked up (an instance made, inspect or help
    reading it): then compiled and put in its place, so a client pays only for the events it
    makes, never at import."""

    __slots__ = ("owner",)

    def __set_name__(self, owner: Any, name: str) -> None:
        self.owner = owner

    def __get__(self, obj: object, cls: type | None = None) -> Any:
        init = _compile_init(self.owner)
        self.owner.__init__ = init
        return init if obj is None else init.__get__(obj, cls)


_now = time.time


# -- cluster lifecycle --------------------------------------------------------------------------
@_event
class ClusterRequested(Event):
    provider: str
    nodes: int
    label: str | None = None  # the name a Session gave the pool (session.compute(..., name=...))


@_event
class ClusterProvisioned(Event):
    nodes: int


@_event
class ClusterReady(Event):
    nodes: int
    seconds: float  # from request to ready


@_event
class ClusterAsleep(Event):
    """A pool of ``Nodes(desired=0)`` stopped its last node (it sat idle for
    ``Options.autoscale_idle_timeout``): it costs nothing until its next task wakes it."""

    idle_seconds: float  # how long it had been idle (0 when a resize put it to sleep)


@_event
class ClusterWoke(Event):
    """A pool with no node got a task and started ``nodes`` node(s) for it."""

    nodes: int
    seconds: float  # from the task that woke it to a ready node


@_event
class ClusterDestroyed(Event):
    pass


@_event
class ClusterDetached(Event):
    """This client let go of a named pool; its nodes keep running for the next client."""

    nodes: int


@_event
class JobQueued(Event):
    """A scheduler's job for some of the pool's nodes (sky.Slurm) changed state or reason while
    the pool waits for it: ``state`` as the scheduler says it (PENDING, RUNNING, ...), ``reason``
    its own word for the wait (Priority, Resources, ...), ``nodes`` the pool's node indices the
    job brings, ``seconds`` since it was submitted."""

    job: str
    state: str
    reason: str = ""
    nodes: tuple[int, ...] = ()
    seconds: float = 0.0
    scheduler: str = "slurm"


# -- instances ----------------------------------------------------------------------------------
@_event
class InstanceRequested(Event):
    """Nodes asked of the provider: the pool's first ones, more for a resize or a wake, or one
    in place of a lost node (``replacing``: that node). Each that comes is an InstanceProvisioned."""

    provider: str
    count: int = 1
    replacing: int | None = None


@_event
class InstanceProvisioned(Event):
    node: int
    hostname: str
    private_ip: str


@_event
class BootstrapPhase(Event):
    node: int  # -1: work on this machine for every node (building the wheelhouse)
    phase: str
    status: Literal["started", "done", "failed", "skipped"]
    seconds: float | None = None


@_event
class InstanceBootstrapped(Event):
    node: int


@_event
class InstancePreempted(Event):
    """The provider says a lost node was a spot instance taken back (after InstanceLost)."""

    node: int
    reason: str = ""


@_event
class InstanceLost(Event):
    """The connection to a node's agent broke (host down, network cut, agent killed) or its
    health checks failed; its running tasks move to other nodes (Options.retry_on_interruption)
    and a replacement is started (InstanceReplaced)."""

    node: int
    reason: str


@_event
class InstanceReplaced(Event):
    """A new node (``new_node``) took the place and the rank of lost node ``node``;
    ``seconds``: from the loss to the new node being ready for tasks."""

    node: int
    reason: str = ""
    new_node: int = -1
    rank: int = -1
    seconds: float = 0.0


@_event
class InstanceDestroyed(Event):
    node: int


@_event
class ShutdownRequested(Event):
    """The pool's teardown began: its ``nodes`` are told to stop and the provider to destroy
    what it created (a pool that detaches, leaving its nodes running, has none)."""

    nodes: int


@_event
class ShutdownCompleted(Event):
    """The teardown that ShutdownRequested began is over (``ok``: the provider destroyed
    everything without an error), ``seconds`` after it began. ClusterDestroyed follows."""

    nodes: int
    seconds: float
    ok: bool = True


@_event
class ResourceChanged(Event):
    """A Pulumi resource operation of a cloud pool's stack."""

    resource: str
    operation: str
    status: str


# -- work ---------------------------------------------------------------------------------------
@_event
class BatchStarted(Event):
    """A map or gather began: ``total`` items under one ``batch`` id (for progress bars)."""

    batch: int
    kind: Literal["map", "gather", "joblib"]
    name: str
    total: int


@_event
class BatchFinished(Event):
    batch: int
    ok: bool
    done: int  # items that completed successfully
    total: int
    seconds: float


@_event
class TaskStarted(Event):
    """A task (or a map chunk of ``items`` items) was sent to ``node``."""

    task: int
    name: str
    node: int
    items: int = 1
    batch: int | None = None


@_event
class TaskCompleted(Event):
    task: int
    name: str
    node: int
    seconds: float
    ok: bool
    items: int = 1
    batch: int | None = None
    bytes_sent: int = 0  # the task's frame to the node (a Local pool's big buffers: their shm reference)
    bytes_received: int = 0  # its result's frame


# -- serving (pool.serve) -----------------------------------------------------------------------
@_event
class EndpointReady(Event):
    """An endpoint's first replica takes traffic at ``url`` (``replicas``: how many do now)."""

    url: str
    replicas: int


@_event
class EndpointUpdated(Event):
    """``endpoint.update(app)`` replaced its ``replicas`` one by one with the new app."""

    url: str
    replicas: int


@_event
class EndpointClosed(Event):
    url: str


@_event
class ReplicaReady(Event):
    """Replica ``key`` ("RANK.SLOT") on ``node`` takes traffic, ``seconds`` after it was started."""

    key: str
    node: int
    seconds: float


@_event
class ReplicaLost(Event):
    """Replica ``key`` on ``node`` stopped taking traffic (its node was lost, or it failed to
    start: ``reason``); the endpoint starts it again once its node's rank is ready."""

    key: str
    node: int
    reason: str


@_event
class EndpointStats(Event):
    """What an endpoint's router counted, emitted about once a second while it changes (the
    views' source: Prometheus, the dashboard). Counters are since the endpoint opened:
    ``statuses`` ((status, requests), ...), ``latency_buckets`` ((upper bound in seconds,
    cumulative requests), ...) and ``latency_sum`` (seconds); ``cold_waits``: requests that came
    when no replica was ready. ``replicas``: (key, node, state) of each replica now."""

    url: str
    replicas: tuple[tuple[str, int, str], ...]
    in_flight: int
    queued: int
    total: int
    statuses: tuple[tuple[int, int], ...]
    latency_buckets: tuple[tuple[float, int], ...]
    latency_sum: float
    cold_waits: int


# -- telemetry ----------------------------------------------------------------------------------
@_event
class Metric(Event):
    node: int
    name: str
    value: float
    unit: str = ""


@_event
class Log(Event):
    level: str
    message: str
    node: int | None = None


@_event
class Error(Event):
    message: str
    node: int | None = None
    raised: bool = False  # also raised to the caller, whose traceback shows it: no console line


Callback = Callable[[Event], None]


# Frequent events: delivered in bursts (at most ~50 ms late) instead of waking the event
# thread for each one, which would take the GIL from dispatch hundreds of times per map.
_BATCHED = (TaskStarted, TaskCompleted, Metric, Log)
_POLL = 0.05


class _Bus:
    """The process-wide event stream: subscribers see events of one pool or of all pools."""

    def __init__(self) -> None:
        # key -> (pool or None for all, event types or None for all, callback)
        self._subs: dict[int, tuple[str | None, tuple[type[Event], ...] | None, Callback]] = {}
        self._ids = itertools.count(1)
        self._pending: collections.deque[tuple[Event, list[Callback]]] = collections.deque()
        self._wake = threading.Event()
        self._idle = True  # the event thread sleeps until woken (no polling while quiet)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.task_ids = itertools.count(1)
        self.batch_ids = itertools.count(1)

    def wants(self, pool: str, kind: type[Event]) -> bool:
        """Whether anyone listens to this kind of event of this pool; callers skip building
        events nobody wants, which keeps task dispatch free of event costs when unobserved."""
        return any(
            (p is None or p == pool) and (k is None or issubclass(kind, k))
            for p, k, _ in list(self._subs.values())
        )

    def subscribe(
        self, callback: Callback, pool: str | None = None, kinds: tuple[type[Event], ...] | None = None
    ) -> Callable[[], None]:
        with self._lock:
            key = next(self._ids)
            self._subs[key] = (pool, kinds, callback)
            self._start()
        return lambda: self._subs.pop(key, None) and None

    def emit(self, event: Event) -> None:
        targets = [
            cb for p, k, cb in list(self._subs.values())
            if (p is None or p == event.pool) and (k is None or isinstance(event, k))
        ]
        if targets:
            if self._thread is None:  # subscriptions a forked child kept
                with self._lock:
                    self._start()
            self._pending.append((event, targets))
            if self._idle or not isinstance(event, _BATCHED) or len(self._pending) >= 1024:
                self._wake.set()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything emitted so far has been delivered (at most ``timeout`` s). On
        the event thread itself (a callback that closes a pool) it returns at once: the events
        behind the one being delivered cannot be delivered before it returns."""
        if self._thread is None or self._thread is threading.current_thread():
            return
        done = threading.Event()
        self._pending.append((Log(pool="", level="DEBUG", message="flush"), [lambda _e: done.set()]))
        self._wake.set()
        done.wait(timeout)

    def forked(self) -> None:
        """In a child just forked: the event thread did not come along and the events waiting
        for it are the parent's to deliver (delivering them here would show, write or post them
        twice). Subscriptions to one pool are the parent's views of its pools (console, log
        file, dashboard, named-pool trail): dropped. Subscriptions to every pool (``sky.subscribe``)
        stay: this process's own pools are theirs too; a new thread starts with their first event."""
        self._subs = {key: sub for key, sub in self._subs.items() if sub[0] is None}
        self._pending = collections.deque()
        self._wake = threading.Event()
        self._idle = True
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._thread = None

    def _start(self) -> None:
        """The event thread, once (call with the lock held)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._deliver, name="skyward-events", daemon=True)
            self._thread.start()

    def _deliver(self) -> None:
        while True:
            self._wake.wait(None if self._idle else _POLL)
            self._wake.clear()
            self._idle = not self._pending
            while self._pending:
                event, targets = self._pending.popleft()
                for cb in targets:
                    try:
                        cb(event)
                    except Exception:
                        log.exception("an event subscriber raised; it keeps receiving events")


bus = _Bus()
os.register_at_fork(after_in_child=bus.forked)


def emit(event: Event) -> None:
    """Emit a pool's event. An Error's message may quote a secret (Log events are built
    redacted), so it is redacted on its way out."""
    if isinstance(event, Error):
        from .secrets import redact

        event = replace(event, message=redact(event.message))
    bus.emit(event)


def subscribe(callback: Callback) -> Callable[[], None]:
    """Receive the events of every pool opened from now on; returns a function that stops it."""
    return bus.subscribe(callback)


def stream(pool: str | None = None, stop: Callable[[Event], bool] | None = None) -> Iterator[Event]:
    """Iterate over events as they happen (of one pool, or all); ends after ``stop(event)``."""
    q: queue.SimpleQueue[Event] = queue.SimpleQueue()
    unsubscribe = bus.subscribe(q.put, pool)
    try:
        while True:
            event = q.get()
            yield event
            if stop is not None and stop(event):
                return
    finally:
        unsubscribe()


__all__ = [
    "BatchFinished",
    "BatchStarted",
    "BootstrapPhase",
    "ClusterDestroyed",
    "ClusterProvisioned",
    "ClusterReady",
    "ClusterRequested",
    "EndpointClosed",
    "EndpointReady",
    "EndpointStats",
    "EndpointUpdated",
    "Error",
    "Event",
    "InstanceBootstrapped",
    "InstanceDestroyed",
    "InstancePreempted",
    "InstanceProvisioned",
    "InstanceReplaced",
    "InstanceRequested",
    "Log",
    "Metric",
    "ReplicaLost",
    "ReplicaReady",
    "ResourceChanged",
    "ShutdownCompleted",
    "ShutdownRequested",
    "TaskCompleted",
    "TaskStarted",
    "subscribe",
]
