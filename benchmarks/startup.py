"""Start-up: a fresh interpreter to its first result, and `import skyward`, beside the peers.

    .venv/bin/python benchmarks/startup.py [--rounds N] [--json PATH] [--systems NAMES] [--against REV]

Each measurement runs in a new interpreter, as a user's script would: it imports the system,
opens 2 workers (sky.Compute(nodes=2) on sky.Local(), ProcessPoolExecutor(2), loky, Ray with
2 CPUs, a Dask LocalCluster of 2 worker processes), runs one trivial task, and reports the
time from the start of the script (after the interpreter itself started) to that result.
Peers that are not installed are left out. Rounds interleave the systems; the table shows
medians, skyward's against PPE's (target: at most 1.5x), and the machine's load average
before and after: on a shared machine the others' work slows every system. `import skyward`
is timed the same way, beside a bare interpreter, and so are the floors under any client that
sends a script's functions: `import cloudpickle`, and every module a client loads before it can
start a Local pool (beside PPE's own import).

The interpreters run with compiled bytecode, as an installed package has it: they write and
read .pyc files in a cache folder of this run's (PYTHONPYCACHEPREFIX, even where
PYTHONDONTWRITEBYTECODE is set), filled by one untimed run of each program first. Without it
every interpreter compiles skyward's sources again (about 0.1 s more here); --no-bytecode-cache
measures that. ``--against REV`` also runs skyward's program with the code of git revision REV
(its tree on PYTHONPATH) as the system ``skyward@REV``, in the same interleaved rounds: a
change's effect beside this VM's drift.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _home import bytecode_env  # noqa: E402

PROGRAMS = {
    "skyward": """
        import skyward as sky

        @sky.function
        def one() -> int:
            return 1

        mark("open")
        with sky.Compute(nodes=2, options=sky.Options(console=False, logging=False)) as pool:
            assert one() >> pool == 1
            mark("first")
        # A pool that scales to zero, asleep: its first task wakes it (starts the head node).
        with sky.Compute(nodes=(0, 2), options=sky.Options(console=False, logging=False)) as asleep:
            mark("wake")
            assert one() >> asleep == 1
            mark("woke")
    """,
    "PPE": """
        from concurrent.futures import ProcessPoolExecutor
        import _work

        with ProcessPoolExecutor(2) as ex:
            ex.submit(_work.noop).result()
            mark("first")
    """,
    "loky": """
        from joblib.externals.loky import get_reusable_executor
        import _work

        ex = get_reusable_executor(max_workers=2)
        ex.submit(_work.noop).result()
        mark("first")
        ex.shutdown(wait=True, kill_workers=True)
    """,
    "Ray": """
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")

        @ray.remote
        def one():
            return 1

        assert ray.get(one.remote()) == 1
        mark("first")
        ray.shutdown()
    """,
    "Dask": """
        from dask.distributed import Client, LocalCluster
        import _work

        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            with Client(cluster) as client:
                client.submit(_work.noop).result()
                mark("first")
    """,
}
NEEDS = {"loky": "joblib", "Ray": "ray", "Dask": "distributed"}

PRELUDE = """
import json, sys, time
T0 = time.perf_counter()
sys.path.insert(0, {here!r})
MARKS = {{}}
def mark(name):
    MARKS[name] = time.perf_counter() - T0
"""
EPILOGUE = """
print("MARKS " + json.dumps(MARKS), flush=True)
"""

IMPORTS = {
    "python": "pass",
    "import skyward": "import skyward",
    "import skyward; sky.Compute": "import skyward as sky; sky.Compute",
    # The floor under any client that sends functions defined in a script: cloudpickle's own
    # import (with what it loads: dataclasses, inspect, typing, logging, platform, uuid), beside
    # PPE's (``concurrent.futures.process``).
    "import cloudpickle": "import cloudpickle",
    # everything a client loads before it can start a Local pool (cloudpickle included)
    "the pool's modules": "import skyward as sky; sky.Compute; import skyward.core.pool, skyward.providers.local",
    "import concurrent.futures.process": "import concurrent.futures.process",
}


TARGET_VS_PPE = 1.5  # skyward's fresh interpreter -> first result, against PPE's in the run

ENV: dict[str, str] | None = None  # the interpreters' environment (see main); None: this one's


def _load(avg: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in avg)


def installed(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                          env=ENV).returncode == 0


def run_program(body: str, tree: str | None = None) -> dict[str, float]:
    """``body``'s marks, run in a fresh interpreter (``tree``: another revision's code first on
    its path)."""
    code = PRELUDE.format(here=str(HERE)) + textwrap.dedent(body) + EPILOGUE
    env = dict(ENV if ENV is not None else os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("MARKS "):
            marks: dict[str, float] = json.loads(line[6:])
            return marks
    raise RuntimeError(f"no result (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")


def time_import(statement: str) -> float:
    code = (f"import time; t = time.perf_counter(); {statement}; "
            "print((time.perf_counter() - t))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=ENV)
    return float(out.stdout.strip())


def revision_tree(rev: str) -> tuple[str, str]:
    """(short name, a temporary folder holding skyward's code as of git revision ``rev``)."""
    repo = HERE.parent
    short = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", rev], check=True,
                           capture_output=True, text=True).stdout.strip()
    tree = tempfile.mkdtemp(prefix="skyward-startup-before-")
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "skyward", "bootstrap", "providers", "stacks"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return short, tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--systems", metavar="NAMES",
                        help="comma-separated systems to run (default: all installed), e.g. skyward,PPE")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="run the interpreters with this environment as it is (no .pyc cache of the run's)")
    parser.add_argument("--against", metavar="REV", help="also run skyward's program with the code of this git revision")
    args = parser.parse_args(argv)
    global ENV
    if not args.no_bytecode_cache:
        ENV = bytecode_env("skyward-startup-pyc-")
    wanted = args.systems.split(",") if args.systems else list(PROGRAMS)
    unknown = [s for s in wanted if s not in PROGRAMS]
    if unknown or "skyward" not in wanted:
        parser.error(f"--systems={args.systems}: name skyward and any of {', '.join(PROGRAMS)}")
    systems = [s for s in wanted if s not in NEEDS or installed(NEEDS[s])]
    trees: dict[str, str | None] = {s: None for s in systems}  # system -> another revision's code
    programs = {s: PROGRAMS[s] for s in systems}
    if args.against:
        short, tree = revision_tree(args.against)
        trees[f"skyward@{short}"] = tree
        programs[f"skyward@{short}"] = PROGRAMS["skyward"]
        systems.insert(1, f"skyward@{short}")
    cached = ENV is not None
    if cached:  # compile once, untimed, what the timed runs then load
        for s in systems:
            run_program(programs[s], trees[s])
        for stmt in IMPORTS.values():
            time_import(stmt)
    load_before = os.getloadavg()  # others' work on the machine slows every system, not alike
    first: dict[str, list[float]] = {s: [] for s in systems}
    entered: dict[str, list[float]] = {}  # skyward: sky.Compute(...) entered -> first result
    woke: dict[str, list[float]] = {}  # skyward: an asleep pool's first task -> its result
    imports: dict[str, list[float]] = {k: [] for k in IMPORTS}
    for r in range(args.rounds):
        order = systems[r % len(systems):] + systems[: r % len(systems)]
        for s in order:
            marks = run_program(programs[s], trees[s])
            first[s].append(marks["first"])
            if "open" in marks:
                entered.setdefault(s, []).append(marks["first"] - marks["open"])
            if "woke" in marks:
                woke.setdefault(s, []).append(marks["woke"] - marks["wake"])
        for k, stmt in IMPORTS.items():
            imports[k].append(time_import(stmt))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    rows: list[dict[str, Any]] = [{"case": "fresh interpreter -> first result (2 workers)", "system": s,
             "median_s": statistics.median(v), "min_s": min(v)} for s, v in first.items()]
    rows += [{"case": "sky.Compute(nodes=2) entered -> first result", "system": s,
              "median_s": statistics.median(v), "min_s": min(v)} for s, v in entered.items()]
    rows += [{"case": "nodes=(0, 2) asleep: first task -> result (wake)", "system": s,
              "median_s": statistics.median(v), "min_s": min(v)} for s, v in woke.items()]
    rows += [{"case": "import", "system": k, "median_s": statistics.median(v), "min_s": min(v)}
             for k, v in imports.items()]
    width = max(len(row["system"]) for row in rows)
    for row in rows:
        print(f"{row['case']:<46} {row['system']:<{width}}  median {row['median_s'] * 1000:8.1f} ms"
              f"  min {row['min_s'] * 1000:8.1f} ms")
    ppe = statistics.median(first["PPE"]) if "PPE" in first else None
    if ppe:
        print(f"skyward / PPE, fresh interpreter -> first result: "
              f"{statistics.median(first['skyward']) / ppe:.2f}x (target <= {TARGET_VS_PPE:.2f}x)")
        floor = statistics.median(imports["import cloudpickle"])
        modules = statistics.median(imports["the pool's modules"])
        print(f"the target's budget: {TARGET_VS_PPE * ppe * 1000:.1f} ms, of which importing cloudpickle alone "
              f"takes {floor * 1000:.1f} ms ({floor / (TARGET_VS_PPE * ppe):.0%}), the modules a client loads before "
              f"it can start a pool {modules * 1000:.1f} ms")
    print("bytecode: " + ("compiled once, cached (PYTHONPYCACHEPREFIX)" if cached
                          else "as this environment has it"))
    load = {"before": load_before, "after": os.getloadavg()}
    print(f"machine load (1, 5, 15 min averages): before {_load(load['before'])}, after {_load(load['after'])}"
          f" on {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "rounds": args.rounds, "load": load,
                                               "cores": os.cpu_count(),
                                               "bytecode_cache": cached}, indent=2) + "\n")
    for folder in trees.values():
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
