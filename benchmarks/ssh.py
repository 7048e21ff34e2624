"""SSH-provider benchmarks on real sshd hosts (tests/sshhosts.py: one network namespace per host
when run as root, sshd on loopback addresses otherwise).

    .venv/bin/python benchmarks/ssh.py [--quick] [--json PATH]

* enter -> first result on 4 hosts, cold (fresh hosts: empty home, nothing installed; the
  client's own caches warm) and warm (the same hosts again: every phase skipped)
* enter time on 16 hosts vs 4 (cold), the parallel-bootstrap ratio (target <= 2x)
* no-op `>>` round trip through the SSH tunnel (target <= 1 ms median)
* 100 MB argument through the tunnel (target >= 300 MB/s), and 100 MB back (a result)
* the same over a direct connection (sky.SSH(direct=True): plain TCP to the agent on the
  host's private address, token-checked)

The same round trip and 100 MB on a Local node are measured in the same run, as the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}

    # Warm the client's caches (wheels, the skyward wheel) on one throwaway host first: the
    # figures below are about the nodes.
    with SSHHosts(1) as warmup:
        enter_to_first_result(warmup)

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

    width = max(len(k) for k in results)
    for k, v in results.items():
        print(f"{k:<{width}}  {v:.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
