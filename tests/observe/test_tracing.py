"""OpenTelemetry traces of a pool, received by a real OTLP/HTTP endpoint.

The programs run in subprocesses: the OTEL_* variables and the tracer provider are process-wide,
and a Local pool's nodes inherit the program's environment (so they export too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .otlp import Receiver, Span, receiver

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

PROGRAM = """
import json, sys
import skyward as sky

@sky.function
def work(x):
    from opentelemetry import trace

    with trace.get_tracer("user").start_as_current_span("inside work") as span:
        span.set_attribute("x", x)
    return x * 2

with sky.Compute(nodes=2, options=sky.Options(console="silent")) as pool:
    assert pool.map(work, range(4), chunksize=1) == [0, 2, 4, 6]
    assert work(10) >> pool == 20
print(json.dumps({"loaded": "opentelemetry" in sys.modules}))
"""


def _run(source: str, tmp_path: Path, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ.update(env, SKYWARD_HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], env=environ, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def _children(spans: list[Span], parent: Span) -> list[Span]:
    return [s for s in spans if s.parent == parent.span_id]


def test_a_two_node_map_is_one_trace_with_the_nodes_spans_inside(tmp_path: Path) -> None:
    with receiver() as otlp:
        out = _run(PROGRAM, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=otlp.url, OTEL_SERVICE_NAME="training")
        spans = _wait_spans(otlp)
    assert out["loaded"] is True
    (pool,) = [s for s in spans if s.name.startswith("pool ")]
    assert pool.parent == "" and pool.service == "training"
    assert pool.attributes["skyward.provider"] == "local" and pool.attributes["skyward.pool.nodes"] == 2
    assert {s.trace_id for s in spans} == {pool.trace_id}  # one trace, the nodes' spans included
    phases = {s.name for s in _children(spans, pool)}
    assert {"provision", "ready", "bootstrap node 0", "bootstrap node 1", "map work", "task work"} <= phases
    for s in spans:  # every span lies inside the pool's life
        assert pool.start <= s.start <= s.end <= pool.end, s
    (batch,) = [s for s in spans if s.name == "map work"]
    tasks = _children(spans, batch)
    assert len(tasks) == 4 and {t.name for t in tasks} == {"task work"}
    assert {t.attributes["skyward.node"] for t in tasks} == {0, 1}
    for t in tasks:
        assert t.attributes["skyward.task.outcome"] == "ok" and t.attributes["skyward.task.retry"] == 0
        assert t.attributes["skyward.task.bytes_sent"] > 0 and t.attributes["skyward.task.bytes_received"] > 0
        assert batch.start <= t.start <= t.end <= batch.end
    (single,) = [s for s in _children(spans, pool) if s.name == "task work"]
    # The spans the function opened on the nodes: children of their task's span, from the node's process.
    inside = [s for s in spans if s.name == "inside work"]
    assert len(inside) == 5
    by_id = {s.span_id: s for s in spans}
    assert {by_id[s.parent].name for s in inside} == {"task work"}
    assert sorted(s.attributes["x"] for s in inside) == [0, 1, 2, 3, 10]
    assert next(s for s in inside if s.parent == single.span_id).attributes["x"] == 10
    assert all(s.pid != pool.pid for s in inside)
    assert all(by_id[s.parent].start <= s.start <= s.end <= by_id[s.parent].end for s in inside)
    _draw(spans, pool)


def test_without_otel_variables_nothing_is_loaded_or_sent(tmp_path: Path) -> None:
    with receiver() as otlp:
        out = _run(PROGRAM.replace("from opentelemetry import trace", "return x * 2"), tmp_path)
        assert out["loaded"] is False
        assert otlp.spans == []


def test_a_span_the_application_holds_is_the_pools_parent(tmp_path: Path) -> None:
    source = """
    import json
    import skyward as sky
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # An application that traces already has its provider: skyward's spans go to it.
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)

    @sky.function
    def one():
        return 1

    with trace.get_tracer("app").start_as_current_span("training run"):
        with sky.Compute(nodes=1, options=sky.Options(console="silent")) as pool:
            with trace.get_tracer("app").start_as_current_span("epoch 1"):
                one() >> pool
    provider.shutdown()
    print(json.dumps({}))
    """
    with receiver() as otlp:
        _run(source, tmp_path, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=otlp.url + "/v1/traces")
        spans = _wait_spans(otlp, "training run")
    by_name = {s.name: s for s in spans}
    run, epoch, task = by_name["training run"], by_name["epoch 1"], by_name["task one"]
    pool = next(s for s in spans if s.name.startswith("pool "))
    assert pool.parent == run.span_id and epoch.parent == run.span_id
    assert task.parent == epoch.span_id  # a span opened inside the pool's trace parents its tasks


def _wait_spans(otlp: Receiver, last: str = "pool ") -> list[Span]:
    """The program exported before it exited; the receiver may still be parsing the last POST."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not otlp.named(last):
        time.sleep(0.05)
    with otlp.lock:
        return list(otlp.spans)


def _draw(spans: list[Span], pool: Span) -> None:
    """The trace as a tracing backend draws it (docs/images/trace.png), when matplotlib is here."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    by_id = {s.span_id: s for s in spans}

    def depth(s: Span) -> int:
        return 0 if s.parent not in by_id else 1 + depth(by_id[s.parent])

    def key(s: Span) -> tuple[int, ...]:
        chain = [s]
        while chain[-1].parent in by_id:
            chain.append(by_id[chain[-1].parent])
        return tuple(x.start for x in reversed(chain))

    rows = sorted(spans, key=key)
    t0 = pool.start
    colours = {"pool": "#4c72b0", "task": "#55a868", "inside": "#c44e52", "map": "#8172b2"}
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(rows) + 1))
    for i, s in enumerate(rows):
        start, width = (s.start - t0) / 1e6, max((s.end - s.start) / 1e6, 0.3)
        colour = colours.get(s.name.split()[0], "#dd8452")
        ax.barh(i, width, left=start, color=colour, height=0.7)
        node = s.attributes.get("skyward.node")
        label = "  " * depth(s) + s.name + (f"  (node {node})" if node is not None and s.name.startswith("task") else "")
        ax.text(-0.01, i, label, transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=8,
                family="monospace")
        ax.text(start + width, i, f" {(s.end - s.start) / 1e6:.1f} ms", va="center", fontsize=7, color="#555")
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the pool was requested")
    ax.set_title(f"one trace: {pool.name}, a 2-node map and one >> (service {pool.service})", fontsize=10)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.subplots_adjust(left=0.36, right=0.97, top=0.95, bottom=0.6 / (0.32 * len(rows) + 1))
    out = Path(os.environ.get("SKYWARD_TEST_ARTIFACTS") or Path(__file__).parents[1] / "artifacts") / "trace.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
