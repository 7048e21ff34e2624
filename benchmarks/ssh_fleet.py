"""Enter time of an SSH pool on 3 hosts that share one home directory (an NFS-mounted home, as on
lab clusters) against 3 hosts with a home each, cold and warm (tests/sshhosts.py hosts; root).

    .venv/bin/python benchmarks/ssh_fleet.py [--rounds N] [--json PATH]

cold: fresh hosts, nothing installed on them (the client's own caches warm, as in ssh.py); warm:
the same hosts again, every phase skipped. On a shared home one host builds the environment
while the others wait on its lock, so the cold figure should be close to one host's.
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
from _home import scratch_home  # noqa: E402

scratch_home()

from sshhosts import SSHHosts  # noqa: E402

import skyward as sky  # noqa: E402

QUIET = sky.Options(console=False)


@sky.function
def noop() -> None:
    return None


def provider(hosts: SSHHosts) -> sky.SSH:
    return sky.SSH(hosts=[sky.SSHHost(address=h.address, port=h.port, user=h.user, key=str(h.key_path))
                          for h in hosts])


def enter(hosts: SSHHosts) -> float:
    t0 = time.perf_counter()
    with sky.Compute(provider=provider(hosts), nodes=len(hosts), options=QUIET) as pool:
        noop() @ pool
        return time.perf_counter() - t0


def measure(shared_home: bool, rounds: int) -> dict[str, float]:
    cold, warm = [], []
    for _ in range(rounds):
        with SSHHosts(3, mode="netns", shared_home=shared_home) as hosts:
            cold.append(enter(hosts))
            warm.extend(enter(hosts) for _ in range(3))
    return {"cold_s": statistics.median(cold), "warm_s": statistics.median(warm)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="fresh host sets per layout (default 3)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    with SSHHosts(1, mode="netns") as warmup:  # the client's caches (wheelhouse, uv) are built once
        enter(warmup)
    results: dict[str, Any] = {
        "separate homes": measure(False, args.rounds),
        "shared home": measure(True, args.rounds),
    }
    print(f"{'3 hosts':<16}{'cold enter (s)':>16}{'warm enter (s)':>16}")
    for name, r in results.items():
        print(f"{name:<16}{r['cold_s']:>16.2f}{r['warm_s']:>16.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
