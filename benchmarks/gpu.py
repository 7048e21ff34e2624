"""Tensors through a pool beside numpy arrays of the same size, one table.

    .venv/bin/python benchmarks/gpu.py [--mb 200] [--reps 5] [--quick] [--json PATH]

On a 1-node Local pool (shared memory for large buffers), each case timed in interleaved
repetitions (one of each case in turn, the order rotating; the median of ``--reps``), after one
warm-up call each:

* everywhere: a torch uint8 tensor of ``--mb`` MB and a state_dict of ten float32 tensors of
  ``--mb``/10 MB each, echoed (sent and returned: bytes both ways / time), against a numpy
  uint8 array of the same size echoed the same way. Target: >= 0.8x numpy's GB/s for the
  tensor, >= 0.9x for the state_dict (many arrays at one array's speed: issue 65, item 3).
* where CUDA is (else one "skipped: no CUDA" row each): a CUDA tensor as a result (the node
  returns one it made earlier; it lands on the client's GPU) and as an argument (the node
  returns its size), against the numpy array the same way (target >= 0.8x numpy); ten CUDA
  tensors in a dict (a storage each), the same both ways, against the one CUDA tensor (>= 0.9x); one DDP
  step (an MLP on cuda:0, a one-rank NCCL group) called through the pool against the same
  step in this process: what a call through the pool adds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the Local provider hands this sys.path to the nodes
    sys.path.insert(0, str(HERE))

import _gpu_work as work  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import skyward as sky  # noqa: E402

echo = sky.function(work.echo)
size_of = sky.function(work.size_of)
make_numpy = sky.function(work.make_numpy)
make_cuda = sky.function(work.make_cuda)
make_cuda_parts = sky.function(work.make_cuda_parts)
size_of_all = sky.function(work.size_of_all)
ddp_step = sky.function(work.ddp_step)

TARGET = 0.8  # x numpy's GB/s
TARGET_MANY = 0.9  # ten tensors in one value x one of the same total size (issue 65, item 3)


def timed(cases: dict[str, Callable[[], Any]], reps: int) -> dict[str, list[float]]:
    """Seconds of each case per repetition, the cases interleaved in a rotating order."""
    for fn in cases.values():  # warm up: imports, segments, CUDA contexts
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            t = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - t)
    return times


def gbps(nbytes: int, seconds: list[float]) -> tuple[float, float]:
    """(median GB/s, p90 GB/s: the rate at the 90th percentile of the time)."""
    p90 = sorted(seconds)[min(len(seconds) - 1, int(0.9 * len(seconds)))]
    return nbytes / statistics.median(seconds) / 1e9, nbytes / p90 / 1e9


Row = dict[str, Any]


def transfer_rows(pool: Any, n: int, reps: int) -> list[Row]:
    arr = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    tensor = torch.from_numpy(arr.copy())
    part = n // 10 // 4  # float32 elements per state_dict entry
    state = {f"layer{i}.weight": torch.randn(part) for i in range(10)}
    state_bytes = sum(t.nbytes for t in state.values())
    cases = {
        "numpy": lambda: echo(arr) >> pool,
        "tensor": lambda: echo(tensor) >> pool,
        "state_dict": lambda: echo(state) >> pool,
    }
    times = timed(cases, reps)
    ref, ref90 = gbps(2 * n, times["numpy"])
    rows: list[Row] = [{"case": f"numpy uint8 array, {n / 1e6:.0f} MB, echoed", "system": "numpy",
                        "median": ref, "p90": ref90, "unit": "GB/s", "seconds": times["numpy"]}]
    for key, what, nbytes in (("tensor", f"torch uint8 tensor, {n / 1e6:.0f} MB, echoed", n),
                              ("state_dict", f"state_dict, 10 x {state_bytes / 10e6:.0f} MB float32, echoed",
                               state_bytes)):
        med, p90 = gbps(2 * nbytes, times[key])
        target = TARGET_MANY if key == "state_dict" else TARGET
        rows.append({"case": what, "system": "skyward", "median": med, "p90": p90, "unit": "GB/s",
                     "vs_numpy": med / ref, "target": f">= {target}x numpy", "ok": med / ref >= target,
                     "seconds": times[key]})
    return rows


def cuda_rows(pool: Any, n: int, reps: int) -> list[Row]:
    if not torch.cuda.is_available():
        return [{"case": what, "system": "skipped: no CUDA"} for what in
                ("CUDA tensor result vs numpy", "CUDA tensor argument vs numpy",
                 "ten CUDA tensors in a dict vs one", "DDP step: pool vs in-process")]
    rows: list[Row] = []
    arr = np.random.default_rng(1).integers(0, 255, n, dtype=np.uint8)
    on_gpu = torch.from_numpy(arr).cuda()
    parts_on_gpu = {f"layer{i}.weight": t.clone() for i, t in enumerate(on_gpu.chunk(10))}

    def result(fn: Any) -> None:
        out = fn(n) >> pool
        torch.cuda.synchronize()
        del out

    cases = {
        "numpy result": lambda: make_numpy(n) >> pool,
        "cuda result": lambda: result(make_cuda),
        "cuda parts result": lambda: result(make_cuda_parts),
        "numpy argument": lambda: size_of(arr) >> pool,
        "cuda argument": lambda: size_of(on_gpu) >> pool,
        "cuda parts argument": lambda: size_of_all(parts_on_gpu) >> pool,
    }
    times = timed(cases, reps)
    for kind in ("result", "argument"):
        ref, _ = gbps(n, times[f"numpy {kind}"])
        med, p90 = gbps(n, times[f"cuda {kind}"])
        rows.append({"case": f"numpy uint8 array {kind}, {n / 1e6:.0f} MB", "system": "numpy",
                     "median": ref, "unit": "GB/s"})
        rows.append({"case": f"CUDA uint8 tensor {kind}, {n / 1e6:.0f} MB", "system": "skyward", "median": med,
                     "p90": p90, "unit": "GB/s", "vs_numpy": med / ref, "target": f">= {TARGET}x numpy",
                     "ok": med / ref >= TARGET})
    for kind in ("result", "argument"):  # item 3 of issue 65: many tensors at one tensor's speed
        one, _ = gbps(n, times[f"cuda {kind}"])
        med, p90 = gbps(n, times[f"cuda parts {kind}"])
        rows.append({"case": f"one CUDA uint8 tensor {kind}, {n / 1e6:.0f} MB", "system": "skyward, one tensor",
                     "reference": True, "median": one, "unit": "GB/s"})
        rows.append({"case": f"ten CUDA tensors in a dict {kind}, 10 x {n / 10e6:.0f} MB", "system": "skyward",
                     "median": med, "p90": p90, "unit": "GB/s", "vs": med / one,
                     "target": f">= {TARGET_MANY}x one tensor", "ok": med / one >= TARGET_MANY})
    steps = {"in-process": lambda: work.ddp_step(), "through the pool": lambda: ddp_step() >> pool}
    times = timed(steps, max(reps, 20))
    local = statistics.median(times["in-process"])
    remote = statistics.median(times["through the pool"])
    rows.append({"case": "DDP step (MLP 1024-4096-1024, batch 256), in this process", "system": "torch",
                 "median": local * 1e3, "unit": "ms"})
    rows.append({"case": "DDP step, the same, called through the pool", "system": "skyward",
                 "median": remote * 1e3, "unit": "ms", "overhead_ms": (remote - local) * 1e3})
    return rows


def table(rows: list[Row], title: str) -> Table:
    out = Table(title=title)
    for column in ("what", "skyward", "reference (numpy, in-process or one tensor), same run", "target"):
        out.add_column(column)
    reference = ""
    for row in rows:
        if "median" not in row:
            out.add_row(row["case"], row["system"], "", "")
            continue
        figure = f"{row['median']:,.2f} {row['unit']}"
        if row.get("reference") or row["system"] in ("numpy", "torch"):
            reference = figure
            continue
        ratio = row.get("vs", row.get("vs_numpy"))
        if ratio is not None:
            figure += f" ({ratio:.2f}x)"
        if "overhead_ms" in row:
            figure += f" (+{row['overhead_ms']:.2f} ms)"
        verdict = "" if "ok" not in row else f"{row['target']} {'PASS' if row['ok'] else 'MISS'}"
        out.add_row(row["case"], figure, reference, verdict)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="tensors through a pool beside numpy arrays")
    parser.add_argument("--mb", type=float, default=200.0, help="size of each payload (MB, 1e6 bytes)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="50 MB, 3 repetitions")
    parser.add_argument("--json", metavar="PATH", help="write the rows to this file")
    args = parser.parse_args(argv)
    mb, reps = (50.0, 3) if args.quick else (args.mb, args.reps)
    n = int(mb * 1e6) // 40 * 40  # divisible into ten float32 tensors
    load = os.getloadavg()[0]
    with sky.Compute(nodes=1, options=sky.Options(console="silent")) as pool:
        rows = transfer_rows(pool, n, reps) + cuda_rows(pool, n, reps)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
    title = (f"tensors through a 1-node Local pool ({os.cpu_count()} CPUs, {gpu}, torch {torch.__version__}, "
             f"numpy {np.__version__}, load {load:.2f}, median of {reps})")
    Console().print(table(rows, title))
    if args.json:
        Path(args.json).write_text(json.dumps({"title": title, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
