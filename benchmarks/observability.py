"""What Prometheus metrics, OpenTelemetry traces and the tracker plugins cost a pool's dispatch.

Each mode runs in its own process (the OTEL_* variables and the tracer provider are per process):
a 1-node Local pool, a warm-up, then sequential no-op `>>` round trips and a 2,000-item map,
repeated; the medians are printed as one JSON line per mode, then a table.

* ``none``: nothing enabled (what every program pays when it uses none of them);
* ``metrics``: ``Options(metrics_port=0)``, scraped every 0.5 s while it runs;
* ``tracing``: ``OTEL_EXPORTER_OTLP_ENDPOINT`` set to a receiver in this script (a span per task,
  its traceparent sent to the node, batched export);
* ``mlflow``, ``wandb``: the plugins (a local file store / offline mode): no per-task hook.

    .venv/bin/python benchmarks/observability.py [--calls 300] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHILD = """
import json, statistics, threading, time, urllib.request, sys
import skyward as sky

mode, calls, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

@sky.function
def noop(x):
    return x

plugins, options = [], sky.Options(console="silent")
if mode == "metrics":
    options = sky.Options(console="silent", metrics_port=0)
elif mode == "mlflow":
    plugins = [sky.plugins.mlflow(experiment="bench", tracking_uri="file://" + sys.argv[4])]
elif mode == "wandb":
    plugins = [sky.plugins.wandb(project="bench", mode="offline", dir=sys.argv[4])]
opened = time.perf_counter()
with sky.Compute(nodes=1, plugins=plugins, options=options) as pool:
    ready = time.perf_counter() - opened
    stop = threading.Event()
    if mode == "metrics":
        from skyward.observe import prometheus
        host, port = prometheus.metrics_address()
        scrape_request = urllib.request.Request(f"http://{host}:{port}/metrics",
                                                headers={"Authorization": f"Bearer {prometheus.metrics_token()}"})
        def scrape():
            while not stop.wait(0.5):
                urllib.request.urlopen(scrape_request).read()
        threading.Thread(target=scrape, daemon=True).start()
    for i in range(50):
        noop(i) >> pool
    pool.map(noop, range(2000))
    trips, maps = [], []
    for _ in range(reps):
        t = time.perf_counter()
        for i in range(calls):
            noop(i) >> pool
        trips.append((time.perf_counter() - t) / calls * 1000)
        t = time.perf_counter()
        pool.map(noop, range(2000))
        maps.append((time.perf_counter() - t) * 1000)
    stop.set()
print(json.dumps({"mode": mode, "open_s": round(ready, 3), "trip_ms": round(statistics.median(trips), 3),
                  "map_ms": round(statistics.median(maps), 1), "loaded_otel": "opentelemetry" in sys.modules}))
"""


def receiver() -> tuple[ThreadingHTTPServer, str]:
    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--modes", default="none,metrics,tracing,mlflow,wandb")
    args = parser.parse_args()
    server, url = receiver()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        base["SKYWARD_HOME"] = os.path.join(tmp, "home")
        base["WANDB_SILENT"] = "true"
        base["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses a file store without it
        for mode in args.modes.split(","):
            env = dict(base)
            if mode == "tracing":
                env["OTEL_EXPORTER_OTLP_ENDPOINT"] = url
            out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), mode, str(args.calls),
                                  str(args.reps), os.path.join(tmp, mode)], env=env, capture_output=True,
                                 text=True, timeout=600)
            if out.returncode != 0:
                print(f"{mode}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            row = json.loads(out.stdout.splitlines()[-1])
            print(json.dumps(row), flush=True)
            rows.append(row)
    server.shutdown()
    base_trip = next((r["trip_ms"] for r in rows if r["mode"] == "none"), None)
    print(f"\n{'mode':<9}{'open (s)':>10}{'>> (ms)':>10}{'vs none':>9}{'map 2k (ms)':>13}")
    for r in rows:
        rel = "" if not base_trip else f"{r['trip_ms'] / base_trip:.2f}x"
        print(f"{r['mode']:<9}{r['open_s']:>10}{r['trip_ms']:>10}{rel:>9}{r['map_ms']:>13}")


if __name__ == "__main__":
    main()
