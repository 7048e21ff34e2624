"""SSH-provider benchmarks on real sshd hosts (tests/sshhosts.py: one network namespace per host
when run as root, sshd on loopback addresses otherwise).

    .venv/bin/python benchmarks/ssh.py [--quick] [--json PATH] [--rounds N] [--against REV] [--only-three]

* enter -> first result on 4 hosts, cold (fresh hosts: empty home, nothing installed; the
  client's own caches warm) and warm (the same hosts again: every phase skipped)
* enter time on 16 hosts vs 4 (cold), the parallel-bootstrap ratio (target <= 2x)
* no-op `>>` round trip through the SSH tunnel (target <= 1 ms median)
* 100 MB argument through the tunnel (target >= 300 MB/s), and 100 MB back (a result)
* the same over a direct connection (sky.SSH(direct=True): plain TCP to the agent on the
  host's private address, token-checked)
* a pool of 3 hosts: enter and enter -> first result, warm (median of
  --rounds) and on fresh hosts (client caches warm), beside the floor of any start over SSH in
  the same run: a login and one command on each of the 3 hosts, in parallel; and what the pool
  asks of each host, counted on the wire per phase (tests/ssh/wire.py: logins, sessions,
  commands, channels to the agent). With ``--against REV`` the code of git revision REV does the
  same on 3 hosts of its own, alternating with this tree's runs (before/after in one run).

The same round trip and 100 MB on a Local node are measured in the same run, as the baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
from _home import scratch_home  # noqa: E402

scratch_home()

import numpy as np  # noqa: E402
from sshhosts import SSHHosts  # noqa: E402

import skyward as sky  # noqa: E402


def _wire() -> Any:
    """tests/ssh/wire.py (by its path: this script is itself a module named ssh)."""
    import importlib.util

    found = importlib.util.spec_from_file_location("skyward_tests_wire", HERE.parent / "tests" / "ssh" / "wire.py")
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module.Wire


Wire = _wire()

QUIET = sky.Options(console=False)


@sky.function
def noop() -> None:
    return None


@sky.function
def size_of(data: Any) -> int:
    return int(data.nbytes)


@sky.function
def blob_of(n: int) -> Any:
    """A node's cached array of n random bytes: the result direction (making it is not timed)."""
    import builtins

    import numpy

    # A function of this script travels by value: its globals are new on every call. The
    # worker's builtins module is the same from one call to the next.
    cached = builtins.__dict__.setdefault("_skyward_bench_blobs", {})
    if n not in cached:
        cached[n] = numpy.frombuffer(os.urandom(n), dtype=numpy.uint8)
    return cached[n]


def provider(hosts: SSHHosts, direct: bool = False) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts], direct=direct)


def enter_to_first_result(hosts: SSHHosts) -> float:
    t0 = time.perf_counter()
    with sky.Compute(provider=provider(hosts), nodes=len(hosts), options=QUIET) as pool:
        noop() >> pool
        return time.perf_counter() - t0


def transport(pool: Any, label: str, quick: bool) -> dict[str, float]:
    """No-op round trip (median, p90), 100 MB argument and 100 MB result throughput on one
    node of ``pool``."""
    for _ in range(200):
        noop() >> pool
    lat = []
    for _ in range(500 if quick else 3000):
        t = time.perf_counter()
        noop() >> pool
        lat.append(time.perf_counter() - t)
    lat.sort()
    # A NumPy array travels out of band (no copy into the pickle); random bytes do not
    # compress, so lz4 stays out of the way.
    blob = np.frombuffer(os.urandom(100 * 1000 * 1000), dtype=np.uint8)
    size_of(blob) >> pool
    rates = []
    for _ in range(2 if quick else 5):
        t = time.perf_counter()
        assert (size_of(blob) >> pool) == len(blob)
        rates.append(len(blob) / (time.perf_counter() - t) / 1e6)
    blob_of(len(blob)) >> pool
    back = []
    for _ in range(2 if quick else 5):
        t = time.perf_counter()
        assert len(blob_of(len(blob)) >> pool) == len(blob)
        back.append(len(blob) / (time.perf_counter() - t) / 1e6)
    return {
        f"{label}_roundtrip_median_ms": lat[len(lat) // 2] * 1e3,
        f"{label}_roundtrip_p90_ms": lat[int(len(lat) * 0.9)] * 1e3,
        f"{label}_100MB_MBps": statistics.median(rates),
        f"{label}_100MB_back_MBps": statistics.median(back),
    }


# -- a pool of 3 hosts: enter, counted -------------------------------------------------------------
def spec(hosts: Any) -> list[dict[str, Any]]:
    return [{"address": h.address, "port": h.port, "user": h.user, "key": str(h.key_path)} for h in hosts]


def counted_enter(hosts: list[dict[str, Any]]) -> dict[str, Any]:
    """One pool on ``hosts``: enter, enter -> first result, exit; and the wire counts per phase."""
    ssh = sky.SSH(hosts=[sky.SSHHost(**h) for h in hosts])
    with Wire() as wire, contextlib.ExitStack() as stack:
        t0 = time.perf_counter()
        with wire.phase("enter"):
            pool = stack.enter_context(sky.Compute(provider=ssh, nodes=len(hosts), options=QUIET))
        entered = time.perf_counter() - t0
        with wire.phase("first result"):
            noop() >> pool
        first = time.perf_counter() - t0
        with wire.phase("exit"):
            stack.close()
    addresses = [h["address"] for h in hosts]
    return {"enter_s": entered, "first_result_s": first, "wire": wire.table(addresses)}


def floor(hosts: list[dict[str, Any]]) -> float:
    """The least any start over SSH costs: a login and one command on each host, in parallel."""
    from skyward.bootstrap.remote import Remote, Target, close_parked

    close_parked()

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


class Before:
    """The code of git revision ``rev`` in a process of its own (its tree on PYTHONPATH, this
    script as the driver: ``--serve``), entering pools when asked, on hosts of its own."""

    def __init__(self, rev: str) -> None:
        repo = HERE.parent
        self.rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", rev], check=True,
                                  capture_output=True, text=True).stdout.strip()
        self.tree = tempfile.mkdtemp(prefix="skyward-bench-before-")
        archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "skyward", "bootstrap", "providers",
                                  "stacks"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", self.tree], input=archive, check=True)
        env = dict(os.environ, PYTHONPATH=self.tree)
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, what: str, hosts: list[dict[str, Any]]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([what, hosts]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the driver of {self.rev} stopped")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.tree, ignore_errors=True)


def logged_in(hosts: list[dict[str, Any]]) -> dict[str, Any]:
    """``counted_enter`` with no connection kept from an earlier pool (as in a new process)."""
    from skyward.bootstrap import remote

    if hasattr(remote, "close_parked"):  # (code from before connections were kept has none)
        remote.close_parked()
    return counted_enter(hosts)


def serve() -> int:
    """``--serve``: answer [what, hosts] lines with JSON ("enter": ``logged_in``)."""
    for line in sys.stdin:
        what, hosts = json.loads(line)
        assert what == "enter"
        print(json.dumps(logged_in(hosts)), flush=True)
    return 0


def three_hosts(results: dict[str, Any], rounds: int, cold_rounds: int, against: str | None) -> None:
    """A pool of 3 hosts, warm and fresh, beside the floor (and REV)."""
    before = Before(against) if against else None
    try:
        with contextlib.ExitStack() as stack:
            mine = spec(stack.enter_context(SSHHosts(3)))
            theirs = spec(stack.enter_context(SSHHosts(3))) if before else []
            cold: dict[str, list[dict[str, Any]]] = {"now": [], "before": []}
            for r in range(cold_rounds):
                # Fresh hosts each round (the first round's are the ones the warm runs use).
                if r:
                    mine = spec(stack.enter_context(SSHHosts(3)))
                    theirs = spec(stack.enter_context(SSHHosts(3))) if before else []
                order = [("now", mine), ("before", theirs)] if r % 2 == 0 else [("before", theirs), ("now", mine)]
                for who, hosts in order:
                    if who == "now":
                        cold["now"].append(logged_in(hosts))
                    elif before is not None:
                        cold["before"].append(before.ask("enter", hosts))
            # "kept": the pool before it left its connections (Remote.park): a program opening
            # pools one after another; "login": none kept, as in a new process.
            warm: dict[str, list[Any]] = {"kept": [], "login": [], "before": [], "floor": []}
            for r in range(rounds):
                steps = ["floor", "login", "before", "kept"]
                for who in steps[r % 4:] + steps[: r % 4]:
                    if who == "floor":
                        warm["floor"].append(floor(mine))
                    elif who == "login":
                        warm["login"].append(logged_in(mine))
                    elif who == "kept":
                        counted_enter(mine)  # (leaves its connections for the next)
                        warm["kept"].append(counted_enter(mine))
                    elif before is not None:
                        warm["before"].append(before.ask("enter", theirs))
    finally:
        if before is not None:
            before.close()

    def med(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    results["enter_3_warm_s"] = med(warm["login"], "enter_s")
    results["enter_3_warm_min_s"] = min(r["enter_s"] for r in warm["login"])
    results["enter_3_warm_first_result_s"] = med(warm["login"], "first_result_s")
    results["enter_3_warm_kept_s"] = med(warm["kept"], "enter_s")
    results["enter_3_warm_kept_min_s"] = min(r["enter_s"] for r in warm["kept"])
    results["enter_3_warm_kept_first_result_s"] = med(warm["kept"], "first_result_s")
    results["enter_3_floor_s"] = statistics.median(warm["floor"])
    results["enter_3_cold_s"] = med(cold["now"], "enter_s")
    results["enter_3_cold_first_result_s"] = med(cold["now"], "first_result_s")
    if before is not None:
        results["before"] = before.rev
        results["enter_3_warm_before_s"] = med(warm["before"], "enter_s")
        results["enter_3_warm_first_result_before_s"] = med(warm["before"], "first_result_s")
        results["enter_3_cold_before_s"] = med(cold["before"], "enter_s")
        results["enter_3_cold_first_result_before_s"] = med(cold["before"], "first_result_s")
    results["round_trips_warm"] = " | ".join(warm["login"][-1]["wire"])
    results["round_trips_warm_kept"] = " | ".join(warm["kept"][-1]["wire"])
    results["round_trips_cold"] = " | ".join(cold["now"][-1]["wire"])
    if before is not None:
        results["round_trips_warm_before"] = " | ".join(warm["before"][-1]["wire"])
        results["round_trips_cold_before"] = " | ".join(cold["before"][-1]["wire"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--rounds", type=int, default=None, help="warm enters of the 3-host pool (default 7; 3 quick)")
    parser.add_argument("--against", default=None, metavar="REV", help="also run the code of this git revision")
    parser.add_argument("--only-three", action="store_true", help="the 3-host pool only")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve()
    results: dict[str, Any] = {}

    # Warm the client's caches (wheels, the skyward wheel) on one throwaway host first: the
    # figures below are about the nodes.
    with SSHHosts(1) as warmup:
        enter_to_first_result(warmup)
        if args.against:  # the other code's caches too (its own skyward wheel)
            warm_before = Before(args.against)
            try:
                warm_before.ask("enter", spec(warmup))
            finally:
                warm_before.close()

    rounds = args.rounds or (3 if args.quick else 7)
    three_hosts(results, rounds, 1 if args.quick else 3, args.against)
    if args.only_three:
        return report(results, args.json)

    with SSHHosts(4) as hosts:
        results["mode"] = hosts.mode
        results["enter_4_cold_s"] = enter_to_first_result(hosts)
        results["enter_4_warm_s"] = statistics.median(enter_to_first_result(hosts) for _ in range(3))
        numpy = sky.Image(pip=[f"numpy=={np.__version__}"])
        with sky.Compute(provider=provider(hosts), nodes=1, image=numpy, options=QUIET) as pool:
            results.update(transport(pool, "ssh", args.quick))
        with sky.Compute(provider=provider(hosts, direct=True), nodes=1, image=numpy, options=QUIET) as pool:
            results.update(transport(pool, "ssh_direct", args.quick))
    # The baseline of the same run: the same calls to a Local node (loopback TCP, /dev/shm).
    with sky.Compute(nodes=1, options=QUIET) as pool:
        results.update(transport(pool, "local", args.quick))

    if not args.quick:
        with SSHHosts(4) as four:
            results["enter_4_cold_again_s"] = enter_to_first_result(four)
        with SSHHosts(16) as sixteen:
            results["enter_16_cold_s"] = enter_to_first_result(sixteen)
        base = min(results["enter_4_cold_s"], results["enter_4_cold_again_s"])
        results["enter_16_vs_4"] = results["enter_16_cold_s"] / base

    return report(results, args.json)


def report(results: dict[str, Any], path: str | None) -> int:
    width = max(len(k) for k in results)
    for k, v in results.items():
        print(f"{k:<{width}}  {v:.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if "enter_3_warm_s" in results:
        print()
        print(f"3 hosts, warm, the connections the pool before left: enter {results['enter_3_warm_kept_s']:.3f} s "
              f"(min {results['enter_3_warm_kept_min_s']:.3f}), first result "
              f"{results['enter_3_warm_kept_first_result_s']:.3f} s")
        print(f"3 hosts, warm, new logins: enter {results['enter_3_warm_s']:.3f} s (min {results['enter_3_warm_min_s']:.3f}), "
              f"first result {results['enter_3_warm_first_result_s']:.3f} s; the floor (a login and one "
              f"command on each host, in parallel) {results['enter_3_floor_s']:.3f} s"
              + (f"; {results['before']}: enter {results['enter_3_warm_before_s']:.3f} s, first result "
                 f"{results['enter_3_warm_first_result_before_s']:.3f} s" if "before" in results else ""))
        print(f"3 fresh hosts: enter {results['enter_3_cold_s']:.3f} s, first result "
              f"{results['enter_3_cold_first_result_s']:.3f} s"
              + (f"; {results['before']}: enter {results['enter_3_cold_before_s']:.3f} s, first result "
                 f"{results['enter_3_cold_first_result_before_s']:.3f} s" if "before" in results else ""))
        for key, label in (("round_trips_warm_kept", "warm, connections kept"), ("round_trips_warm", "warm"),
                           ("round_trips_cold", "fresh"),
                           ("round_trips_warm_before", f"warm, {results.get('before')}"),
                           ("round_trips_cold_before", f"fresh, {results.get('before')}")):
            if key in results:
                print(f"round trips per host ({label}): {results[key]}")
    if path:
        Path(path).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
