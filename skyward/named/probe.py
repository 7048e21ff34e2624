"""A named pool's node health, as ``skyward status`` shows it.

A probe opens each node's agent connection (over SSH for SSH and cloud pools), reads the
agent's handshake (hostname, pid, Python, running tasks) and disconnects. Nodes are contacted
at most ``PARALLEL`` at a time, never one after the other.

Contacting a thousand nodes takes tens of seconds however it is spread, so the results are
kept beside the pool's record (``registry/NAME.probe``, with when they were taken and for which
pool id): a pool of more than ``LIVE_NODES`` nodes is shown from its last probe, with its age,
unless ``skyward status NAME --probe`` asks for a new one; a smaller pool is probed every time.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import SkywardError
from . import registry

LIVE_NODES = 64  # a pool this size or smaller is probed by every `skyward status`
PARALLEL = 32  # nodes contacted at once


def probe(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each node of a running pool's record, contacted now: ``{"index", "hostname",
    "private_ip", "reachable", "agent_pid", "python", "tasks"}`` or with an ``error``."""
    from skyward.bootstrap.channel import NodeChannel

    from .pools import provider_from

    description = record["cluster"]
    base = unknown(record)
    for b in base:
        b["reachable"] = False
    try:
        cluster = provider_from(record["config"]).attach(description)
        endpoints = cluster.start(len(description["nodes"]))  # SSH pools: PARALLEL at most at once too
    except SkywardError as exc:
        return [{**b, "error": str(exc)} for b in base]
    by_index = {b["index"]: b for b in base}
    for index, why in cluster.unreachable().items():  # each node judged on its own
        if index in by_index:
            by_index[index]["error"] = why

    def handshake(endpoint: Any) -> None:
        b = by_index[endpoint.index]
        try:
            ch = NodeChannel(endpoint.connect, node=endpoint.index, token=cluster.token,
                             ttl=float(record.get("ttl", 600)), on_output=lambda *_: None,
                             agent_id=endpoint.agent_id)
        except (OSError, SkywardError) as exc:
            b["error"] = str(exc)
            return
        facts = ch.facts
        ch.close()
        b.update(reachable=True, hostname=facts.get("hostname", b["hostname"]),
                 agent_pid=facts.get("pid"), python=facts.get("python"), tasks=facts.get("tasks"))

    try:
        if endpoints:
            with ThreadPoolExecutor(max_workers=min(PARALLEL, len(endpoints)), thread_name_prefix="skyward-probe") as ex:
                list(ex.map(handshake, endpoints))
    finally:
        cluster.detach()
    return base


def unknown(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each node of the record, its health not known."""
    return [{"index": n["index"], "hostname": n.get("hostname"), "private_ip": n.get("private_ip"),
             "reachable": None} for n in (record.get("cluster") or {}).get("nodes", [])]


def save(record: dict[str, Any], nodes: list[dict[str, Any]], at: float | None = None) -> None:
    """Keep a probe's results for the next `skyward status`."""
    registry.write_probe(record["name"], {"id": record.get("id"), "at": time.time() if at is None else at,
                                          "nodes": nodes})


def last(record: dict[str, Any]) -> tuple[list[dict[str, Any]], float | None]:
    """(each node of the record with its health at the last probe, when that was); nodes the
    probe did not see (added since, or never probed) have ``reachable`` None."""
    kept = registry.read_probe(record["name"])
    if not kept or kept.get("id") != record.get("id"):  # none, or a former pool of this name's
        return unknown(record), None
    seen = {int(n["index"]): n for n in kept.get("nodes") or []}
    return [seen.get(int(n["index"]), n) for n in unknown(record)], float(kept["at"])
