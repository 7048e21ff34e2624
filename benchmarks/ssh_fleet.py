"""SSH pools of many hosts (tests/sshhosts.py netns hosts; root).

    .venv/bin/python benchmarks/ssh_fleet.py [--rounds N] [--json PATH] [--only home|fleet|relay] [--fleet 4,16,32]
                                             [--direct] [--fanout] [--relay-hosts N]
                                             [--no-bytecode-cache]

home: enter time of a pool on 3 hosts that share one home directory (an NFS-mounted home, as on
lab clusters) against 3 hosts with a home each, cold and warm. cold: fresh hosts, nothing
installed on them (the client's own caches warm, as in ssh.py); warm: the same hosts again, every
phase skipped. On a shared home one host builds the environment while the others wait on its
lock, so the cold figure should be close to one host's.

fleet: on 4, 16 and 32 hosts (a shared home, installed once, not timed), what the client pays
per node, each figure in a fresh client process as a new program or `skyward exec` would be:
* warm enter: enter -> first result of a no-op on every node, wall time, the client's CPU
  (time.process_time: every thread of the process, user + system; imports done before) and the
  SSH packets it sent and read (pkts/host; with --fanout and no --direct the relayed links go
  through the first host's multiplexer, or with SKYWARD_SSH_MUX=0 a channel each);
* exec: attach to the running pool by its description (as `skyward exec NAME` does) and run a
  shell command on every node (with --direct, the pools are sky.SSH(direct=True): the agents
  answer on their direct ports and the attach logs into no host; with --fanout,
  sky.SSH(fanout=True): the enter logs into the first host only, which starts the others, and
  without --direct carries the client's links to their agents);
* map: items/s of a no-op over 100,000 items on the pool, and the client's CPU per 100,000;
* idle: the client's CPU per second while the open pool does nothing (3 s), per node: what
  keeping a large pool open costs (the connections, the nodes' metrics);
* the floor: a login and one command on each host, in parallel (what any start over SSH costs).
The client's CPU per node is given as total / hosts and as the slope between the smallest and
the largest fleet (what one more node costs), and a 1,000-node pool is estimated from the
slope and the fixed part (the intercept).

relay: a sky.SSH(fanout=True) pool (no direct) on --relay-hosts hosts whose first host's SSH
connection breaks (closed by the client): the time until every node answers again, the client's
logins meanwhile and its CPU, with the other agents reached again through the new connection
(rejoined) and, in turns, with each restarted in place through a login of its own (as before).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
from _home import bytecode_env, count_packets, scratch_home  # noqa: E402

scratch_home()

from sshhosts import SSHHosts  # noqa: E402

import skyward as sky  # noqa: E402

QUIET = sky.Options(console=False)


@sky.function
def noop() -> None:
    return None


# sky.SSH(direct=True) for the fleet's pools (--direct): the client reaches the agents over TCP on
# the hosts' private addresses, and an attach (exec) logs into no host.
# With --fanout also fanout=True: the enter logs into the first host, which starts the others
# (and, without --direct, carries the client's links to their agents).
DIRECT = {"direct": False, "fanout": False}


def provider(hosts: SSHHosts) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts], **DIRECT)


def enter(hosts: SSHHosts) -> float:
    t0 = time.perf_counter()
    with sky.Compute(provider=provider(hosts), nodes=len(hosts), options=QUIET) as pool:
        noop() @ pool
        return time.perf_counter() - t0


def measure(shared_home: bool, rounds: int) -> dict[str, float]:
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(rounds):
        with SSHHosts(3, mode="netns", shared_home=shared_home) as hosts:
            cold.append(enter(hosts))
            warm.extend(enter(hosts) for _ in range(3))
    return {"cold_s": statistics.median(cold), "warm_s": statistics.median(warm)}


# -- fleet: the client's CPU per node ---------------------------------------------------------------
IDLE_S = 3.0  # how long an open pool is left idle to measure what it costs the client meanwhile
def identity(x: Any) -> Any:
    return x


def _client(what: str, hosts: list[dict[str, Any]], description: dict[str, Any] | None,
            direct: bool = False, fanout: bool = False) -> dict[str, Any]:
    """In a fresh client process: one warm enter (or one exec), timed and its CPU counted."""
    import fabric  # noqa: F401  (imports are the program's, once: not a per-node cost)
    import paramiko  # noqa: F401

    import skyward.bootstrap.remote
    import skyward.bootstrap.routes  # noqa: F401
    from skyward.core.pool import Pool
    from skyward.named.nodeops import run_shell

    ssh = sky.SSH(hosts=[sky.SSHHost(**h) for h in hosts], direct=direct, fanout=fanout)
    out: dict[str, Any] = {}
    if what == "floor":
        cpu0 = time.process_time()
        out["floor_s"] = _floor(hosts)
        out["floor_cpu_s"] = time.process_time() - cpu0
        return out
    packets = count_packets()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if what == "enter":
        with sky.Compute(provider=ssh, nodes=len(hosts), options=QUIET) as pool:
            noop() @ pool
            out["enter_s"], out["enter_cpu_s"] = time.perf_counter() - wall0, time.process_time() - cpu0
            out["enter_packets"] = float(packets[0])
            items = range(100_000)
            pool.map(identity, range(10_000))
            cpu1, wall1 = time.process_time(), time.perf_counter()
            pool.map(identity, items)
            out["map_items_per_s"] = len(items) / (time.perf_counter() - wall1)
            out["map_cpu_s"] = time.process_time() - cpu1
            time.sleep(0.5)  # (the map's last events delivered)
            cpu2, wall2 = time.process_time(), time.perf_counter()
            time.sleep(IDLE_S)
            out["idle_cpu_per_s"] = (time.process_time() - cpu2) / (time.perf_counter() - wall2)
    else:
        assert description is not None
        spec = sky.Spec(provider=ssh, nodes=len(hosts))
        pool = Pool(spec, QUIET, sky.Worker(), cluster=ssh.attach(description))
        try:
            results = sky.function(run_shell)("hostname", 30) @ pool
            assert all(r["exit_code"] == 0 for r in results), results
        finally:
            pool.close()
        out["exec_s"], out["exec_cpu_s"] = time.perf_counter() - wall0, time.process_time() - cpu0
    return out


def _floor(hosts: list[dict[str, Any]]) -> float:
    from concurrent.futures import ThreadPoolExecutor

    from skyward.bootstrap.remote import Remote, Target

    def one(h: dict[str, Any]) -> None:
        remote = Remote(Target(h["address"], h["port"], h["user"], h["key"])).open()
        try:
            remote.run("true")
        finally:
            remote.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(hosts)) as ex:
        list(ex.map(one, hosts))
    return time.perf_counter() - t0


# The client processes run with compiled bytecode, as an installed package has it (_home's
# bytecode_env, set in main): without it, the modules a pool loads while it enters are compiled in
# every client, and that compiling was counted as the enter's CPU (--no-bytecode-cache measures
# it so).
CHILD_ENV: dict[str, str] = {}


def _in_child(what: str, hosts: list[dict[str, Any]], description: dict[str, Any] | None = None) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps([what, hosts, description, DIRECT["direct"], DIRECT["fanout"]])],
                          capture_output=True, text=True, timeout=600, env=CHILD_ENV or os.environ.copy())
    if done.returncode != 0:
        raise RuntimeError(f"the client process failed ({what}):\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def fleet(sizes: list[int], rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    cache_empty = bool(CHILD_ENV)
    for n in sizes:
        with SSHHosts(n, mode="netns", shared_home=True) as hosts:
            spec = [{"address": h.address, "port": h.port, "user": h.user, "key": str(h.key_path)} for h in hosts]
            enter(hosts)  # installs (not timed)
            ssh = provider(hosts)
            cluster = ssh.create(sky.Spec(provider=ssh, nodes=n), f"fleetbench{n:03d}")
            cluster.start(n)
            description = json.loads(json.dumps(cluster.describe()))
            cluster.detach()
            runs: list[dict[str, Any]] = []
            try:
                if cache_empty:  # one client of each kind fills the bytecode cache, not counted
                    _in_child("enter", spec)
                    _in_child("exec", spec, description)
                    _in_child("floor", spec)
                    cache_empty = False
                for _ in range(rounds):
                    runs.append({**_in_child("enter", spec), **_in_child("exec", spec, description),
                                 **_in_child("floor", spec)})
            finally:
                ssh.destroy(description)
        results[str(n)] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"  {n} hosts: {results[str(n)]}  (load {os.getloadavg()[0]:.2f})", flush=True)
    return results


def _relay_loss(hosts: SSHHosts, rejoin: bool) -> dict[str, float]:
    """One break of the first host's connection in a fan-out pool: until all answer again."""
    from skyward.bootstrap import remote as remote_mod
    from skyward.providers.ssh import SSHCluster

    logins: list[str] = []
    login, rejoined = remote_mod.Remote._login, SSHCluster._rejoin

    def counted(remote: Any) -> Any:
        logins.append(remote.target.host)
        return login(remote)

    remote_mod.Remote._login = counted  # type: ignore[method-assign]
    if not rejoin:
        SSHCluster._rejoin = lambda self, node, old: None  # type: ignore[method-assign]
    try:
        ssh = sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                             for h in hosts], fanout=True)
        with sky.Compute(provider=ssh, nodes=len(hosts), options=QUIET) as pool:
            names = sorted(where() @ pool)
            nodes = pool.cluster.table.nodes  # type: ignore[attr-defined]
            remote_mod.close_parked()  # (connections earlier pools left: a restart would take them)
            logins.clear()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            nodes[0].remote.close()
            while True:
                time.sleep(0.05)
                if len(nodes) == len(hosts) and 0 not in nodes and all(n.endpoint for n in nodes.values()):
                    try:
                        if sorted(where() @ pool) == names:
                            break
                    except Exception:
                        pass
                if time.perf_counter() - wall0 > 300:
                    raise RuntimeError("the pool did not come back in 300 s")
            return {"back_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0,
                    "logins": float(len(logins))}
    finally:
        remote_mod.Remote._login = login  # type: ignore[method-assign]
        SSHCluster._rejoin = rejoined  # type: ignore[method-assign]


@sky.function
def where() -> str:
    import socket

    return socket.gethostname()


def relay(n: int, rounds: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {"rejoined": [], "restarted": []}
    with SSHHosts(n, mode="netns", shared_home=True) as hosts:
        enter(hosts)  # installs (not timed)
        for _ in range(rounds):
            for name in runs:
                runs[name].append(_relay_loss(hosts, rejoin=name == "rejoined"))
    out = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"{n} hosts, the first host's connection broken ({rounds} rounds, medians):")
    print(f"{'':>11}{'back in s':>11}{'logins':>8}{'client CPU s':>14}")
    for name, r in out.items():
        print(f"{name:>11}{r['back_s']:>11.2f}{r['logins']:>8.0f}{r['cpu_s']:>14.3f}")
    return out


def report_fleet(results: dict[str, Any]) -> None:
    print(f"{'hosts':>6}{'enter s':>9}{'floor s':>9}{'enter ms/host':>15}{'pkts/host':>11}{'exec s':>8}"
          f"{'exec ms/host':>14}{'map items/s':>13}{'map CPU s/100k':>16}{'idle ms/s/host':>16}")
    for n, r in results.items():
        print(f"{n:>6}{r['enter_s']:>9.2f}{r['floor_s']:>9.2f}{r['enter_cpu_s'] / int(n) * 1e3:>15.1f}"
              f"{r['enter_packets'] / int(n):>11.1f}{r['exec_s']:>8.2f}{r['exec_cpu_s'] / int(n) * 1e3:>14.1f}"
              f"{r['map_items_per_s']:>13,.0f}{r['map_cpu_s']:>16.3f}{r['idle_cpu_per_s'] / int(n) * 1e3:>16.2f}")
    sizes = sorted(int(n) for n in results)
    if len(sizes) >= 2:
        lo, hi = results[str(sizes[0])], results[str(sizes[-1])]
        for key in ("enter_cpu_s", "exec_cpu_s"):
            slope = (hi[key] - lo[key]) / (sizes[-1] - sizes[0])
            fixed = lo[key] - slope * sizes[0]
            print(f"{key[:-6]}: {slope * 1e3:.1f} ms of client CPU per added node, {fixed:.2f} s fixed; "
                  f"1,000 nodes ~ {fixed + 1000 * slope:.1f} s of client CPU")
            results[f"{key[:-6]}_ms_per_added_node"] = slope * 1e3
            results[f"{key[:-6]}_cpu_s_1000_nodes_estimate"] = fixed + 1000 * slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="fresh host sets per layout, runs per fleet (default 3)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--only", choices=("home", "fleet", "relay"), help="one of the parts")
    parser.add_argument("--fleet", default="4,16,32", help="fleet sizes (default 4,16,32)")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="clients compile what they import (as before 2026-12-03's runs)")
    parser.add_argument("--direct", action="store_true",
                        help="the fleet's pools with sky.SSH(direct=True): an exec attaches without logins")
    parser.add_argument("--fanout", action="store_true",
                        help="sky.SSH(fanout=True): the first host starts the others (without --direct it "
                             "also carries the client's links to their agents)")
    parser.add_argument("--relay-hosts", type=int, default=16, help="hosts of the relay part (default 16)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_client(*json.loads(args.child))))
        return
    DIRECT["direct"], DIRECT["fanout"] = args.direct, args.fanout
    if not args.no_bytecode_cache:
        CHILD_ENV.update(bytecode_env("skyward-fleet-pyc-"))
    print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"({os.cpu_count()} CPUs)")
    with SSHHosts(1, mode="netns") as warmup:  # the client's caches (wheelhouse, uv) are built once
        enter(warmup)
    results: dict[str, Any] = {}
    if args.only in (None, "home"):
        results["home"] = {
            "separate homes": measure(False, args.rounds),
            "shared home": measure(True, args.rounds),
        }
        print(f"{'3 hosts':<16}{'cold enter (s)':>16}{'warm enter (s)':>16}")
        for name, r in results["home"].items():
            print(f"{name:<16}{r['cold_s']:>16.2f}{r['warm_s']:>16.2f}")
    if args.only in (None, "fleet"):
        results["fleet"] = fleet([int(n) for n in args.fleet.split(",")], args.rounds)
        report_fleet(results["fleet"])
    if args.only in (None, "relay"):
        results["relay"] = relay(args.relay_hosts, args.rounds)
    print(f"load average at end: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
