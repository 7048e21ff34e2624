"""Serving: requests/s and latency through pool.serve, beside plain uvicorn and Ray Serve.

    .venv/bin/python benchmarks/serve.py [--quick] [--seconds S] [--connections C] [--json PATH]

Two handlers, each as a Starlette app: ``echo`` (POST a small JSON body, get it back) and
``predict`` (a scikit-learn random forest's prediction for one row: CPU-bound). Each is measured

* under plain uvicorn on a TCP port, one process: the floor (nothing between the load and the app);
* through ``pool.serve`` on a Local pool of 1 and of 2 nodes (one replica each): the router on
  this machine, the replicas under uvicorn on their nodes' Unix sockets;
* through Ray Serve with 1 and 2 replicas, when ``ray[serve]`` is installed.

The load is ``wrk`` (Debian's package) with C connections for S seconds after a short warm-up:
requests/s and its latency percentiles. Last, the cold start: an asleep Local pool
(``Nodes(desired=0, max=1)``) gets a request for the echo app (no startup of its own); the time
from sending it to its answer; and the same for ``skyward serve NAME`` on an asleep Local named
pool (``skyward up NAME --nodes 0:1``, in a SKYWARD_HOME of its own, taken down at the end).
Everything runs on this machine, so
the load generator, the router and the replicas share its cores: compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # serve_apps, for the nodes too (they import it by name)

APPS = "serve_apps"
BODY = json.dumps({"x": [0.1] * 8, "id": "benchmark"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, headers: dict[str, str], timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.post(url, content=BODY, headers=headers, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout} s")
        time.sleep(0.1)


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def wrk(url: str, headers: dict[str, str], seconds: float, connections: int) -> dict[str, float]:
    """POST BODY to url with wrk: requests/s, p50, p90, p99 (ms), and the non-2xx answers."""
    lua = f"wrk.method = 'POST'\nwrk.body = '{BODY}'\nwrk.headers['Content-Type'] = 'application/json'\n"
    for k, v in headers.items():
        lua += f"wrk.headers['{k}'] = '{v}'\n"
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
    try:
        threads = min(2, connections)
        subprocess.run(["wrk", "-t", str(threads), "-c", str(connections), "-d", "2s", "-s", f.name, url],
                       check=True, capture_output=True)  # warm-up
        out = subprocess.run(["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds:g}s",
                              "--latency", "-s", f.name, url], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    pct = dict(re.findall(r"^\s+(50|90|99)%\s+(\S+)\s*$", out, re.M))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"rps": rps, "p50": _ms(pct["50"]), "p90": _ms(pct["90"]), "p99": _ms(pct["99"]),
            "errors": float(bad.group(1)) if bad else 0.0}


def measure(url: str, headers: dict[str, str], seconds: float, connections: int) -> dict[str, float]:
    """Latency alone (one connection: no queueing) and throughput under ``connections``."""
    alone = wrk(url, headers, seconds, 1)
    loaded = wrk(url, headers, seconds, connections)
    return {"rps": loaded["rps"], "p50": alone["p50"], "p99": alone["p99"], "p50_loaded": loaded["p50"],
            "p99_loaded": loaded["p99"], "errors": alone["errors"] + loaded["errors"]}


def plain(handler: str, seconds: float, connections: int) -> dict[str, float]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", f"{APPS}:{handler}", "--port", str(port),
                             "--log-level", "warning", "--no-access-log"], cwd=HERE)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_http(url, {})
        return measure(url, {}, seconds, connections)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def skyward(handler: str, nodes: int, seconds: float, connections: int) -> dict[str, float]:
    import skyward as sky

    with sky.Compute(nodes=nodes, options=sky.Options(console=False, logging=False)) as pool, \
            pool.serve(f"{APPS}:{handler}") as endpoint:
        endpoint.wait_ready(timeout=120)
        url = endpoint.url + "/"
        wait_http(url, endpoint.headers)
        return measure(url, endpoint.headers, seconds, connections)


def ray_rows(seconds: float, connections: int) -> dict[str, dict[str, float]]:
    """Both handlers through Ray Serve, 1 and 2 replicas, in one Ray session (none without ray)."""
    try:
        import ray
        from ray import serve
    except ImportError:
        return {}
    import serve_apps

    os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")
    port = free_port()
    try:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1", runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}})
    except Exception as exc:  # its rows are left out, saying why; ours stand
        print(f"Ray did not start, its rows are left out: {exc}", file=sys.stderr)
        return {}
    rows: dict[str, dict[str, float]] = {}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for handler in ("echo", "predict"):
            for n in (1, 2):
                serve.run(serve_apps.ray_deployment(handler, n), route_prefix="/", blocking=False)
                url = f"http://127.0.0.1:{port}/"
                wait_http(url, {}, timeout=120)
                rows[f"{handler}: Ray Serve, {n} replica" + ("s" if n > 1 else "")] = measure(
                    url, {}, seconds, connections)
    finally:
        serve.shutdown()
        ray.shutdown()
    return rows


def cold_start() -> dict[str, float]:
    import httpx

    import skyward as sky

    options = sky.Options(console=False, logging=False, autoscale_idle_timeout=600)
    with sky.Compute(nodes=sky.Nodes(desired=0, max=1), options=options) as pool, \
            pool.serve(f"{APPS}:echo") as endpoint:
        began = time.perf_counter()
        r = httpx.post(endpoint.url + "/", content=BODY, headers=endpoint.headers, timeout=120)
        total = time.perf_counter() - began
        assert r.status_code == 200, r.text
        return {"seconds": total}


def named_cold_start() -> dict[str, float]:
    """``skyward up bench --nodes 0:1`` (asleep), ``skyward serve bench``, one request: its time."""
    import httpx

    home = tempfile.mkdtemp(prefix="skyward-bench-serve-")
    env = {**os.environ, "SKYWARD_HOME": home}  # the cwd, HERE, is importable: the nodes import serve_apps
    cli = [sys.executable, "-m", "skyward"]
    serve: subprocess.Popen[str] | None = None
    try:
        subprocess.run([*cli, "up", "bench", "--provider", "local", "--nodes", "0:1", "--ttl", "600"], cwd=HERE,
                       env=env, check=True, capture_output=True)
        with (Path(home) / "serve.err").open("w") as errors:
            serve = subprocess.Popen([*cli, "serve", "bench", f"{APPS}:echo", "--port", "0", "--json",
                                      "--idle-timeout", "600"], cwd=HERE, env=env, stdout=subprocess.PIPE,
                                     stderr=errors, text=True)
        line = serve.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"skyward serve ended: {(Path(home) / 'serve.err').read_text()}")
        said = json.loads(line)
        began = time.perf_counter()
        r = httpx.post(said["url"] + "/", content=BODY, headers=said["headers"], timeout=120)
        total = time.perf_counter() - began
        assert r.status_code == 200, r.text
        return {"seconds": total}
    finally:
        if serve is not None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(60)
            serve.stdout.close()  # type: ignore[union-attr]
        subprocess.run([*cli, "down", "bench", "--force"], cwd=HERE, env=env, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s per row instead of 10")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("benchmarks/serve.py needs wrk: apt-get install wrk")
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    rows: dict[str, dict[str, Any]] = {}
    for handler in ("echo", "predict"):
        rows[f"{handler}: plain uvicorn"] = plain(handler, seconds, args.connections)
        for n in (1, 2):
            rows[f"{handler}: pool.serve, {n} replica" + ("s" if n > 1 else "")] = skyward(
                handler, n, seconds, args.connections)
    if not args.skip_ray:
        rows.update(ray_rows(seconds, args.connections))
    rows = dict(sorted(rows.items(), key=lambda kv: kv[0].split(":")[0] != "echo"))
    cold = cold_start()
    named_cold = named_cold_start()

    from rich.console import Console
    from rich.table import Table

    c = args.connections
    table = Table(title=f"serving: wrk, {seconds:g} s per figure; latency in ms")
    for col in ("row", f"requests/s (-c {c})", "p50 (-c 1)", "p99 (-c 1)", f"p50 (-c {c})", f"p99 (-c {c})",
                "non-2xx"):
        table.add_column(col, justify="left" if col == "row" else "right")
    for name, r in rows.items():
        table.add_row(name, f"{r['rps']:,.0f}", f"{r['p50']:.2f}", f"{r['p99']:.2f}", f"{r['p50_loaded']:.2f}",
                      f"{r['p99_loaded']:.2f}", f"{r['errors']:.0f}")
    console = Console()
    console.print(table)
    console.print(f"cold start of an asleep Local pool (request sent -> answer): {cold['seconds']:.2f} s")
    console.print(f"cold start of an asleep Local named pool, `skyward serve` (request sent -> answer): "
                  f"{named_cold['seconds']:.2f} s")
    for handler in ("echo", "predict"):
        floor = rows[f"{handler}: plain uvicorn"]["p50"]
        ours = rows[f"{handler}: pool.serve, 1 replica"]["p50"]
        console.print(f"{handler}: p50 at one connection, pool.serve minus plain uvicorn: {ours - floor:+.2f} ms")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "cold_start": cold, "named_cold_start": named_cold},
                                             indent=2))


if __name__ == "__main__":
    main()
