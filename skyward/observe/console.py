"""The console: a view of a pool's events on the terminal (Options.console).

* ``"rich"`` — a live panel: a line per node (state, tasks, CPU, memory) and a progress bar
  per map/gather, redrawn in place; task output scrolls above it.
* ``"log"`` — append-only ``HH:MM:SS message`` lines on stderr (chosen automatically when
  stderr is not a terminal, so logs and CI output stay readable).
* ``"minimal"`` — only when the pool is ready, errors, and when it is destroyed.
* ``"silent"`` — nothing (task output is still printed).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from . import events as ev
from .secrets import redact

REFRESH = 8  # redraws per second of the rich view
Mode = Literal["rich", "minimal", "log", "silent"]

_LINE_EVENTS: tuple[type[ev.Event], ...] = (
    ev.ClusterRequested, ev.ClusterProvisioned, ev.ClusterReady, ev.ClusterDestroyed, ev.ClusterDetached,
    ev.ClusterAsleep, ev.ClusterWoke, ev.JobQueued,
    ev.InstanceRequested, ev.InstanceProvisioned, ev.BootstrapPhase, ev.InstanceBootstrapped, ev.InstanceLost,
    ev.InstancePreempted, ev.InstanceReplaced, ev.InstanceDestroyed, ev.BatchStarted, ev.BatchFinished, ev.Error,
    ev.ShutdownRequested, ev.ShutdownCompleted,
    ev.EndpointReady, ev.EndpointUpdated, ev.EndpointClosed, ev.ReplicaLost, ev.ReplicaReady,
)


def resolve(option: bool | str) -> Mode:
    if option is False or option == "silent":
        return "silent"
    if option is True:
        return "rich" if _is_tty(sys.stderr) else "log"
    return option  # type: ignore[return-value]


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@dataclass
class _Node:
    state: str = "requested"
    host: str = ""
    running: int = 0
    done: int = 0
    failed: int = 0
    cpu: float | None = None
    memory: float | None = None


@dataclass
class _Batch:
    kind: str
    name: str
    total: int
    done: int = 0
    start: float = field(default_factory=time.monotonic)
    task_id: Any = None


class Console:
    """Subscribes to one pool's events (``pool=None``: every pool's, for sky.App) and renders
    them in the chosen mode."""

    def __init__(self, mode: Mode, pool: str | None, title: str) -> None:
        self.mode = mode
        self.pool = pool
        self.title = title
        self.nodes: dict[tuple[str, int], _Node] = {}
        self.batches: dict[int, _Batch] = {}
        self._lock = threading.Lock()
        self._live: Any = None
        self._progress: Any = None
        self._unsubscribe: Callable[[], None] | None = None
        self._phase = _Attaching()
        self._serving = _Serving()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Console:
        if self.mode == "silent":
            return self
        if self.mode == "rich":
            self._start_rich()
        # The rich view counts tasks and shows metrics; the line modes need only lifecycle and
        # batch events, so dispatch builds no per-task events for them.
        kinds = None if self.mode == "rich" else _LINE_EVENTS
        self._unsubscribe = ev.bus.subscribe(self._on_event, self.pool, kinds)
        return self

    def stop(self) -> None:
        if self._unsubscribe is None:
            return
        ev.bus.flush()
        self._unsubscribe()
        self._unsubscribe = None
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.stop()
            self._live = None

    # -- events ------------------------------------------------------------------------------
    def _on_event(self, event: ev.Event) -> None:
        with self._lock:
            self._apply(event)
        if isinstance(event, ev.Error) and event.raised:
            return  # the caller gets it as an exception: printing it too shows it twice
        if self.mode == "log" or (self.mode == "minimal" and self._minimal(event)):
            line = self._describe(event)
            if line:
                _print_line(line)

    def _apply(self, event: ev.Event) -> None:
        node = getattr(event, "node", None)
        where = event.pool if event.group is None else f"{event.pool}/{event.group}"  # a group's nodes: its own rows
        state = self.nodes.setdefault((where, node), _Node()) if isinstance(node, int) else None
        if isinstance(event, ev.JobQueued):  # the nodes a queued job brings: its state is theirs
            for index in event.nodes:
                waiting = self.nodes.setdefault((where, index), _Node())
                reason = f" ({event.reason})" if event.reason and event.reason != "None" else ""
                waiting.state = f"job {event.job} {event.state.lower()}{reason}"
        elif isinstance(event, ev.InstanceProvisioned) and state:
            state.state, state.host = "starting", event.hostname
        elif isinstance(event, ev.BootstrapPhase) and state:
            state.state = f"{event.phase} {event.status}"
        elif isinstance(event, ev.InstanceBootstrapped) and state:
            state.state = "ready"
        elif isinstance(event, ev.InstanceDestroyed) and state:
            state.state = "destroyed"
        elif isinstance(event, ev.ShutdownRequested):
            for (pool, _), each in self.nodes.items():
                if pool.split("/")[0] == event.pool and each.state != "destroyed":
                    each.state = "stopping"
        elif isinstance(event, ev.Error) and state:
            state.state = "lost"
        elif isinstance(event, ev.TaskStarted) and state:
            state.running += 1
        elif isinstance(event, ev.TaskCompleted) and state:
            state.running = max(0, state.running - 1)
            if event.ok:
                state.done += event.items
            else:
                state.failed += 1
            batch = self.batches.get(event.batch) if event.batch is not None else None
            if batch is not None:
                batch.done += event.items  # the bar catches up when the view is redrawn
        elif isinstance(event, ev.Metric) and state:
            if event.name == "cpu":
                state.cpu = event.value
            elif event.name == "memory":
                state.memory = event.value
        elif isinstance(event, ev.BatchStarted):
            batch = _Batch(event.kind, event.name, event.total)
            if self._progress is not None:
                batch.task_id = self._progress.add_task(f"{event.kind} {event.name}", total=event.total)
            self.batches[event.batch] = batch
        elif isinstance(event, ev.BatchFinished):
            batch = self.batches.get(event.batch)
            if batch is not None:
                batch.done = event.done

    @staticmethod
    def _minimal(event: ev.Event) -> bool:
        return isinstance(event, ev.ClusterReady | ev.Error | ev.ClusterDestroyed | ev.ClusterDetached
                          | ev.JobQueued | ev.InstanceLost | ev.InstanceReplaced | ev.ClusterAsleep | ev.ClusterWoke
                          | ev.EndpointReady | ev.ReplicaLost)

    def _describe(self, event: ev.Event) -> str | None:
        names = {k: f"{b.kind} {b.name}" for k, b in self.batches.items()}
        title = self.title if self.pool is not None else f"pool {event.pool}"
        line = describe(event, title, names, attached=self._phase.attaching(event),
                        back=self._serving.back(event))
        if line and self.pool is None and line.startswith("node "):
            line = f"pool {event.pool} {line}"  # several pools share this view
        return line

    # -- rich --------------------------------------------------------------------------------
    def _start_rich(self) -> None:
        from rich.console import Console as RichConsole
        from rich.live import Live
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
            MofNCompleteColumn(), _RateColumn(), TimeElapsedColumn(),
        )
        self._live = Live(
            get_renderable=self._render,
            console=RichConsole(file=sys.stderr),
            refresh_per_second=REFRESH,
            transient=False,
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self._live.start()

    def _render(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"skyward {self.title}", title_justify="left", expand=False)
        for column in ("node", "host", "state", "running", "done", "cpu", "mem"):
            table.add_column(column)
        with self._lock:
            if self._progress is not None:
                for batch in self.batches.values():
                    self._progress.update(batch.task_id, completed=batch.done)
            for pool, index in sorted(self.nodes):
                n = self.nodes[(pool, index)]
                table.add_row(
                    (str(index) if "/" not in pool else f"{pool.split('/', 1)[1]} {index}") if self.pool is not None
                    else f"{pool}:{index}",
                    n.host, n.state, str(n.running), str(n.done + n.failed),
                    "" if n.cpu is None else f"{n.cpu:.0f}%",
                    "" if n.memory is None else f"{n.memory:.0f}%",
                )
        return Group(table, self._progress) if self.batches else table


def _RateColumn() -> Any:
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text("" if speed is None else rate(speed))

    return RateColumn()


def rate(per_second: float) -> str:
    """A throughput as people read it: ``1,200/s``, ``2.5/s``, or the time per item when
    that is under one a second (``2.0 s each``, ``3.5 min each``), never ``0/s``."""
    if per_second <= 0:
        return "-"
    if per_second >= 10:
        return f"{per_second:,.0f}/s"
    if per_second >= 1:
        return f"{per_second:.1f}/s"
    each = 1 / per_second
    if each < 60:
        return f"{each:.1f} s each"
    if each < 3600:
        return f"{each / 60:.1f} min each"
    return f"{each / 3600:.1f} h each"


def _print_line(line: str) -> None:
    try:
        sys.stderr.write(time.strftime("%H:%M:%S ") + redact(line) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _Attaching:
    """Tells a pool's first nodes that were started from those it attached to (a named pool
    that runs already): a pool that attaches never requests a cluster."""

    def __init__(self) -> None:
        self._requested: set[str] = set()
        self._ready: set[str] = set()

    def attaching(self, event: ev.Event) -> bool:
        if isinstance(event, ev.ClusterRequested):
            self._requested.add(event.pool)
        elif isinstance(event, ev.ClusterReady):
            self._ready.add(event.pool)
        return event.pool not in self._requested and event.pool not in self._ready


class _Serving:
    """Tells a replica that comes back after it was lost from one of an endpoint's first: only
    the first is worth a line (``EndpointReady`` already counts the others)."""

    def __init__(self) -> None:
        self._lost: set[tuple[str, str]] = set()

    def back(self, event: ev.Event) -> bool:
        if isinstance(event, ev.ReplicaLost):
            self._lost.add((event.pool, event.key))
        elif isinstance(event, ev.ReplicaReady) and (event.pool, event.key) in self._lost:
            self._lost.discard((event.pool, event.key))
            return True
        return False


def describe(event: ev.Event, title: str, batches: dict[int, str] | None = None,
             attached: bool = False, back: bool = False) -> str | None:
    """One line for the events worth a line (tasks and metrics are too many); shared by the
    log console and the log file. ``attached``: the pool attaches to nodes that run already;
    ``back``: a ``ReplicaReady`` is of a replica that was lost (the others get no line). In a
    pool of several groups a node's line names its group ("train node 0: ready")."""
    line = _describe(event, title, batches, attached, back)
    if line is not None and event.group is not None:
        if line.startswith("node "):
            return f"{event.group} {line}"
        if line.startswith(f"{title}: "):
            return f"{title} ({event.group}): {line[len(title) + 2:]}"
    return line


def _describe(event: ev.Event, title: str, batches: dict[int, str] | None,
              attached: bool, back: bool) -> str | None:
    if isinstance(event, ev.ClusterRequested):
        return f"{title}: requesting {event.nodes} {event.provider} node(s)"
    if isinstance(event, ev.JobQueued):
        reason = f" ({event.reason})" if event.reason and event.reason != "None" else ""
        which = f"node {event.nodes[0]}" if len(event.nodes) == 1 else f"{len(event.nodes)} node(s)"
        return (f"{title}: {event.scheduler} job {event.job} for {which}: {event.state}{reason}, "
                f"{event.seconds:.0f} s since it was submitted")
    if isinstance(event, ev.InstanceRequested):
        if event.replacing is not None:
            return f"node {event.replacing}: asking {event.provider} for a node in its place"
        return f"{title}: asking {event.provider} for {event.count} node(s)"
    if isinstance(event, ev.InstanceProvisioned):
        if attached:
            return f"node {event.node}: attached ({event.hostname}, {event.private_ip})"
        return f"node {event.node}: started on {event.hostname} ({event.private_ip})"
    if isinstance(event, ev.BootstrapPhase):
        took = f" in {event.seconds:.1f} s" if event.seconds is not None else ""
        where = "this machine" if event.node < 0 else f"node {event.node}"
        return f"{where}: {event.phase} {event.status}{took}"
    if isinstance(event, ev.InstanceBootstrapped):
        return f"node {event.node}: ready"
    if isinstance(event, ev.ClusterReady):
        return f"{title}: ready, {event.nodes} node(s) in {event.seconds:.2f} s"
    if isinstance(event, ev.BatchStarted):
        return f"{event.kind} {event.name}: {event.total} item(s)"
    if isinstance(event, ev.BatchFinished):
        label = (batches or {}).get(event.batch, f"batch {event.batch}")
        speed = rate(event.done / event.seconds) if event.seconds > 0 and event.done else "-"
        outcome = "done" if event.ok else "failed"
        return f"{label}: {outcome}, {event.done}/{event.total} in {event.seconds:.2f} s ({speed})"
    if isinstance(event, ev.Error):
        where = f"node {event.node}: " if event.node is not None else ""
        return f"{where}error: {event.message}"
    if isinstance(event, ev.InstanceLost):
        return f"node {event.node}: lost ({event.reason}); its tasks move to other nodes, a new node replaces it"
    if isinstance(event, ev.InstancePreempted):
        return f"node {event.node}: its spot instance was taken back ({event.reason})"
    if isinstance(event, ev.InstanceReplaced):
        return (f"node {event.node}: replaced by node {event.new_node} (rank {event.rank}) "
                f"in {event.seconds:.1f} s")
    if isinstance(event, ev.InstanceDestroyed):
        return f"node {event.node}: stopped"
    if isinstance(event, ev.ClusterAsleep):
        return f"{title}: asleep, no node after {event.idle_seconds:.0f} s idle; the next task wakes it"
    if isinstance(event, ev.ClusterWoke):
        return f"{title}: woke, {event.nodes} node(s) in {event.seconds:.2f} s"
    if isinstance(event, ev.ShutdownRequested):
        return f"{title}: shutting down {event.nodes} node(s)"
    if isinstance(event, ev.ShutdownCompleted):
        outcome = "shut down" if event.ok else "shut down with an error"
        return f"{title}: {outcome}, {event.nodes} node(s) in {event.seconds:.2f} s"
    if isinstance(event, ev.ClusterDestroyed):
        return f"{title}: destroyed"
    if isinstance(event, ev.ClusterDetached):
        return f"{title}: detached; its {event.nodes} node(s) keep running"
    if isinstance(event, ev.EndpointReady):
        return f"{title}: serving at {event.url}, {event.replicas} replica(s)"
    if isinstance(event, ev.EndpointUpdated):
        return f"{title}: {event.url} updated, {event.replicas} replica(s) restarted one by one with the new app"
    if isinstance(event, ev.EndpointClosed):
        return f"{title}: stopped serving at {event.url}"
    if isinstance(event, ev.ReplicaLost):
        return (f"node {event.node}: replica {event.key} lost ({event.reason}); the others take its "
                f"requests, it starts again once its node is ready")
    if isinstance(event, ev.ReplicaReady) and back:
        return f"node {event.node}: replica {event.key} back, ready in {event.seconds:.1f} s"
    return None


class EventLog:
    """Writes a pool's lifecycle events to the ``skyward.observe.events`` logger (the log file)."""

    def __init__(self, pool: str, title: str) -> None:
        self._title = title
        self._batches: dict[int, str] = {}
        self._phase = _Attaching()
        self._serving = _Serving()
        self._log = logging.getLogger("skyward.observe.events")
        # At DEBUG the file also keeps the tasks' output, prefixed by node.
        kinds = (*_LINE_EVENTS, ev.Log) if self._log.isEnabledFor(logging.DEBUG) else _LINE_EVENTS
        self._unsubscribe = ev.bus.subscribe(self._on_event, pool, kinds)

    def _on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.Log):
            for text in event.message.splitlines():
                self._log.debug("[node %s] %s", event.node, text)
            return
        if isinstance(event, ev.BatchStarted):
            self._batches[event.batch] = f"{event.kind} {event.name}"
        line = describe(event, self._title, self._batches, attached=self._phase.attaching(event),
                        back=self._serving.back(event))
        if line:
            # INFO even for errors: the console already shows them; this is the file's copy.
            self._log.info("%s", line)

    def close(self) -> None:
        self._unsubscribe()
