"""What the serving router adds to a request: an echo-JSON ASGI app under plain uvicorn, beside
the same app behind ``skyward.serve.router.Router`` with 1 and 2 replicas (uvicorn on Unix
sockets), measured with ``wrk`` when it is on PATH, else with a sequential httpx loop.

    .venv/bin/python benchmarks/serve_router.py [--seconds 10] [--connections 16]

Each row: latency (p50 and p99) with one connection sending requests back to back, then
requests per second with ``--connections`` connections; the seconds are split between the two.
With wrk, plain uvicorn listens on a TCP port (wrk speaks TCP only); with httpx it listens on a
Unix socket. Target: the router's p50 within 1 ms of plain uvicorn's. Other work on the machine
moves every figure; the load average is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    """Echo JSON: the query string back, as a small JSON object."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = b'{"echo":"%s"}' % scope["query_string"]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def uvicorn(where: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "uvicorn", "benchmarks.serve_router:app", *where,
                             "--log-level", "warning", "--no-access-log"], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL)


def wait_listening(family: int, address: object, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"uvicorn exited with {proc.returncode}")
        with socket.socket(family) as s:
            try:
                s.connect(address)  # type: ignore[arg-type]
                return
            except OSError:
                time.sleep(0.1)
    raise SystemExit(f"uvicorn did not listen on {address} within 60 s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wrk(url: str, connections: int, seconds: float) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, requests/s) as wrk reports them."""
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency", url],
                         capture_output=True, text=True, check=True).stdout

    def ms(label: str) -> float:
        m = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert m, out
        return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert rps, out
    return ms("50%"), ms("99%"), float(rps.group(1))


def httpx_loop(url: str, uds: str | None, connections: int, seconds: float) -> tuple[float, float, float]:
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    transport = httpx.HTTPTransport(uds=uds) if uds else None
    with httpx.Client(transport=transport, timeout=30) as client:
        for _ in range(50):
            client.get(url)
        lat: list[float] = []
        end = time.monotonic() + seconds / 2
        while time.monotonic() < end:
            t = time.perf_counter()
            client.get(url)
            lat.append(time.perf_counter() - t)
        lat.sort()

        def run(_: int) -> int:
            n, stop = 0, time.monotonic() + seconds / 2
            while time.monotonic() < stop:
                client.get(url)
                n += 1
            return n

        began = time.monotonic()
        with ThreadPoolExecutor(connections) as ex:
            total = sum(ex.map(run, range(connections)))
        rps = total / (time.monotonic() - began)
    return statistics.median(lat) * 1e3, lat[int(len(lat) * 0.99)] * 1e3, rps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=16)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from skyward.serve.router import Router, Upstream

    use_wrk = shutil.which("wrk") is not None
    folder = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    rows: list[tuple[str, tuple[float, float, float]]] = []
    half = args.seconds / 2

    def measure(url: str, uds: str | None) -> tuple[float, float, float]:
        if use_wrk:
            p50, p99, _ = wrk(url, 1, half)
            _, _, rps = wrk(url, args.connections, half)
            return p50, p99, rps
        return httpx_loop(url, uds, args.connections, args.seconds)

    try:
        socks = [str(folder / f"r{i}.sock") for i in range(2)]
        for path in socks:
            procs.append(uvicorn(["--uds", path]))
            wait_listening(socket.AF_UNIX, path, procs[-1])
        if use_wrk:
            port = free_port()
            procs.append(uvicorn(["--port", str(port)]))
            wait_listening(socket.AF_INET, ("127.0.0.1", port), procs[-1])
            rows.append(("uvicorn (TCP)", measure(f"http://127.0.0.1:{port}/echo?x=1", None)))
        else:
            rows.append(("uvicorn (UDS)", measure("http://uvicorn/echo?x=1", socks[0])))

        def upstream(i: int) -> Upstream:
            async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
                return await asyncio.open_unix_connection(socks[i])
            return Upstream(f"0.{i}", connect)

        for n in (1, 2):
            router = Router(token="bench-token" if not use_wrk else None)
            host, rport = router.start()
            for i in range(n):
                router.add(upstream(i))
            try:
                if use_wrk:
                    rows.append((f"router, {n} replica(s)", measure(f"http://{host}:{rport}/echo?x=1", None)))
                else:
                    rows.append((f"router, {n} replica(s)", measure(f"http://{host}:{rport}/echo?x=1", None)))
            finally:
                router.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(folder, ignore_errors=True)

    print(f"tool: {'wrk' if use_wrk else 'httpx'}; {os.cpu_count()} CPUs; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {args.seconds:g} s per row")
    print(f"{'':24} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>9}")
    for name, (p50, p99, rps) in rows:
        print(f"{name:24} {p50:8.3f} {p99:8.3f} {rps:9.0f}")
    base = rows[0][1][0]
    worst = max(r[1][0] for r in rows[1:])
    print(f"router p50 - uvicorn p50: {worst - base:+.3f} ms (target <= 1 ms): "
          f"{'PASS' if worst - base <= 1.0 else 'MISS'}")


if __name__ == "__main__":
    main()
