"""OpenTelemetry, where it is asked for: the standard ``OTEL_*`` variables decide.

Shared by the client (``skyward.observe.tracing``) and the nodes (the worker joins a task's
spans to the client's trace). Nothing here imports ``opentelemetry`` until tracing is wanted,
so a process without those variables never loads it: :func:`wanted` reads the environment only.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

_lock = threading.Lock()
_provider: Any = None


def wanted(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces to be exported: an OTLP endpoint is set
    (or ``OTEL_TRACES_EXPORTER`` names an exporter), and the SDK is not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def provider() -> Any:
    """The tracer provider spans go to: the application's own when it configured one (a real
    SDK provider set globally), else one skyward sets up once from the ``OTEL_*`` variables (the
    OTLP HTTP exporter, batched) and makes global, so the application's own spans go along."""
    global _provider
    with _lock:
        if _provider is not None:
            return _provider
        from opentelemetry import trace

        current = trace.get_tracer_provider()
        if hasattr(current, "add_span_processor"):  # the SDK's: configured by the application
            _provider = current
            return _provider
        import socket

        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # The client and each node are processes of one service: pid and host tell them apart.
        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; "skyward" unless named.
        attrs: dict[str, str | int] = {"process.pid": os.getpid(), "host.name": socket.gethostname()}
        if not os.environ.get("OTEL_SERVICE_NAME"):
            attrs["service.name"] = "skyward"
        made = TracerProvider(resource=Resource.create(attrs))
        made.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(made)
        _provider = trace.get_tracer_provider()
        atexit.register(flush)
        return _provider


def flush(timeout: float = 5.0) -> None:
    """Export what is batched now (a pool ends, a traced task ends on a node)."""
    if _provider is not None and hasattr(_provider, "force_flush"):
        _provider.force_flush(int(timeout * 1000))


def traceparent(span: Any) -> str:
    """The W3C ``traceparent`` of ``span``: what travels to the node with its task."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def attach(value: str) -> Any:
    """On a node: make the client's task span (``value``, a ``traceparent``) the current span,
    so the spans the task opens join the client's trace. None when this node cannot trace
    (no ``opentelemetry`` installed): the task runs the same, untraced."""
    try:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    if wanted():
        provider()  # export the node's spans (the OTEL_* variables of the node say where)
    ctx = TraceContextTextMapPropagator().extract({"traceparent": value})
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return context.attach(ctx)


def detach(token: Any) -> None:
    from opentelemetry import context

    context.detach(token)
    flush()  # the node may be stopped at any time after its last task: send its spans now
