"""sky.Slurm enter time beside sky.SSH on the same hosts (tests/slurmcluster.py: munged and
slurmctld on this machine, one slurmd per netns test host, host 0 the login node; needs root and
Debian's slurm-wlm and munge).

    .venv/bin/python benchmarks/slurm.py [--runs N] [--json PATH]

* a 3-node sky.Slurm pool, queue empty: enter (sbatch, the job scheduled, the step on three
  nodes, the agents reached through the login node) and enter -> first result of `@` on every
  node; the first pool of a fresh shared home (the environment built from the login node) apart
  from the warm ones (the environment found built);
* the same batch pool on a quiet cluster: no job started or ended for --quiet seconds (3.5 s: past
  batch_sched_delay, 3 s by default), as a cluster nobody uses; the other batch runs come right
  after the runs before them ended, whose end made the controller schedule (so the next batch
  job waits up to batch_sched_delay for its pass);
* the same pool with sky.Slurm(submit="srun"): an interactive job, which Slurm schedules at once
  (a batch job waits for the scheduler's next pass over batch jobs, batch_sched_delay: 3 s by
  default, so 0-3 s on an idle cluster);
* sky.SSH on the same three compute hosts, same measures, warm;
* leaving each pool (Slurm: scancel of the job, not waiting for it to leave the queue).

The runs alternate, so all see the same machine load.

``--links`` measures only how the client reaches the agents on a site whose login node forbids
TCP forwarding (sshd's AllowTcpForwarding no), in turns: the login node's multiplexer (one exec
channel and one process there for every node's link) against a relay per link
(SKYWARD_SSH_MUX=0: an exec channel and a Python process on the login node each). Per pool
(srun, the queue empty, ``--nodes`` compute nodes): the enter, the client's CPU and SSH packets
from ``sky.Compute`` to the first result on every node, the median `@` round trip over all
nodes, and an 8 MB value to one node and back (MB/s both ways).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
from _home import count_packets, scratch_home  # noqa: E402

scratch_home()

from slurmcluster import SlurmCluster, unavailable_reason  # noqa: E402
from sshhosts import SSHHosts  # noqa: E402

import skyward as sky  # noqa: E402

QUIET = sky.Options(console=False)


@sky.function
def noop() -> None:
    return None


def timed(provider: Any, nodes: int) -> dict[str, float]:
    t0 = time.perf_counter()
    pool = sky.Compute(provider=provider, nodes=nodes, options=QUIET)
    with pool:
        entered = time.perf_counter() - t0
        assert len(noop() @ pool) == nodes
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
    left = time.perf_counter() - t1
    return {"enter_s": entered, "first_result_s": first, "exit_s": left}


@sky.function
def echo(value: bytes) -> bytes:
    return value


def linked(provider: Any, nodes: int, mux: bool, packets: list[int]) -> dict[str, float]:
    """One pool, its nodes reached through the login node's multiplexer or a relay each
    (``packets``: the client's SSH packets so far, from ``_home.count_packets``)."""
    import os

    os.environ["SKYWARD_SSH_MUX"] = "1" if mux else "0"
    before = packets[0]
    cpu0, t0 = time.process_time(), time.perf_counter()
    with sky.Compute(provider=provider, nodes=nodes, options=QUIET) as pool:
        entered = time.perf_counter() - t0
        assert len(noop() @ pool) == nodes
        out = {"enter_s": entered, "first_result_s": time.perf_counter() - t0,
               "first_result_cpu_s": time.process_time() - cpu0, "first_result_packets": float(packets[0] - before)}
        calls = []
        for _ in range(50):
            t1 = time.perf_counter()
            noop() @ pool
            calls.append(time.perf_counter() - t1)
        out["broadcast_ms"] = statistics.median(calls) * 1e3
        value = os.urandom(8_000_000)
        echo(b"") >> pool
        t2 = time.perf_counter()
        for _ in range(3):
            assert echo(value) >> pool == value
        out["echo_8mb_mb_per_s"] = 3 * 2 * len(value) / (time.perf_counter() - t2) / 1e6
    return out


def links(args: argparse.Namespace) -> dict[str, Any]:
    hosts = SSHHosts(args.nodes + 1, shared_home=True, user="auto", sshd_options={"AllowTcpForwarding": "no"})
    hosts.start()
    try:
        with SlurmCluster(hosts) as cluster:
            login = hosts[0]
            known = Path(hosts.client_key).parent / "bench_known_hosts"
            srun = sky.Slurm(f"{login.user}@{login.address}", key=str(hosts.client_key), known_hosts=str(known),
                             submit="srun")
            n = len(cluster.compute)
            packets = count_packets()
            linked(srun, n, True, packets)  # the shared home's environment built
            runs: dict[str, list[dict[str, float]]] = {"multiplexer": [], "relay_per_link": []}
            for _ in range(args.runs):
                for name in ("multiplexer", "relay_per_link"):
                    cluster.wait_idle()
                    runs[name].append(linked(srun, n, name == "multiplexer", packets))
            cluster.wait_no_jobs()
    finally:
        hosts.close()
    return {"nodes": n, "runs": args.runs, **{k: summary(v) for k, v in runs.items()}}


def summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    return {k: {"median": statistics.median(r[k] for r in runs), "min": min(r[k] for r in runs),
                "max": max(r[k] for r in runs)} for k in runs[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--quiet", type=float, default=3.5,
                        help="seconds with no job event before the quiet-cluster batch runs")
    parser.add_argument("--links", action="store_true",
                        help="only the login node's multiplexer against a relay per link (forwarding forbidden)")
    parser.add_argument("--nodes", type=int, default=3, help="with --links: compute nodes (netns hosts)")
    args = parser.parse_args(argv)
    why = unavailable_reason()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    if args.links:
        results = links(args)
        print(json.dumps(results, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        return 0
    hosts = SSHHosts(4, shared_home=True, user="auto")
    hosts.start()
    results: dict[str, Any] = {}
    try:
        with SlurmCluster(hosts) as cluster:
            login = hosts[0]
            known = Path(hosts.client_key).parent / "bench_known_hosts"
            slurm = sky.Slurm(f"{login.user}@{login.address}", key=str(hosts.client_key), known_hosts=str(known))
            ssh = sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(hosts.client_key))
                                 for h in cluster.compute])
            n = len(cluster.compute)
            results["first_slurm_pool_fresh_home"] = timed(slurm, n)
            cluster.wait_no_jobs()
            timed(ssh, n)  # the SSH pool's first: its per-host folders made
            srun = sky.Slurm(f"{login.user}@{login.address}", key=str(hosts.client_key), known_hosts=str(known),
                             submit="srun")
            runs: dict[str, list[dict[str, float]]] = {"slurm_quiet": [], "slurm": [], "slurm_srun": [], "ssh": []}
            for _ in range(args.runs):
                cluster.wait_idle()  # the queue empty, every node idle
                time.sleep(args.quiet)  # (nothing else uses the test cluster)
                runs["slurm_quiet"].append(timed(slurm, n))
                cluster.wait_idle()
                runs["slurm"].append(timed(slurm, n))
                cluster.wait_idle()
                runs["slurm_srun"].append(timed(srun, n))
                runs["ssh"].append(timed(ssh, n))
            cluster.wait_no_jobs()
            results.update({k: summary(v) for k, v in runs.items()})
            results["nodes"] = n
            results["runs"] = args.runs
            results["quiet_s"] = args.quiet
    finally:
        hosts.close()
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
