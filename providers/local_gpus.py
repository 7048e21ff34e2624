"""The GPUs of this machine, handed out to Local nodes: each node its own, never shared unless asked.

What may be handed out: the GPUs ``nvidia-smi -L`` lists, or, where the client itself runs with
``CUDA_VISIBLE_DEVICES`` set, only those (its entries are indices as nvidia-smi numbers the GPUs,
which is PCI bus order, or UUIDs or their unique prefixes, or MIG UUIDs). A node gets its GPUs
through ``CUDA_VISIBLE_DEVICES``, by UUID where nvidia-smi gives one (MPS clients and every CUDA
library read those the same way), else by index.

A whole count (``A100``, ``A100:2``) takes GPUs no one else holds. A fraction (``A100:0.5``) is
the explicit way to share: fractional nodes are packed onto one GPU until their shares add up to
1, and never onto a GPU that a whole claim holds.

Claims are kept for every pool of this user on this machine in one file,
``<skyward home>/run/gpus.json``, read and written under an exclusive ``flock`` of
``gpus.lock`` beside it (the kernel lets go of that lock when its holder dies, whatever the way).
Each claim names the process that holds it: the node's agent once it runs, the client while it
starts it. A claim whose process no longer runs (pid and start time, so a reused pid does not
count) is free again, so GPUs come back after a crash, a ``kill -9`` or a lost lease with no
clean-up; a pool that stops its nodes frees theirs at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from skyward.errors import ProviderError

from .local_procs import process_running, start_time

_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?\s*$")
_NONE = ("", "-1", "none", "NoDevFiles")  # CUDA_VISIBLE_DEVICES values that hide every GPU


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU that may be handed out: ``visible`` is what a node's CUDA_VISIBLE_DEVICES names
    it by, ``key`` what claims name it by (the same GPU whatever the spelling), ``name`` its model."""

    visible: str
    key: str
    name: str


@dataclass(frozen=True, slots=True)
class Assigned:
    """A node's GPUs: what its CUDA_VISIBLE_DEVICES says, and its share of them (1 = its own)."""

    visible: tuple[str, ...]
    names: tuple[str, ...]
    share: Fraction

    def env(self) -> dict[str, str]:
        """What the node's agent (and so its workers) gets in its environment: CUDA_VISIBLE_DEVICES
        for CUDA, SKYWARD_GPUS for the node's GPU metrics (nvidia-smi does not read the former),
        SKYWARD_GPU_SHARE where the node shares its GPU (the mps plugin sizes its share from it)."""
        devices = ",".join(self.visible)
        env = {"CUDA_VISIBLE_DEVICES": devices, "SKYWARD_GPUS": devices}
        if self.share < 1:
            env["SKYWARD_GPU_SHARE"] = f"{float(self.share):g}"
        return env

    def describe(self) -> dict[str, Any]:
        return {"visible": list(self.visible), "names": list(self.names), "share": str(self.share)}


# -- discovery -----------------------------------------------------------------------------------
def machine_gpus() -> list[tuple[int, str, str | None]]:
    """(index, model, UUID or None) of each GPU ``nvidia-smi -L`` lists; [] without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.splitlines():
        match = _LINE.match(line.rstrip())
        if match:  # (MIG devices are the indented lines under their GPU: not matched)
            gpus.append((int(match.group(1)), match.group(2).strip(), match.group(3)))
    return gpus


def usable_gpus(environ: dict[str, str] | None = None) -> list[Gpu]:
    """The GPUs Local may hand out: the machine's, or those the client's CUDA_VISIBLE_DEVICES
    names (read as CUDA reads it: the first entry that names nothing ends the list)."""
    environ = dict(os.environ) if environ is None else environ
    found = machine_gpus()
    every = [Gpu(uuid or str(index), uuid or f"index-{index}", name) for index, name, uuid in found]
    allowed = environ.get("CUDA_VISIBLE_DEVICES")
    if allowed is None:
        return every
    if allowed.strip() in _NONE:
        return []
    chosen: list[Gpu] = []
    for entry in (e.strip() for e in allowed.split(",")):
        gpu = _resolve(entry, found)
        if gpu is None:
            break
        if gpu.key not in {g.key for g in chosen}:
            chosen.append(gpu)
    return chosen


def _resolve(entry: str, found: list[tuple[int, str, str | None]]) -> Gpu | None:
    if entry.isdigit():
        for index, name, uuid in found:
            if index == int(entry):
                return Gpu(uuid or str(index), uuid or f"index-{index}", name)
        return None
    if entry.startswith("MIG-"):  # a MIG instance: handed out as it is written
        return Gpu(entry, entry, "MIG")
    prefix = entry if entry.startswith("GPU-") else f"GPU-{entry}"
    matches = [(i, n, u) for i, n, u in found if u and u.startswith(prefix)]
    if len(matches) != 1:
        return None
    _, name, uuid = matches[0]
    assert uuid is not None
    return Gpu(uuid, uuid, name)


def share_of(count: float) -> Fraction:
    """An accelerator count as an exact share (0.33 -> 33/100; three of them fit one GPU)."""
    return Fraction(count).limit_denominator(1000)


def shortfall(count: float, nodes: int, have: int) -> str | None:
    """Why ``nodes`` nodes of ``count`` GPUs each do not fit on ``have`` GPUs; None when they do."""
    share = share_of(count)
    need = _gpus_needed(share, nodes)
    if need <= have:
        return None
    each = f"{_number(share)} GPU{'s' if share > 1 else ''}"
    return (
        f"{nodes} Local node(s) of {each} each need {need} GPU(s) and this machine has {have} that "
        f"Local may hand out{_visible_note()}. Each Local node gets GPUs of its own; use fewer "
        f"nodes (at most {_fit(share, have)}), a fractional count to share GPUs on purpose "
        f"(e.g. accelerator=sky.accelerators.A100(count=0.5): two nodes per GPU), or a provider "
        f"with more GPUs."
    )


def _gpus_needed(share: Fraction, nodes: int) -> int:
    if share >= 1:
        return int(share) * nodes
    per_gpu = int(1 // share)  # fractional nodes that fit on one GPU
    return -(-nodes // per_gpu)


def _fit(share: Fraction, have: int) -> int:
    return have // int(share) if share >= 1 else have * int(1 // share)


def _number(share: Fraction) -> str:
    return str(int(share)) if share.denominator == 1 else f"{float(share):g}"


def _visible_note() -> str:
    allowed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if allowed is None else f" (this process's CUDA_VISIBLE_DEVICES={allowed!r} limits them)"


# -- claims --------------------------------------------------------------------------------------
def _run_dir() -> Path:
    from skyward.paths import skyward_home

    path = skyward_home() / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _claims() -> Iterator[list[dict[str, Any]]]:
    """The claims of every pool on this machine, held exclusively; what the caller leaves in the
    list is written back. Claims whose process is gone are dropped on the way in."""
    import fcntl

    run = _run_dir()
    with open(run / "gpus.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        path = run / "gpus.json"
        try:
            claims = list(json.loads(path.read_text()).get("claims", []))
        except (OSError, ValueError, AttributeError):
            claims = []
        claims = [c for c in claims if process_running(int(c["pid"]), c.get("started"))]
        yield claims
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"claims": claims}, indent=1))
        os.replace(tmp, path)


def in_use() -> list[dict[str, Any]]:
    """The claims that hold GPUs now (every pool of this user on this machine)."""
    with _claims() as claims:
        return [dict(c) for c in claims]


class GpuClaims:
    """One Local pool's GPUs: ``take`` before its nodes start, ``bind`` each to its agent, ``free``
    when they stop."""

    def __init__(self, pool_id: str, count: float, gpus: list[Gpu] | None = None) -> None:
        self.pool_id = pool_id
        self.share = share_of(count)
        self._gpus = gpus

    def gpus(self) -> list[Gpu]:
        if self._gpus is None:
            self._gpus = usable_gpus()
        return self._gpus

    def take(self, nodes: list[int]) -> dict[int, Assigned]:
        """GPUs for each of ``nodes``, all or none, held by this process until ``bind``; raises
        ProviderError, before any node starts, when they are not free."""
        if not nodes:
            return {}
        gpus = self.gpus()
        problem = shortfall(float(self.share), len(nodes), len(gpus))
        me, started = os.getpid(), start_time(os.getpid())
        with _claims() as claims:
            used: dict[str, Fraction] = {}
            for c in claims:
                used[c["gpu"]] = used.get(c["gpu"], Fraction(0)) + Fraction(c["share"])
            taken: dict[int, Assigned] = {}
            new: list[dict[str, Any]] = []
            for node in nodes:
                chosen = self._choose(gpus, used) if problem is None else None
                if chosen is None:
                    raise ProviderError(problem or self._busy(len(nodes), gpus, claims))
                for gpu in chosen:
                    used[gpu.key] = used.get(gpu.key, Fraction(0)) + min(self.share, Fraction(1))
                    new.append({"gpu": gpu.key, "share": str(min(self.share, Fraction(1))), "pid": me,
                                "started": started, "pool": self.pool_id, "node": node})
                taken[node] = Assigned(tuple(g.visible for g in chosen), tuple(g.name for g in chosen),
                                       min(self.share, Fraction(1)))
            claims.extend(new)
        return taken

    def _choose(self, gpus: list[Gpu], used: dict[str, Fraction]) -> list[Gpu] | None:
        if self.share >= 1:
            free = [g for g in gpus if used.get(g.key, 0) == 0]
            want = int(self.share)
            return free[:want] if len(free) >= want else None
        # A share: the fullest GPU it still fits on (sharing stays packed, whole GPUs stay whole).
        fits = [g for g in gpus if used.get(g.key, Fraction(0)) + self.share <= 1]
        if not fits:
            return None
        return [max(fits, key=lambda g: used.get(g.key, Fraction(0)))]

    def _busy(self, nodes: int, gpus: list[Gpu], claims: list[dict[str, Any]]) -> str:
        usable = {g.key for g in gpus}
        held = [c for c in claims if c["gpu"] in usable]
        ours = len({c["gpu"] for c in held if c["pool"] == self.pool_id})
        others = sorted({(c["pool"], c["pid"]) for c in held if c["pool"] != self.pool_id})
        who = [f"{ours} by this pool's own nodes"] if ours else []
        if others:
            names = ", ".join(f"pool {pool} (pid {pid})" for pool, pid in others[:5])
            count = len({c["gpu"] for c in held if c["pool"] != self.pool_id})
            who.append(f"{count} by other running pools ({names})")
        return (
            f"{nodes} more Local node(s) of {_number(self.share)} GPU(s) each do not fit: this "
            f"machine has {len(gpus)} GPU(s) Local may hand out and "
            f"{len({c['gpu'] for c in held})} of them are held, {'; '.join(who)}. GPUs are free "
            f"again when the nodes holding them stop; or use fewer nodes, or a fractional count "
            f"(e.g. sky.accelerators.A100(count=0.5)) to share GPUs on purpose."
        )

    def bind(self, node: int, pid: int) -> None:
        """Node ``node``'s GPUs are held by its agent from now on (free when it exits)."""
        started = start_time(pid)
        with _claims() as claims:
            for c in claims:
                if c["pool"] == self.pool_id and c["node"] == node:
                    c["pid"], c["started"] = pid, started

    def free(self, nodes: list[int] | None = None) -> None:
        """These nodes' GPUs (every node's: None) are free again."""
        if nodes is not None and not nodes:
            return
        with _claims() as claims:
            claims[:] = [c for c in claims if c["pool"] != self.pool_id
                         or (nodes is not None and c["node"] not in nodes)]
