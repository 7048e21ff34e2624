"""What sealing a link costs (frames.py: HMAC-SHA256 tags on every frame after the handshake,
on the links no SSH carries: sky.SSH(direct=True), Slurm's nodes, the collections over TCP).

    .venv/bin/python benchmarks/sealed.py [--quick] [--json PATH]

One agent, started as sky.SSH(direct=True) starts it (``--direct``), here on loopback: its
plain TCP port (what the SSH tunnel ends at: not sealed) and its direct port (sealed), both
plain TCP on the same host, so the only difference between the two is the sealing. Through
each, interleaved, plain then sealed then sealed then plain:

* a no-op round trip: a HEALTH frame (a pickled ``fn(info)`` the agent runs beside its
  workers, so no worker hop) that returns None, median and p90 per call;
* 100 MB up: a HEALTH whose function carries a 100 MB array (out-of-band buffer) and returns
  its length; 100 MB down: one that returns a 100 MB array the agent made earlier;
* and, without the agent, the frames alone: a FrameWriter and a FrameReader on a loopback TCP
  pair in two threads, a 100 MB frame one way, and a small frame's ping-pong.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from skyward.bootstrap import serialize
from skyward.bootstrap.channel import NodeChannel
from skyward.bootstrap.frames import Frame, FrameReader, FrameWriter, Kind, tune

TOKEN = "benchmark-" + os.urandom(8).hex()
MB = 1_000_000


def _health(ch: NodeChannel, fn: Callable[..., Any]) -> Any:
    fut: Future[Frame] = Future()
    flags, body, buffers = serialize.dumps(fn)
    ch.submit(Kind.HEALTH, flags, body, list(buffers),
              lambda r: fut.set_exception(r) if isinstance(r, BaseException) else fut.set_result(r))
    frame = fut.result(120)
    tag, value, *_ = serialize.loads(frame.flags, frame.body, frame.buffers)
    assert tag == "ok", value
    return value


def _noop() -> Callable[[Any], None]:
    return lambda _info: None


def _length(data: np.ndarray) -> Callable[[Any], int]:
    return functools.partial(lambda d, _info: int(d.nbytes), data)


def _blob(n: int) -> Callable[[Any], Any]:
    """The agent's cached array of n bytes (made at the first call, which is not timed)."""

    def blob(_info: Any) -> Any:
        import builtins

        import numpy

        cached = getattr(builtins, "_sealed_bench_blob", None)
        if cached is None or cached.nbytes != n:
            cached = numpy.frombuffer(os.urandom(n), dtype=numpy.uint8)
            builtins._sealed_bench_blob = cached  # type: ignore[attr-defined]
        return cached

    return blob


def _frames_pair(sealed: bool) -> tuple[socket.socket, socket.socket, FrameWriter, FrameReader, FrameWriter, FrameReader]:
    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname()[:2])
    b, _ = listener.accept()
    listener.close()
    for s in (a, b):
        tune(s)
    wa, ra, wb, rb = FrameWriter(a), FrameReader(a), FrameWriter(b), FrameReader(b)
    if sealed:
        k1, k2 = os.urandom(32), os.urandom(32)
        wa.seal(k1)
        rb.seal(k1)
        wb.seal(k2)
        ra.seal(k2)
    return a, b, wa, ra, wb, rb


def _frames_bulk(sealed: bool, data: bytes, reps: int) -> list[float]:
    a, b, wa, _, _, rb = _frames_pair(sealed)
    times = []
    try:
        for _ in range(reps):
            t = threading.Thread(target=wa.send_parts, args=(Kind.TASK, 1, 0, b"", [(0, data)]))
            start = time.perf_counter()
            t.start()
            got = rb.read()
            times.append(time.perf_counter() - start)
            t.join()
            assert len(got.buffers[0][1]) == len(data)
    finally:
        a.close()
        b.close()
    return times


def _frames_pingpong(sealed: bool, n: int) -> list[float]:
    a, b, wa, ra, wb, rb = _frames_pair(sealed)

    def echo() -> None:
        try:
            while True:
                f = rb.read()
                wb.send_parts(Kind.PONG, f.task_id, 0, b"")
        except (EOFError, OSError):
            pass

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    times = []
    try:
        for i in range(n):
            start = time.perf_counter()
            wa.send_parts(Kind.PING, i, 0, b"x" * 64)
            ra.read()
            times.append(time.perf_counter() - start)
    finally:
        a.close()
        b.close()
    return times


def _p90(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.9) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer round trips and repetitions")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    calls, reps, size = (300, 3, 100 * MB) if args.quick else (2000, 7, 100 * MB)

    env = dict(os.environ, SKYWARD_AGENT_TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "skyward.bootstrap.agent_start", "--ttl", "600", "--direct", "127.0.0.1"],
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    hello = json.loads(proc.stdout.readline())
    channels = {
        "plain": NodeChannel(socket.create_connection(("127.0.0.1", hello["port"])), node=0, token=TOKEN, ttl=600,
                             on_output=lambda *a: None),
        "sealed": NodeChannel(socket.create_connection(("127.0.0.1", hello["direct"])), node=0, token=TOKEN, ttl=600,
                              on_output=lambda *a: None),
    }
    assert channels["plain"].facts["sealed"] is False and channels["sealed"].facts["sealed"] is True
    data = np.frombuffer(os.urandom(size), dtype=np.uint8)
    raw = data.tobytes()
    results: dict[str, dict[str, list[float]]] = {k: {} for k in channels}
    orders = [("plain", "sealed"), ("sealed", "plain")]
    try:
        for ch in channels.values():  # warm-up: imports, the agent's cached blob
            for _ in range(50):
                _health(ch, _noop())
            _health(ch, _blob(size))
            _health(ch, _length(data[: MB]))
        blocks = 10
        for block in range(blocks):
            for name in orders[block % 2]:
                times = results[name].setdefault("noop", [])
                for _ in range(calls // blocks):
                    start = time.perf_counter()
                    _health(channels[name], _noop())
                    times.append(time.perf_counter() - start)
        for rep in range(reps):
            for name in orders[rep % 2]:
                start = time.perf_counter()
                assert _health(channels[name], _length(data)) == size
                results[name].setdefault("up", []).append(time.perf_counter() - start)
                start = time.perf_counter()
                assert len(_health(channels[name], _blob(size))) == size
                results[name].setdefault("down", []).append(time.perf_counter() - start)
        for rep in range(reps):
            for name in orders[rep % 2]:
                results[name].setdefault("frames_bulk", []).extend(_frames_bulk(name == "sealed", raw, 1))
        for block in range(blocks):
            for name in orders[block % 2]:
                results[name].setdefault("frames_pingpong", []).extend(
                    _frames_pingpong(name == "sealed", calls // blocks))
    finally:
        for ch in channels.values():
            ch.close()
        proc.kill()
        proc.wait()

    cpu = platform.processor() or next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                                        if line.startswith("model name")), "?")
    print(f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    print(f"{'':38} {'plain':>18} {'sealed':>18} {'sealed / plain':>15}")
    figures: dict[str, Any] = {}
    for key, what, unit in (("noop", "no-op HEALTH round trip, median (p90)", "ms"),
                            ("up", "100 MB up through the agent", "MB/s"),
                            ("down", "100 MB down through the agent", "MB/s"),
                            ("frames_bulk", "100 MB frame alone, one way", "MB/s"),
                            ("frames_pingpong", "64-byte frame ping-pong, median (p90)", "us")):
        row = {}
        for name in channels:
            values = results[name][key]
            med = statistics.median(values)
            if unit == "MB/s":
                row[name] = (size / MB / med, f"{size / MB / med:8.0f} MB/s")
            else:
                scale = 1e3 if unit == "ms" else 1e6
                row[name] = (med * scale, f"{med * scale:7.3f} ({_p90(values) * scale:.3f}) {unit}")
        ratio = row["sealed"][0] / row["plain"][0]
        print(f"{what:38} {row['plain'][1]:>18} {row['sealed'][1]:>18} {ratio:14.2f}x")
        figures[key] = {name: {"median": statistics.median(results[name][key]), "p90": _p90(results[name][key]),
                               "all": results[name][key]} for name in channels}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
