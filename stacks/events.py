"""Pulumi engine events as skyward events.

Each resource step becomes a ResourceChanged (started, then done or failed), engine
diagnostics become Log or Error events, and the summary one Log line, so the console and the
pool's log show what the stack is doing while ``up`` runs.
"""

from __future__ import annotations

from typing import Any

from skyward.observe import events as ev


def resource_name(urn: str) -> str:
    """``urn:pulumi:stack::project::aws:ec2/instance:Instance::node-0`` -> ``node-0 (aws:ec2/instance:Instance)``."""
    parts = urn.split("::")
    if len(parts) < 4:
        return urn
    kind = parts[2].rsplit("$", 1)[-1]
    return f"{parts[3]} ({kind})"


def translate(pool: str, event: Any) -> ev.Event | None:
    """The skyward event for one pulumi.automation EngineEvent (None: nothing worth showing)."""
    for attr, status in (("resource_pre_event", "started"), ("res_outputs_event", "done"),
                         ("res_op_failed_event", "failed")):
        step = getattr(event, attr, None)
        if step is None:
            continue
        meta = step.metadata
        op = getattr(meta.op, "value", str(meta.op))
        if op == "same" or meta.type == "pulumi:pulumi:Stack" or getattr(step, "planning", False):
            return None
        return ev.ResourceChanged(pool=pool, resource=resource_name(meta.urn), operation=op, status=status)
    diag = getattr(event, "diagnostic_event", None)
    if diag is not None:
        message = diag.message.strip()
        if not message:
            return None
        if diag.severity == "error":
            return ev.Error(pool=pool, message=f"stack: {message}")
        level = "WARNING" if diag.severity == "warning" else "DEBUG"
        return ev.Log(pool=pool, level=level, message=f"stack: {message}")
    summary = getattr(event, "summary_event", None)
    if summary is not None:
        changes = ", ".join(
            f"{n} {getattr(op, 'value', op)}" for op, n in sorted(summary.resource_changes.items(), key=str)
            if getattr(op, "value", op) != "same" and n
        )
        return ev.Log(
            pool=pool, level="INFO",
            message=f"stack: {changes or 'no changes'} in {summary.duration_seconds}s",
        )
    return None
