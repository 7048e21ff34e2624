"""OpenTelemetry traces of a pool: its life, its phases, and one span per task.

Asked for by the standard ``OTEL_*`` variables (``bootstrap/otel.py`` reads them); without them
``Pool`` never builds a :class:`PoolTracer` and ``opentelemetry`` is never imported.

The pool's span starts when the pool is requested, in the caller's context (a span the
application has open becomes its parent), and ends when the pool is destroyed or detached.
Phases come from the pool's events, with the times the events carry: ``provision`` (request to
provisioned), ``stack up``/``stack destroy`` (a cloud pool's Pulumi operations),
``bootstrap node N`` with one child per bootstrap phase, and ``ready`` (request to ready). Tasks
are spans the dispatcher opens itself (``task``), since their context must exist before the task
is sent: its ``traceparent`` travels to the node with the task, where spans the function opens
join this trace. A map's chunks are children of the map's span.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward.bootstrap import otel

from . import events as ev

log = logging.getLogger("skyward.observe.tracing")


def enabled() -> bool:
    return otel.wanted()


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class TaskSpan:
    """One task's span, from dispatch to result; ``end`` records what came back."""

    __slots__ = ("span", "traceparent")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.traceparent = otel.traceparent(span)

    def end(self, ok: bool, sent: int, received: int, outcome: str | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        span.set_attribute("skyward.task.bytes_sent", sent)
        span.set_attribute("skyward.task.bytes_received", received)
        span.set_attribute("skyward.task.outcome", outcome or ("ok" if ok else "error"))
        if not ok:
            span.set_status(Status(StatusCode.ERROR))
        span.end()


class PoolTracer:
    """The spans of one pool; fed by its events, and by the dispatcher for tasks."""

    def __init__(self, pool_id: str, name: str | None, provider: str, nodes: int) -> None:
        from opentelemetry import context, trace

        self.pool_id = pool_id
        self.tracer = otel.provider().get_tracer("skyward")
        self.parent = context.get_current()  # the application's span around the pool, if any
        self.span = self.tracer.start_span(
            f"pool {name or pool_id}", self.parent,
            attributes={"skyward.pool.id": pool_id, "skyward.pool.name": name or "",
                        "skyward.provider": provider, "skyward.pool.nodes": nodes})
        self.ctx = trace.set_span_in_context(self.span)
        self.started = time.time()
        self.lock = threading.Lock()
        self.phases: dict[str, Any] = {}  # open phase spans by key
        self.batches: dict[int, Any] = {}  # open map/gather spans by batch id
        self.unsubscribe: Callable[[], None] = ev.bus.subscribe(self._on_event, pool_id)

    # -- tasks (called by the dispatcher, in the dispatching thread) ---------------------------
    def task(self, name: str, node: int, batch: int | None, attempt: int = 0) -> TaskSpan:
        from opentelemetry import trace

        parent: Any = self.ctx
        if batch is not None:
            parent = trace.set_span_in_context(self._batch(batch, name))
        else:
            # A span the application opened inside this pool's trace (a training step around
            # a few calls) is a better parent than the pool itself.
            current = trace.get_current_span().get_span_context()
            if current.is_valid and current.trace_id == self.span.get_span_context().trace_id:
                parent = None
        span = self.tracer.start_span(
            f"task {name}", parent, kind=trace.SpanKind.CLIENT,
            attributes={"skyward.function": name, "skyward.node": node, "skyward.task.retry": attempt,
                        "skyward.pool.id": self.pool_id})
        return TaskSpan(span)

    def _batch(self, batch: int, name: str, kind: str = "batch", start: float | None = None) -> Any:
        with self.lock:
            span = self.batches.get(batch)
            if span is None:
                span = self.batches[batch] = self.tracer.start_span(
                    f"{kind} {name}", self.ctx, start_time=None if start is None else _ns(start),
                    attributes={"skyward.function": name, "skyward.batch": batch})
            return span

    # -- everything else, from the pool's events -------------------------------------------------
    def _open(self, key: str, name: str, start: float, parent: Any = None, **attrs: Any) -> Any:
        if key not in self.phases:
            self.phases[key] = self.tracer.start_span(name, parent or self.ctx, start_time=_ns(start),
                                                      attributes=attrs)
        return self.phases[key]

    def _close(self, key: str, end: float, ok: bool = True) -> None:
        span = self.phases.pop(key, None)
        if span is not None:
            if not ok:
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=_ns(end))

    def _on_event(self, e: ev.Event) -> None:
        from opentelemetry import trace

        t = e.time
        if isinstance(e, ev.ClusterRequested):
            self._open("provision", "provision", t)
            self._open("ready", "ready", t)
        elif isinstance(e, ev.ClusterProvisioned):
            self._close("provision", t)
        elif isinstance(e, ev.InstanceProvisioned):  # reachable: its bootstrap starts
            self._open(f"bootstrap {e.node}", f"bootstrap node {e.node}", t, **{"skyward.node": e.node,
                       "skyward.node.hostname": e.hostname})
        elif isinstance(e, ev.BootstrapPhase):
            if e.node < 0:  # this machine's work for every node (the wheelhouse)
                key, title = "bootstrap", "bootstrap (this machine)"
            else:
                key, title = f"bootstrap {e.node}", f"bootstrap node {e.node}"
            node_span = self._open(key, title, t, **({"skyward.node": e.node} if e.node >= 0 else {}))
            phase_key = f"{key}/{e.phase}"
            if e.status == "started":
                self._open(phase_key, e.phase, t, trace.set_span_in_context(node_span))
            else:
                start = t - (e.seconds or 0.0)
                if phase_key not in self.phases:
                    self._open(phase_key, e.phase, start, trace.set_span_in_context(node_span))
                self.phases[phase_key].set_attribute("skyward.bootstrap.status", e.status)
                self._close(phase_key, t, ok=e.status != "failed")
                if e.node < 0 and e.phase == "wheelhouse":
                    self._close(key, t)
        elif isinstance(e, ev.InstanceBootstrapped):
            self._close(f"bootstrap {e.node}", t)
        elif isinstance(e, ev.ResourceChanged):
            # A cloud pool's stack: its resource operations under "stack up" / "stack destroy".
            key = "stack destroy" if e.operation in ("delete", "destroy", "delete-replaced") else "stack up"
            stack = self._open(key, key, t)
            stack.add_event(f"{e.operation} {e.resource}: {e.status}", timestamp=_ns(t))
            stack.set_attribute("skyward.stack.end", t)
        elif isinstance(e, ev.ClusterReady):
            self._close("provision", t)
            self._close_stack("stack up")
            self._close("ready", t)
            self.span.set_attribute("skyward.pool.ready_seconds", e.seconds)
        elif isinstance(e, ev.BatchStarted):  # its first task may have opened it already
            self._batch(e.batch, e.name, e.kind, start=t).update_name(f"{e.kind} {e.name}")
        elif isinstance(e, ev.BatchFinished):
            with self.lock:
                span = self.batches.pop(e.batch, None)
            if span is not None:
                span.set_attribute("skyward.batch.done", e.done)
                span.set_attribute("skyward.batch.total", e.total)
                if not e.ok:
                    from opentelemetry.trace import Status, StatusCode

                    span.set_status(Status(StatusCode.ERROR))
                span.end(end_time=_ns(t))
        elif isinstance(e, ev.InstanceLost):
            self.span.add_event(f"node {e.node} lost: {e.reason}", timestamp=_ns(t))
        elif isinstance(e, ev.InstanceReplaced):
            self.span.add_event(f"node {e.node} replaced by node {e.new_node}", timestamp=_ns(t))
        elif isinstance(e, ev.Error):
            self.span.add_event("error", {"message": e.message}, timestamp=_ns(t))
        elif isinstance(e, ev.ClusterDestroyed | ev.ClusterDetached):
            self.end(t, detached=isinstance(e, ev.ClusterDetached))

    def _close_stack(self, key: str) -> None:
        span = self.phases.get(key)
        if span is not None:
            end = getattr(span, "attributes", {}).get("skyward.stack.end")
            self._close(key, float(end) if end is not None else time.time())

    def end(self, at: float | None = None, detached: bool = False) -> None:
        at = time.time() if at is None else at
        self.unsubscribe()
        for stack in ("stack up", "stack destroy"):  # up again after ready: a healing update
            self._close_stack(stack)
        for key in list(self.phases):
            self._close(key, at, ok=False)  # never finished: the pool ended first
        with self.lock:
            batches, self.batches = list(self.batches.values()), {}
        for span in batches:
            span.end(end_time=_ns(at))
        self.span.set_attribute("skyward.pool.detached", detached)
        self.span.end(end_time=_ns(at))
        try:
            otel.flush()
        except Exception:  # an unreachable collector must not fail the pool's end
            log.warning("exporting the pool's spans failed", exc_info=True)


def start(pool_id: str, name: str | None, provider: str, nodes: int) -> PoolTracer | None:
    """A tracer for a pool being requested, or None (tracing not wanted, or it cannot start:
    that is logged, and the pool runs untraced)."""
    if not otel.wanted():
        return None
    try:
        return PoolTracer(pool_id, name, provider, nodes)
    except ImportError as exc:
        log.warning("OTEL_* variables ask for traces but %s; install skyward[otel] "
                    "(opentelemetry-sdk and the OTLP HTTP exporter). The pool runs untraced.", exc)
        return None
