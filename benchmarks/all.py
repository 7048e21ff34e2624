"""Every benchmark in one command, beside the peers that are installed, in one table.

    .venv/bin/python benchmarks/all.py [--quick] [--json PATH] [--skip NAME[,NAME...]]

Runs, one after another, each in a process of its own (so that none inherits another's
warm caches or threads):

* run.py      round trip, map, array there and back, CPU-bound work: skyward (2 Local nodes)
              beside ProcessPoolExecutor, loky, and Ray and Dask when installed
* startup.py  a fresh interpreter to its first result, sky.Compute entered to its first
              result, import time
* ssh.py      SSH hosts (tests/sshhosts.py): enter times, round trip and payload through the
              tunnel and the direct path, with a Local node as the baseline
* scale.py    pools of thousands through the fake Pulumi workspace: preview per node, up,
              client memory per node, `skyward ls` and `skyward status` of a 1,000-node pool
* cores.py    map on one Local node per core beside multiprocessing.Pool of as many workers,
              and how soon 64 Local nodes are ready
* gpu.py      torch tensors and state_dicts through a Local node beside numpy arrays; CUDA
              tensors as results and arguments and a DDP step through a pool, where CUDA is
              (needs torch: without it the part is left out)
* serve.py    requests through pool.serve beside plain uvicorn and Ray Serve (wrk), and the
              cold start of an asleep pool (needs wrk: without it the part is left out)

then prints the figures the performance issue names, each against its target, and writes
every sub-benchmark's own JSON into one file with --json. Install the peers with
`pip install -e '.[bench]'`; the figures of the README and the benchmarks guide come from it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
PARTS = ("run", "startup", "ssh", "scale", "cores", "gpu", "serve")


def run_part(name: str, quick: bool, out: Path) -> dict[str, Any] | None:
    args = [sys.executable, str(HERE / f"{name}.py"), "--json", str(out)]
    if quick and name in ("run", "ssh", "gpu", "serve"):
        args.append("--quick")
    if quick and name == "startup":
        args += ["--rounds", "3"]
    if quick and name == "scale":
        args += ["--sizes", "1000,5000", "--reps", "1"]
    if quick and name == "cores":
        args += ["--reps", "5", "--ready", "0"]
    print(f"== {name}.py", file=sys.stderr, flush=True)
    started = time.monotonic()
    proc = subprocess.run(args, stdout=sys.stderr)  # their own tables go to stderr: progress
    print(f"== {name}.py: exit {proc.returncode} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if proc.returncode != 0 or not out.exists():
        return None
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _row(results: dict[str, Any], bench: str, system: str, case: str | None = None) -> dict[str, Any] | None:
    for r in results.get("results", []):
        if r["bench"] == bench and r["system"] == system and (case is None or r["case"] == case):
            return dict(r)
    return None


def _startup(data: dict[str, Any], case: str, system: str) -> float | None:
    for r in data.get("rows", []):
        if r["case"].startswith(case) and r["system"] == system:
            return float(r["median_s"])
    return None


Line = tuple[str, str, str, str]  # what, skyward, peers, target and verdict


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else ("PASS" if ok else "MISS")


def summary(parts: dict[str, dict[str, Any] | None]) -> list[Line]:
    lines: list[Line] = []
    run = parts.get("run") or {}
    if run:
        sky = _row(run, "roundtrip", "skyward", "no-op call, sequential")
        ppe = _row(run, "roundtrip", "PPE")
        if sky and ppe:
            peers = ", ".join(f"{r['system']} {r['median']:.3f} ms" for r in run["results"]
                              if r["bench"] == "roundtrip" and r["system"] not in ("skyward",)
                              and not r["case"].startswith("no-op from"))
            ratio = sky["median"] / ppe["median"]
            lines.append(("no-op round trip", f"{sky['median']:.3f} ms ({ratio:.2f}x PPE)", peers,
                          f"<= 1.10x PPE {_verdict(ratio <= 1.10)}"))
        arrays = [r for r in run["results"] if r["bench"] == "array" and r["unit"] in ("MB/s", "GB/s")]
        sky_arr = next((r for r in arrays if r["system"] == "skyward" and r["case"].startswith("echo")), None)
        if sky_arr is not None:
            ray = next((r for r in arrays if r["system"] == "ray" and r["case"] == sky_arr["case"]), None)
            peers = ", ".join(f"{r['system']} {r['median']:,.2f} {r['unit']}" for r in arrays
                              if r["system"] != "skyward" and r["case"] == sky_arr["case"])
            target = "" if ray is None else f">= Ray's {_verdict(sky_arr['median'] >= ray['median'])}"
            lines.append((f"array there and back ({sky_arr['case']})",
                          f"{sky_arr['median']:,.2f} {sky_arr['unit']}", peers, target))
    start = parts.get("startup") or {}
    if start:
        entered = _startup(start, "sky.Compute", "skyward")
        fresh = {r["system"]: r["median_s"] for r in start["rows"] if r["case"].startswith("fresh")}
        peers = ", ".join(f"{k} {v:.3f} s" for k, v in fresh.items() if k != "skyward")
        if entered is not None:
            lines.append(("sky.Compute(nodes=2) entered -> first result", f"{entered:.3f} s", "",
                          f"<= 0.15 s {_verdict(entered <= 0.15)}"))
        if "skyward" in fresh:
            lines.append(("fresh interpreter -> first result", f"{fresh['skyward']:.3f} s", peers, ""))
        wake = _startup(start, "nodes=(0, 2)", "skyward")
        if wake is not None:
            lines.append(("an asleep pool's first task -> result (wake from zero)", f"{wake:.3f} s", "", ""))
        imp = _startup(start, "import", "import skyward")
        if imp is not None:
            lines.append(("import skyward", f"{imp * 1000:.1f} ms", "", f"<= 50 ms {_verdict(imp <= 0.05)}"))
    ssh = parts.get("ssh") or {}
    mbps = {k.replace("_100MB", " 100 MB").replace("_MBps", "").replace("_", " "): v for k, v in ssh.items()
            if isinstance(v, float) and k.endswith("_MBps") and not k.startswith("local")}
    tunnel = [v for k, v in ssh.items() if isinstance(v, float) and k.startswith("ssh_100MB") and k.endswith("_MBps")]
    if mbps:
        best = min(tunnel) if tunnel else max(mbps.values())  # both directions through the tunnel
        lines.append(("SSH payload (test hosts)", ", ".join(f"{k} {v:.0f} MB/s" for k, v in mbps.items()), "",
                      f">= 300 MB/s {_verdict(best >= 300)}"))
    scale = parts.get("scale") or {}
    if scale:
        worst = max(v["ms_per_node"] for cloud in scale["preview"].values() for v in cloud.values())
        lines.append(("preview, per node (1k-5k nodes, AWS and GCP)", f"<= {worst:.2f} ms", "",
                      f"<= 2 ms {_verdict(worst <= 2)}"))
        up = scale["up"]
        lines.append((f"plan + up of {up['nodes']:,} nodes (fake workspace)",
                      f"{up['seconds']:.2f} s, longest argument {up['longest_argument_bytes']} B", "", ""))
        mem = scale["memory"]
        lines.append(("client memory per node", f"{mem['kept_bytes_per_node'] / 1024:.2f} KiB", "", ""))
        cli = scale["cli"]
        ok = max(cli["ls_seconds"], cli["status_seconds"]) < 1
        lines.append((f"skyward ls / status, {cli['nodes']:,}-node pool",
                      f"{cli['ls_seconds']:.2f} s / {cli['status_seconds']:.2f} s", "", f"< 1 s {_verdict(ok)}"))
    cores = parts.get("cores") or {}
    for r in cores.get("rows", []):
        if "items" in r and r["system"] == "skyward":
            mp = next(m for m in cores["rows"] if m.get("items") == r["items"] and m["system"] == "mp.Pool")
            ratio = r["median_items_s"] / mp["median_items_s"]
            lines.append((f"map of {r['items']:,} no-op items, {r['nodes']} nodes on {cores['cores']} cores",
                          f"{r['median_items_s'] / 1e6:.2f} M items/s ({ratio:.2f}x)",
                          f"mp.Pool({r['nodes']}) {mp['median_items_s'] / 1e6:.2f} M/s", f">= mp.Pool {_verdict(ratio >= 1)}"))
        elif "ready_nodes" in r and r["system"] == "skyward":
            lines.append((f"{r['ready_nodes']} Local nodes: enter / first call on every node",
                          f"{r['enter_s']:.3f} s / {r['first_s']:.3f} s", "", ""))
    gpu = parts.get("gpu") or {}
    reference = ""
    for r in gpu.get("rows", []):
        if "median" not in r:
            lines.append((r["case"], r["system"], "", ""))
        elif r.get("reference") or r["system"] in ("numpy", "torch"):
            reference = f"{r['system']} {r['median']:,.2f} {r['unit']}"
        else:
            ratio = r.get("vs", r.get("vs_numpy"))
            figure = f"{r['median']:,.2f} {r['unit']}" + (f" ({ratio:.2f}x)" if ratio is not None else "")
            target = f"{r['target']} {_verdict(r['ok'])}" if "ok" in r else ""
            lines.append((r["case"], figure, reference, target))
    served = (parts.get("serve") or {}).get("rows", {})
    for handler in ("echo", "predict"):
        floor, ours = served.get(f"{handler}: plain uvicorn"), served.get(f"{handler}: pool.serve, 1 replica")
        if floor and ours:
            ray = served.get(f"{handler}: Ray Serve, 1 replica")
            peers = f"uvicorn {floor['p50']:.2f} ms, {floor['rps']:,.0f}/s" + (
                f"; Ray Serve {ray['p50']:.2f} ms, {ray['rps']:,.0f}/s" if ray else "")
            extra = ours["p50"] - floor["p50"]
            target = f"p50 <= uvicorn + 1 ms {_verdict(extra <= 1.0)}" + (
                f", req/s >= Ray Serve's {_verdict(ours['rps'] >= ray['rps'])}" if ray else "")
            lines.append((f"pool.serve {handler}: p50 (1 connection), req/s (16)",
                          f"{ours['p50']:.2f} ms, {ours['rps']:,.0f}/s", peers, target))
    for key, what in (("cold_start", "an asleep Local pool"), ("named_cold_start", "an asleep Local named pool")):
        cold = (parts.get("serve") or {}).get(key)
        if cold:
            lines.append((f"serving: {what}'s cold start (request -> answer)", f"{cold['seconds']:.2f} s", "",
                          f"<= 2 s + app startup {_verdict(cold['seconds'] <= 2.0)}"))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="every skyward benchmark, one table")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    parser.add_argument("--json", metavar="PATH", help="write every part's figures to one file")
    parser.add_argument("--skip", default="", help="parts to leave out: " + ", ".join(PARTS))
    args = parser.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    unknown = skip - set(PARTS)
    if unknown:
        parser.error(f"--skip {','.join(sorted(unknown))}: not a part; the parts are {', '.join(PARTS)}")
    parts: dict[str, dict[str, Any] | None] = {}
    if importlib.util.find_spec("torch") is None:
        skip.add("gpu")  # tensors need torch; the other parts do not
    with tempfile.TemporaryDirectory(prefix="skyward-bench-") as tmp:
        for name in PARTS:
            if name not in skip:
                parts[name] = run_part(name, args.quick, Path(tmp) / f"{name}.json")
    table = Table(title=f"skyward benchmarks ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f})")
    for column in ("what", "skyward", "peers in the same run", "target"):
        table.add_column(column)
    for line in summary(parts):
        table.add_row(*line)
    Console().print(table)
    failed = [name for name, data in parts.items() if data is None]
    if failed:
        print(f"these parts failed (their output is above): {', '.join(failed)}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(parts, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
