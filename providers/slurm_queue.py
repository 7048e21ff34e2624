"""Slurm's words, read and written: the sbatch script of a pool's job, the flags it may carry,
``squeue`` and ``sinfo`` lines. Pure functions (no connection), so each rule is tested alone;
providers/slurm.py runs them on the login node."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skyward.errors import ConfigError

if TYPE_CHECKING:
    from skyward.spec import Spec

# States of a job that will not run (again): its nodes are gone (squeue's long names).
ENDED = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT", "GONE",
})
# Flags skyward sets itself on a pool's job: given again in options= they would fight its own.
OWN_FLAGS = frozenset({
    "--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--job-name", "-J", "--output", "-o",
    "--error", "-e", "--chdir", "-D", "--export", "--parsable", "--wrap", "--array", "-a",
    "--partition", "-p", "--account", "-A", "--qos", "-q", "--time", "-t", "--constraint", "-C",
    "--gpus-per-node",
})
# [days-]hours:minutes:seconds and the shorter forms sbatch --time accepts, or a plain minute count.
_TIME = re.compile(r"\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}")
# What sbatch prints for a request the cluster can never satisfy (it refuses at submission).
_NEVER = ("Invalid partition", "Invalid account", "Invalid qos", "Requested node configuration is not available",
          "Node count specification invalid", "More processors requested than permitted",
          "Invalid generic resource", "Invalid feature specification", "Job violates accounting/QOS policy",
          "Invalid Trackable RESource", "Requested time limit is invalid", "Memory required by task is not available")

# Pending reasons that mean this job can never start as asked (not a busy cluster): Slurm keeps
# such a job in the queue, where it would wait until pending_timeout for nothing.
NEVER_REASONS = {
    "PartitionConfig": "more nodes, CPUs, memory or GPUs per node than the partition has",
    "PartitionNodeLimit": "more nodes than the partition allows a job",
    "PartitionTimeLimit": "a time limit over the partition's MaxTime",
    "BadConstraints": "constraints no node satisfies",
    "InvalidAccount": "an account that does not exist or is not yours",
    "InvalidQOS": "a QOS that does not exist or is not yours",
    "AccountNotAllowed": "an account this partition refuses",
    "QOSNotAllowed": "a QOS this partition refuses",
    "DependencyNeverSatisfied": "a dependency that can never be met",
}


def never_reason(reason: str) -> str | None:
    """Why a PENDING job with this reason will never start (None: it may, later)."""
    if reason in NEVER_REASONS:
        return NEVER_REASONS[reason]
    if "PerJob" in reason:  # QOSMaxNodePerJobLimit, AssocMaxCpuPerJobLimit, ...: a per-job cap
        return "more than a per-job limit of the account or QOS allows"
    return None


def check_time(value: object, label: str) -> str | None:
    """``--time`` as sbatch takes it: seconds (an int, rounded up to whole minutes) or Slurm's
    own form ("30", "2:00:00", "1-12:00:00"); None leaves the partition's default."""
    if value is None:
        return None
    if isinstance(value, bool):
        pass
    elif isinstance(value, int | float) and value > 0:
        minutes = max(1, math.ceil(value / 60))
        return f"{minutes // 60}:{minutes % 60:02d}:00"
    elif isinstance(value, str) and _TIME.fullmatch(value.strip()):
        return value.strip()
    raise ConfigError(
        f"{label}={value!r} is not a time limit: give seconds (e.g. 3600) or Slurm's form "
        f"('MM', 'HH:MM:SS', 'D-HH:MM:SS', e.g. '2:00:00')."
    )


def flag_name(flag: str) -> str:
    """``--mem=8G`` -> ``--mem``; a short flag carries its value with it (``-N2``, ``-t1``): its
    name is its first letter, ``-N``."""
    return flag.split("=", 1)[0] if flag.startswith("--") else flag[:2]


def check_options(options: object) -> tuple[str, ...]:
    """Extra sbatch flags: each one a flag (``--exclusive``, ``--mem=8G``, ``--mail-type=END``), never
    one that skyward sets itself, never a word that would open a shell."""
    if isinstance(options, str) or not isinstance(options, list | tuple):
        raise ConfigError(f"sky.Slurm(options={options!r}): a list of sbatch flags, e.g. "
                          f"options=['--exclusive', '--mem=16G'].")
    out = []
    for flag in options:
        if not isinstance(flag, str) or not re.fullmatch(r"--?[A-Za-z][A-Za-z0-9-]*(=[^\n\r]*)?", flag):
            raise ConfigError(
                f"sky.Slurm(options=[..., {flag!r}]): not an sbatch flag; write each as one string "
                f"starting with '-', the value after '=' (e.g. '--mem=16G', '--exclusive')."
            )
        name = flag_name(flag)
        if name in OWN_FLAGS:
            raise ConfigError(
                f"sky.Slurm(options=[..., {flag!r}]): skyward sets {name} itself; use sky.Slurm's own "
                f"arguments (partition=, account=, qos=, time=, constraint=) or the pool's nodes=/accelerator=."
            )
        out.append(flag)
    return tuple(out)


# Flags a spec's own fields set (vcpus=, memory_gb=, accelerator=): in options= beside that field
# the two would fight; alone they are the user's.
_SPEC_FLAGS = (
    ("vcpus", "vcpus=", ("--cpus-per-task", "-c", "--cpus-per-gpu")),
    ("memory_gb", "memory_gb=", ("--mem", "--mem-per-cpu", "--mem-per-gpu")),
    ("accelerator", "accelerator=", ("--gres", "--gpus", "-G", "--gpus-per-node", "--gpus-per-task",
                                     "--gpus-per-socket")),
)


def spec_conflicts(options: Sequence[str], spec: Any) -> str | None:
    """Why ``options`` fight the spec (a flag the spec's vcpus=, memory_gb= or accelerator= sets
    already), else None."""
    names = {flag_name(f): f for f in options}
    for field, label, flags in _SPEC_FLAGS:
        if getattr(spec, field, None):
            for flag in flags:
                if flag in names:
                    return (f"sky.Slurm(options=[..., {names[flag]!r}]) and the pool's {label} both set "
                            f"{flag}: give it once (the pool's {label}, or the flag alone)")
    return None


def gpu_flag(spec: Spec, gres: str | None, types: Sequence[str] = ()) -> str | None:
    """``--gpus-per-node`` for the spec's accelerator: ``A100:4`` -> ``a100:4``, or the site's own
    spelling of that type where ``types`` (the GRES types sinfo shows) has it in another case
    (``A100``: Slurm's types are case-sensitive); ``gres`` names the site's GRES
    type instead ("" for untyped: ``--gpus-per-node=4``)."""
    acc = spec.accelerator
    if acc is None:
        return None
    count = getattr(acc, "count", 1)
    name = str(getattr(acc, "name", acc))  # (a Spec has parsed it into an Accelerator)
    if count != int(count):
        raise ConfigError(
            f"accelerator={name}:{count:g}: Slurm allocates whole GPUs (MIG slices are GRES of their "
            f"own: name it with sky.Slurm(gres='<site GRES type>') and a whole count)."
        )
    if gres is None:
        kind = next((t for t in types if t == name), None) or next(
            (t for t in types if t.lower() == name.lower()), name.lower())
    else:
        kind = gres
    return f"--gpus-per-node={kind}:{int(count)}" if kind else f"--gpus-per-node={int(count)}"


@dataclass(frozen=True, slots=True)
class JobRequest:
    """One sbatch submission: ``nodes`` nodes, the pool's node indices starting at ``first``."""

    name: str
    nodes: int
    first: int
    folder: str  # the pool's folder on the shared home (the job's cwd and its output)
    flags: tuple[str, ...]  # partition, account, ... and the user's options

    def script(self, node_script: str) -> str:
        """The batch script: every flag as an #SBATCH line (the record keeps it as it ran), then
        one srun task per node. A node that dies does not take the others with it (--no-kill,
        --kill-on-bad-exit=0): the pool heals it with a job of its own. Never requeued
        (--no-requeue, whatever the site's JobRequeue): a requeued job would start agents the pool
        does not know, on other ports, under a named pool's description; a
        failed node is replaced by the pool instead."""
        lines = ["#!/bin/bash", f"# skyward: nodes {self.first}..{self.first + self.nodes - 1} of a pool"]
        lines += [f"#SBATCH {f}" for f in (
            f"--job-name={self.name}", f"--nodes={self.nodes}", "--ntasks-per-node=1",
            f"--chdir={self.folder}", f"--output={self.folder}/job-%j.out", "--no-kill", "--no-requeue",
            *self.flags)]
        lines.append(f"srun --nodes={self.nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 --no-kill "
                     f"bash {shlex.quote(node_script)} {self.first}")
        return "\n".join(lines) + "\n"


    def launcher(self, node_script: str) -> str:
        """sky.Slurm(submit="srun"): the script that asks for the same job as an interactive one,
        with the same flags on srun's command line: srun on the login node allocates it (at once,
        where a batch job waits for the scheduler's next pass) and runs one task per node in it.
        ``--verbose`` makes srun say the job's id as soon as it has one (``srun_start`` reads it)."""
        flags = [f"--job-name={self.name}", f"--nodes={self.nodes}", "--ntasks-per-node=1",
                 f"--chdir={self.folder}", "--no-kill", "--kill-on-bad-exit=0", "--verbose", *self.flags]
        return ("#!/bin/bash\n"
                f"# skyward: nodes {self.first}..{self.first + self.nodes - 1} of a pool, an interactive job held by "
                f"this srun on the login node\n"
                f"exec {shlex.join(['srun', *flags, 'bash', node_script, str(self.first)])}\n")


def srun_start(launcher: str, output: str, wait: float = 30.0) -> str:
    """Start ``launcher`` (in the pool's folder) detached from the SSH session (its own session,
    no terminal, stdin from /dev/null, output to ``output``), then print the job's id as soon as
    srun says it ("jobid N: nodes..." once allocated, "job N queued and waiting" while pending);
    srun's words and a non-zero status when it ends first (a refusal) or says nothing in ``wait``
    seconds."""
    steps = int(wait / 0.05)
    out = shlex.quote(output)
    return (f"setsid nohup bash {shlex.quote(launcher)} >{out} 2>&1 </dev/null & P=$!; "
            f"for _ in $(seq 1 {steps}); do "
            f"J=$(grep -oE 'job(id)? [0-9]+' {out} 2>/dev/null | head -n1 | grep -oE '[0-9]+'); "
            f"if [ -n \"$J\" ]; then echo \"$J\"; exit 0; fi; "
            f"kill -0 $P 2>/dev/null || {{ sleep 0.1; cat {out}; exit 1; }}; sleep 0.05; done; cat {out}; exit 1")


@dataclass(frozen=True, slots=True)
class JobState:
    """One line of squeue about a job."""

    job: str
    state: str  # PENDING, RUNNING, COMPLETING, CANCELLED, ...; GONE: no longer known to the controller
    reason: str  # Priority, Resources, None, ...
    nodelist: str
    restarts: int = 0  # times Slurm requeued it (scontrol's Restarts=)

    @property
    def ended(self) -> bool:
        return self.state.split()[0] in ENDED


def parse_squeue(text: str) -> dict[str, JobState]:
    """``squeue -h -o '%i|%T|%r|%N'`` lines -> job id -> state."""
    jobs = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0]:
            jobs[parts[0]] = JobState(parts[0], parts[1], parts[2], parts[3])
    return jobs


# -- looking at the queue: a failed look is no answer, never "the job left" -------
# squeue exits 1 both when the controller cannot be reached (a restart, a timeout: "Socket timed
# out on send/recv operation", "Unable to contact slurm controller") and when it no longer knows
# any of the jobs asked about ("Invalid job id specified": they ended more than MinJobAge ago).
# Only the second is an answer; and a job missing from an answer is confirmed with the
# controller's own memory (scontrol show job) and sacct's record before anything ends.
SQUEUE_FORMAT = "%i|%T|%r|%N"
_UNKNOWN_JOB = "Invalid job id specified"


def squeue_command(jobs: Sequence[str]) -> str:
    """squeue about ``jobs`` (stdout and stderr), then its exit status on a line of its own."""
    return f"squeue -h --states=all -j {','.join(jobs)} -o '{SQUEUE_FORMAT}' 2>&1; echo \"@@squeue $?\""


@dataclass(frozen=True, slots=True)
class Look:
    """What one squeue said: the jobs it listed, or why it said nothing (``error``: its exit
    status and its words; None when the controller answered)."""

    states: dict[str, JobState]
    error: str | None = None


def parse_look(text: str) -> Look:
    """``squeue_command``'s output -> the jobs listed, or the failure."""
    body, marker, rest = text.rpartition("@@squeue ")
    if not marker:
        said = " ".join(text.split())[-300:]
        return Look({}, f"squeue gave no exit status (the command was cut short){': ' + said if said else ''}")
    code = (rest.split() or ["?"])[0]
    if code == "0":
        return Look(parse_squeue(body))
    if _UNKNOWN_JOB in body:  # the controller answered: it knows none of these jobs any more
        return Look({})
    said = " ".join(line.strip() for line in body.splitlines() if line.strip())[-300:]
    return Look({}, f"squeue exited {code}: {said or 'no message'}")


def confirm_command(jobs: Sequence[str]) -> str:
    """For jobs an answering squeue did not list: the controller's own record of each (``scontrol
    show job``, kept MinJobAge after a job ends) and sacct's (where the site keeps accounting; it
    says who cancelled a job)."""
    ids = " ".join(jobs)
    return (f"for j in {ids}; do echo \"@@job $j\"; scontrol show job -o \"$j\" 2>&1; echo \"@@rc $?\"; done; "
            f"echo \"@@sacct\"; sacct -X -n -P -j {','.join(jobs)} -o JobID,State 2>/dev/null; true")


def parse_confirm(text: str, jobs: Sequence[str]) -> tuple[dict[str, JobState], dict[str, str]]:
    """``confirm_command``'s output -> (each job's state, from the controller or sacct; ``GONE``
    when neither knows it), {job: why it could not be told}."""
    head, _, sacct = text.partition("@@sacct")
    recorded: dict[str, tuple[str, str]] = {}
    for line in sacct.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 2 and parts[0].isdigit():
            state, _, by = parts[1].partition(" ")
            recorded[parts[0]] = (state, by.strip())
    states: dict[str, JobState] = {}
    unknown: dict[str, str] = {}
    blocks = {b.partition("\n")[0].strip(): b.partition("\n")[2] for b in head.split("@@job ")[1:]}
    for job in jobs:
        block = blocks.get(job)
        if block is None:
            unknown[job] = "scontrol show job gave no answer"
            continue
        body, _, code = block.rpartition("@@rc ")
        found = next((ln for ln in body.splitlines() if ln.startswith("JobId=")), None)
        if code.strip().startswith("0") and found is not None:
            fields = dict(word.split("=", 1) for word in found.split() if "=" in word)
            reason = fields.get("Reason", "")
            if job in recorded and recorded[job][1]:
                reason = f"{reason} ({recorded[job][1]})" if reason and reason != "None" else recorded[job][1]
            states[job] = JobState(job, fields.get("JobState", "?"), reason, fields.get("NodeList", ""),
                                   restarts=_int(fields.get("Restarts", "0")))
        elif _UNKNOWN_JOB in body:
            state, by = recorded.get(job, ("GONE", ""))
            states[job] = JobState(job, state, by, "")
        else:
            said = " ".join(ln.strip() for ln in body.splitlines() if ln.strip())[-300:]
            unknown[job] = f"scontrol show job exited {code.strip() or '?'}: {said or 'no message'}"
    return states, unknown


# Why a job of a pool ended decides whether its lost nodes are replaced: the
# site's or the user's decision to end it stands; a failure of the machinery is healed.
_STOPS = {
    "CANCELLED": "was cancelled",
    "TIMEOUT": "reached its time limit",
    "DEADLINE": "passed its deadline",
}
# States a job passes through on its way out (the kill of its processes, a resize): the next
# look tells how it ended.
PASSING = frozenset({"COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESIZING"})


def stops_the_pool(state: JobState) -> str | None:
    """Why the pool must end with this job rather than replace its nodes (scancel, the time
    limit), in words for the error: "was cancelled by uid 1000"; None when its lost nodes are to
    be replaced (NODE_FAIL, BOOT_FAIL, PREEMPTED, a requeue, an agent that died in a running
    job, a job that failed with it)."""
    base = state.state.split()[0]
    what = _STOPS.get(base)
    if what is None:
        return None
    by = re.search(r"by (\d+)", state.reason)
    if base == "CANCELLED":
        return f"{what} by uid {by.group(1)}" if by else f"{what} (scancel, by its user or an admin)"
    return what


def never_runs(output: str) -> str | None:
    """Slurm's own words when sbatch refused a request the cluster can never satisfy, else None."""
    for line in output.splitlines():
        if any(marker in line for marker in _NEVER):
            return line.strip().removeprefix("sbatch: error: ")
    return None


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition as sinfo describes it (its nodes summed)."""

    name: str
    default: bool
    nodes: int
    idle: int
    cpus: int  # per node (the smallest node's)
    memory_gb: float  # per node (the smallest node's)
    gpus: tuple[tuple[str, int], ...]  # (type, per node) from GRES
    time_limit: str
    available: bool


# One line per node and partition: %P carries a '*' after the default partition's name.
SINFO_FORMAT = "%P|%N|%c|%m|%G|%t|%l|%a"


def parse_sinfo(text: str) -> list[Partition]:
    """``sinfo -h -N -o SINFO_FORMAT`` -> partitions, the default one first."""
    acc: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 8:
            continue
        part, node, cpus, mem, gres, state, limit, avail = parts
        default = part.endswith("*")
        part = part.rstrip("*")
        p = acc.setdefault(part, {"nodes": set(), "idle": set(), "cpus": [], "mem": [], "gpus": {},
                                  "limit": limit, "avail": avail == "up", "default": default})
        p["default"] = p["default"] or default
        if node in p["nodes"]:
            continue
        p["nodes"].add(node)
        if state.rstrip("*~#!%$@^-") in ("idle",):
            p["idle"].add(node)
        p["cpus"].append(_int(cpus))
        p["mem"].append(_int(mem) / 1024)
        for kind, count in parse_gres(gres):
            p["gpus"][kind] = min(p["gpus"].get(kind, count), count)
    found = [
        Partition(name, p["default"], len(p["nodes"]), len(p["idle"]), min(p["cpus"] or [0]),
                  round(min(p["mem"] or [0.0]), 1), tuple(sorted(p["gpus"].items())), p["limit"], p["avail"])
        for name, p in acc.items()
    ]
    return sorted(found, key=lambda part: not part.default)


def fitting(parts: list[Partition], want: Any) -> list[Partition]:
    """The partitions (up, in order) whose nodes have what ``want`` asks per node: a Spec or a
    catalogue Want (accelerator with its count, vcpus, memory_gb)."""
    acc = getattr(want, "accelerator", None)
    out = []
    for p in parts:
        if not p.available:
            continue
        if getattr(want, "vcpus", None) and p.cpus < want.vcpus:
            continue
        if getattr(want, "memory_gb", None) and p.memory_gb < want.memory_gb:
            continue
        if acc is not None:
            name, count = acc.name.lower(), getattr(acc, "count", 1)
            # an untyped GRES ("gpu:4") may be any GPU: it fits a request by count
            if not any((kind.lower() in (name, "gpu")) and n >= count for kind, n in p.gpus):
                continue
        out.append(p)
    return out


def offer(p: Partition, cluster: str) -> Any:
    """A partition as a catalogue Offer (sky.offers): per-node shape, price 0."""
    from skyward.catalogue import Offer

    kind, count = (p.gpus[0] if p.gpus else (None, 0))
    return Offer(provider="slurm", instance_type=p.name, region=cluster, vcpus=p.cpus, memory_gb=p.memory_gb,
                 architecture="x86_64", accelerator=kind.upper() if kind else None, accelerator_count=count,
                 on_demand=0.0, extra={"nodes": p.nodes, "idle": p.idle, "time_limit": p.time_limit,
                                       "default": p.default, "gres": dict(p.gpus)})


def describe(p: Partition) -> str:
    gpus = ", ".join(f"{n}x {k}" for k, n in p.gpus) or "no GPU"
    return (f"{p.name}{' (default)' if p.default else ''}: {p.nodes} node(s), {p.idle} idle, {p.cpus} CPUs, "
            f"{p.memory_gb:g} GB, {gpus}")


def asked(spec: Any) -> str:
    parts = []
    if getattr(spec, "accelerator", None) is not None:
        parts.append(f"{spec.accelerator.name}:{spec.accelerator.count:g}")
    if getattr(spec, "vcpus", None):
        parts.append(f"{spec.vcpus:g} CPUs")
    if getattr(spec, "memory_gb", None):
        parts.append(f"{spec.memory_gb:g} GB")
    return ", ".join(parts) or "any node"


def parse_gres(gres: str) -> list[tuple[str, int]]:
    """``gpu:a100:4(S:0-1),gpu:2`` -> [("a100", 4), ("gpu", 2)]: GPUs only; "(null)" is none."""
    out = []
    for item in re.split(r",(?![^(]*\))", gres):
        item = re.sub(r"\(.*?\)", "", item).strip()
        if not item.startswith("gpu"):
            continue
        fields = item.split(":")
        if len(fields) == 3:
            out.append((fields[1], _int(fields[2])))
        elif len(fields) == 2:
            out.append(("gpu", _int(fields[1])) if fields[1].isdigit() else (fields[1], 1))
    return out


def _int(text: str) -> int:
    m = re.match(r"\d+", text.strip())
    return int(m.group()) if m else 0


# -- accounting: what a pool's jobs used, for its record at `down` -----------------------------------
# sacct -X (the jobs, not their steps) -P -n: these fields, '|' between them.
SACCT_FORMAT = "JobID,State,ElapsedRaw,CPUTimeRAW,AllocTRES,NNodes,NodeList,Start,End"


def duration(text: str) -> int:
    """Slurm's ``[D-][HH:]MM:SS`` -> seconds."""
    days, _, rest = text.strip().rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[-3] * 3600 + parts[-2] * 60 + parts[-1]


def _gpus(tres: str) -> int:
    """GPUs in a TRES list: ``gres/gpu=4``, or the typed ``gres/gpu:a100=4`` entries summed."""
    items = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
    if "gres/gpu" in items:
        return _int(items["gres/gpu"])
    return sum(_int(v) for k, v in items.items() if k.startswith("gres/gpu:"))


def _usage(state: str, elapsed: int, cpus: int, gpus: int, nodes: int, nodelist: str, start: str,
           end: str) -> dict[str, Any]:
    return {"state": state, "elapsed_seconds": elapsed, "cpus": cpus, "gpus": gpus,
            "cpu_hours": round(cpus * elapsed / 3600, 4), "gpu_hours": round(gpus * elapsed / 3600, 4),
            "nodes": nodes, "nodelist": nodelist, "start": start, "end": end}


def parse_sacct(text: str) -> dict[str, dict[str, Any]]:
    """``sacct -X -P -n -o SACCT_FORMAT`` lines -> job id -> its usage (elapsed, CPU and GPU hours)."""
    jobs = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 9 or not parts[0].split("_")[0].isdigit():
            continue
        job, state, elapsed, _cputime, tres, nodes, nodelist, start, end = parts
        items = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
        jobs[job] = _usage(state, _int(elapsed), _int(items.get("cpu", "0")), _gpus(tres), _int(nodes),
                           nodelist, start, end)
    return jobs


def parse_scontrol_job(text: str) -> dict[str, Any] | None:
    """``scontrol show job -o JOB`` -> its usage as the controller still remembers it (a site
    without accounting storage: sacct has nothing, the controller keeps a job MinJobAge after it
    ended); None when it does not know the job."""
    line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), None)
    if line is None:
        return None
    fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
    elapsed = duration(fields.get("RunTime", "0:0"))
    return _usage(fields.get("JobState", "?"), elapsed, _int(fields.get("NumCPUs", "0")),
                  _gpus(fields.get("TRES", "")), _int(fields.get("NumNodes", "0")), fields.get("NodeList", ""),
                  fields.get("StartTime", ""), fields.get("EndTime", ""))


# Flags in options= that already say how much of a node each job takes: with one of them, a job
# gets no default --cpus-per-task.
_CPU_FLAGS = ("--cpus-per-task", "-c", "--cpus-per-gpu", "--exclusive", "--mincpus")


def default_cpus(part: Partition | None, spec: Any, options: Sequence[str]) -> int | None:
    """The CPUs each node's job asks for when the pool names no ``vcpus=`` (None: leave it to
    Slurm). A pool's node is a machine: all the CPUs of the partition's (smallest) node; on GPU
    nodes, the share of its CPUs that goes with the share of its GPUs the pool asks for (a pool
    of ``A100:1`` nodes on 4-GPU, 64-CPU nodes asks for 16), so the node's other GPUs stay usable
    by others. Without it Slurm gives one CPU, and two one-node jobs of a pool (replacements,
    growth) could land on one host."""
    if getattr(spec, "vcpus", None) or part is None or part.cpus <= 0:
        return None
    if {flag_name(f) for f in options} & set(_CPU_FLAGS):
        return None
    acc = getattr(spec, "accelerator", None)
    if acc is not None and part.gpus:
        per_node = max(n for _, n in part.gpus)
        count = getattr(acc, "count", 1)
        if per_node > 0 and count < per_node:
            return max(1, int(part.cpus * count // per_node))
    return part.cpus


def minutes(text: str | None) -> float | None:
    """A Slurm time (``30``, ``1:30`` (MM:SS), ``2:00:00``, ``1-12``, ``1-12:00:00``, ``infinite``) in
    minutes; None when it cannot be read."""
    if not text:
        return None
    t = text.strip().lower()
    if t in ("infinite", "unlimited"):
        return math.inf
    days, _, rest = t.rpartition("-")
    try:
        d = int(days) if days else 0
        parts = [int(x) for x in rest.split(":")]
    except ValueError:
        return None
    if days:  # days-hours[:minutes[:seconds]]
        parts = parts + [0] * (3 - len(parts))
        h, m, sec = parts[:3]
    elif len(parts) == 3:
        h, m, sec = parts
    elif len(parts) == 2:
        h, m, sec = 0, parts[0], parts[1]
    else:
        h, m, sec = 0, parts[0], 0
    return d * 1440 + h * 60 + m + sec / 60


def partition_named(parts: Sequence[Partition], name: str | None) -> Partition | None:
    """The partition called ``name`` (None: the cluster's default one), if sinfo shows it."""
    return next((p for p in parts if (p.name == name if name else p.default)), None)


def explain_refusal(parts: Sequence[Partition], *, partition: str | None, nodes: int,
                    time_limit: str | None, spec: Any) -> str | None:
    """What, in the pool's own terms, makes Slurm refuse a job (its error at sbatch, or a PENDING
    reason that never passes: Slurm names one reason, not always the one that matters), checked
    against the partitions ``sinfo`` shows; None when none of them explains it."""
    if not parts:
        return None
    listed = "; ".join(describe(p) for p in parts)
    part = partition_named(parts, partition)
    if partition and part is None:
        return (f"partition {partition!r} is not one of this cluster's; its partitions: {listed}. "
                f"Name one of them with sky.Slurm(partition=...), or leave partition= out for the default")
    if part is None:
        return None
    over = []
    asked, limit = minutes(time_limit), minutes(part.time_limit)
    if asked is not None and limit is not None and asked > limit:
        over.append(f"time={time_limit} is over partition {part.name!r}'s MaxTime of {part.time_limit}: ask "
                    f"for at most {part.time_limit} with sky.Slurm(time=...) (or max_duration=)")
    if nodes > part.nodes:
        over.append(f"nodes={nodes} is more than partition {part.name!r} has ({part.nodes})")
    if getattr(spec, "vcpus", None) and spec.vcpus > part.cpus:
        over.append(f"vcpus={spec.vcpus:g} is more than its nodes' {part.cpus} CPUs")
    if getattr(spec, "memory_gb", None) and spec.memory_gb > part.memory_gb:
        over.append(f"memory_gb={spec.memory_gb:g} is more than its nodes' {part.memory_gb:g} GB")
    acc = getattr(spec, "accelerator", None)
    if acc is not None and max((n for _, n in part.gpus), default=0) < getattr(acc, "count", 1):
        over.append(f"accelerator={acc.name}:{acc.count:g} is more than its nodes have "
                    f"({', '.join(f'{n}x {k}' for k, n in part.gpus) or 'no GPU'})")
    if not over:
        return None
    return "; ".join(over) + f"; or name another partition (its partitions: {listed})"
