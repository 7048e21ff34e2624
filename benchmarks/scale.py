"""Pools of thousands: what a 1,000-5,000-node cloud pool costs the client.

    .venv/bin/python benchmarks/scale.py [--sizes 1000,3000,5000] [--reps 3] [--json PATH]

No cloud, no Pulumi CLI, no network: previews run the real AWS stack program under Pulumi's
mocks (stacks/preview.py), pools come up through the tests' fake automation-API workspace
(tests/stacks/stackfakes.py), and ``skyward ls`` / ``skyward status`` read a 1,000-node pool's
registry record in a scratch SKYWARD_HOME, whose nodes sit on closed loopback ports.

Figures:

* preview: ``provider.preview(spec)`` of an AWS and a GCP pool of each size, in this process
  after a warm-up preview (imports excluded), median of ``--reps``; and an AWS one in a new
  process, imports included. ms/node = the whole preview's time / nodes.
* up: the plan (a host key per node) and ``CloudPool.start(n)`` through the fake workspace,
  config written to the stack's settings file; the longest command-line argument the Pulumi CLI
  would have been given.
* memory/node: Python heap (tracemalloc) the client keeps per node of a pool that came up
  (plan, host keys, node addresses, SSH hosts and cluster nodes, the stack config), with the fake
  workspace's own copies dropped; and the peak per node during a preview.
* ls / status: wall time of ``skyward ls`` and ``skyward status NAME`` as commands (a new
  Python process each, so imports included) on a 1,000-node pool, median of ``--reps``; status
  answers from the last probe (``--probe`` contacts the nodes: not timed here, they are on
  closed ports).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "stacks"))
sys.path.insert(0, str(HERE))
from _home import scratch_home  # noqa: E402

scratch_home()

import skyward as sky  # noqa: E402

CIDRS = ["10.0.0.0/8"]


def _spec(nodes: int, workspace: Any = None, cloud: str = "aws") -> sky.Spec:
    if cloud == "gcp":
        return sky.Spec(provider=sky.GCP(project="p", detect_address=False, allow_ssh_from=CIDRS),
                        nodes=nodes, allocation="on-demand")
    return sky.Spec(provider=sky.AWS(detect_address=False, allow_ssh_from=CIDRS, workspace=workspace),
                    nodes=nodes, allocation="on-demand")


_INSTANCE = {"aws": "aws:ec2/instance:Instance", "gcp": "gcp:compute/instance:Instance"}


# -- preview -------------------------------------------------------------------------------------
def preview_warm(sizes: list[int], reps: int, cloud: str) -> dict[int, float]:
    small = _spec(4, cloud=cloud)
    small.provider.preview(small)  # imports, first run of the program
    out = {}
    for n in sizes:
        spec = _spec(n, cloud=cloud)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            found = spec.provider.preview(spec)
            times.append(time.perf_counter() - t0)
        assert len([r for r in found["resources"] if r["type"] == _INSTANCE[cloud]]) == n
        out[n] = statistics.median(times)
    return out


def preview_cold(n: int) -> float:
    code = ("import time, skyward as sky; t = time.perf_counter(); "
            f"s = sky.Spec(provider=sky.AWS(detect_address=False, allow_ssh_from={CIDRS!r}), nodes={n}); "
            "s.provider.preview(s); print(time.perf_counter() - t)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return float(done.stdout.strip().splitlines()[-1])


# -- up through the fake workspace, and what the client keeps ----------------------------------------
def _addresses(n: int) -> list[str]:
    return [f"198.18.{i // 256}.{i % 256}" for i in range(n)]  # never connected to


def come_up(n: int, name: str | None = None) -> tuple[Any, Any, list[Any], float]:
    """(fake workspace, CloudPool, node addresses, seconds): plan and up of an n-node AWS pool."""
    from stackfakes import FakeWorkspace

    from skyward.stacks.cloudpool import launch

    ws = FakeWorkspace(addresses=_addresses(n))
    spec = _spec(n, ws)
    provider = spec.provider
    offer = provider.offer(spec)
    t0 = time.perf_counter()
    cloud = launch("aws", spec, "ab12cd34", offer, provider._program(), provider=provider,
                   **provider._stack_args(spec, offer), plugins={}, connect=ws, pool_name=name)
    nodes = cloud.start(n)
    return ws, cloud, nodes, time.perf_counter() - t0


def _cluster(spec: sky.Spec, cloud: Any, nodes: list[Any], ports: list[int] | None = None) -> Any:
    """The SSHCluster a cloud pool's bootstrap leaves: each node with a running agent."""
    import dataclasses

    from skyward.providers.base import NodeEndpoint
    from skyward.providers.ssh import SSHCluster, SSHHost, _Node, _unconnected

    hosts = [SSHHost(**a.host_fields()) for a in nodes]
    if ports is not None:  # a named pool here: its nodes on loopback, where nothing listens
        hosts = [dataclasses.replace(h, address="127.0.0.1", port=p) for h, p in zip(hosts, ports, strict=True)]
    cluster = SSHCluster(spec, "ab12cd34", [], kind="aws", describe_extra=lambda: {"stack": cloud.describe()})
    for a, host in zip(nodes, hosts, strict=True):
        cluster._nodes[a.index] = _Node(
            a.index, host, agent_pid=4000 + a.index, agent_port=41000, home="/home/ubuntu",
            agent_python=".skyward/envs/abc/bin/python", pool_dir=f"/tmp/skyward/ab12cd34/{a.index}",
            endpoint=NodeEndpoint(a.index, a.private_ip, a.address, a.hostname, _unconnected))
    cluster.table.next = len(nodes)
    return cluster


def memory_per_node(n: int) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    ws, cloud, nodes, _ = come_up(n)
    cluster = _cluster(_spec(n), cloud, nodes)
    for store in (ws.plans, ws.configs, ws.history, ws.states, ws.booted, ws.settings_bytes):
        store.clear()  # the fake workspace's own copies: the cloud keeps those, not the client
    ws.argv.clear()
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    del cluster, nodes, cloud, ws
    gc.collect()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    spec = _spec(n)
    spec.provider.preview(spec)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return {"kept_bytes_per_node": kept / n, "preview_peak_bytes_per_node": peak / n}


# -- skyward ls / status on a 1,000-node named pool -----------------------------------------------------
def named_pool(n: int) -> str:
    """Register an n-node AWS pool called "big" (as `skyward up` leaves it) and its last probe."""
    import socket

    from skyward.named import probe, registry

    name = "big"
    spec = _spec(n)
    _, cloud, nodes, _ = come_up(n, name=name)
    ports = [1 + (i % 1000) for i in range(n)]  # closed loopback ports: nothing is ever reached
    description = _cluster(spec, cloud, nodes, ports).describe()
    now = time.time()
    record = {
        "name": name, "id": "ab12cd34", "state": "running", "provider": "aws",
        "config": {"provider": "aws", "nodes": n, "ttl": 600,
                   "aws": {"detect_address": False, "allow_ssh_from": CIDRS}},
        "sources": ["skyward.toml"], "cluster": description,
        "owner": {"who": "bench", "pid": os.getpid(), "host": socket.gethostname()},
        "ephemeral": False, "created": now, "last_seen": now, "ttl": 600, "clients": [],
        "hourly_cost": 0.1008, "offer": f"aws: {n} node(s)", "skyward": sky.__version__,
    }
    registry.write(record)
    probe.save(record, [{"index": node["index"], "hostname": node["hostname"], "private_ip": node["private_ip"],
                         "reachable": True, "agent_pid": node["agent_pid"], "python": "3.12.3", "tasks": 0}
                        for node in description["nodes"]], at=time.time() - 300)
    return name


def command_seconds(args: list[str], reps: int) -> float:
    exe = str(Path(sys.executable).parent / "skyward")
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        done = subprocess.run([exe, *args], capture_output=True, text=True, env=os.environ.copy())
        times.append(time.perf_counter() - t0)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"skyward {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,3000,5000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--listed", type=int, default=1000, help="nodes of the pool ls/status look at")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    out: dict[str, Any] = {"cpus": os.cpu_count(), "load": os.getloadavg()[0], "python": sys.version.split()[0]}
    print(f"{out['cpus']} CPUs, load {out['load']:.2f}, Python {out['python']}")

    print("\npreview                              seconds   ms/node")
    out["preview"] = {}
    for cloud in ("aws", "gcp"):
        warm = preview_warm(sizes, args.reps, cloud)
        out["preview"][cloud] = {n: {"seconds": s, "ms_per_node": 1000 * s / n} for n, s in warm.items()}
        for n, s in warm.items():
            print(f"  {cloud.upper()} {n:>5} nodes                {s:8.3f}  {1000 * s / n:8.3f}")
    cold = preview_cold(sizes[0])
    out["preview_cold"] = {"aws": {sizes[0]: {"seconds": cold, "ms_per_node": 1000 * cold / sizes[0]}}}
    print(f"  AWS {sizes[0]:>5} nodes, new process   {cold:8.3f}  {1000 * cold / sizes[0]:8.3f}   (imports included)")

    big = max(sizes)
    ws, _, nodes, up = come_up(big)
    longest = max(len(a.encode()) for argv in ws.argv for a in argv)
    out["up"] = {"nodes": big, "seconds": up, "ms_per_node": 1000 * up / big, "longest_argument_bytes": longest,
                 "settings_file_bytes": max(ws.settings_bytes.values())}
    print(f"\nplan + up through the fake workspace: {big} nodes in {up:.2f} s ({1000 * up / big:.3f} ms/node); "
          f"longest CLI argument {longest} bytes; config in the settings file: "
          f"{max(ws.settings_bytes.values()) / 1e6:.2f} MB")
    del ws, nodes

    mem = memory_per_node(big)
    out["memory"] = {"nodes": big, **mem}
    print(f"\nclient memory: {mem['kept_bytes_per_node'] / 1024:.2f} KiB kept per node of an up pool; "
          f"preview peak {mem['preview_peak_bytes_per_node'] / 1024:.2f} KiB per node ({big} nodes)")

    name = named_pool(args.listed)
    ls = command_seconds(["ls"], args.reps)
    status = command_seconds(["status", name], args.reps)
    out["cli"] = {"nodes": args.listed, "ls_seconds": ls, "status_seconds": status}
    print(f"\n{args.listed}-node named pool: skyward ls {ls:.3f} s, skyward status {status:.3f} s "
          f"(from its last probe)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
