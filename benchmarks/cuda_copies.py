"""Where a CUDA tensor's bytes go between two processes of one host, copy by copy (needs CUDA).

    python benchmarks/cuda_copies.py [--mb 200] [--reps 7]

A CUDA tensor a Local node returns (or receives) crosses as two copies: device to host into a
shared-memory segment, host to device out of it. This times each kind of copy on its own, in
one process, median of ``--reps``: into and out of pageable memory, a shared-memory mapping
(``/dev/shm``, its pages already touched), a fresh segment (pages faulted in by the copy),
pinned memory, and the same mapping once page-locked with ``cudaHostRegister`` (what
bootstrap/serialize.py does to a segment a CUDA copy touches), with the time the registration
itself takes; a device-to-device copy and a host copy for scale. No skyward code runs here.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0, help="bytes per copy, in MB (1e6 bytes)")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("cuda_copies: no CUDA here (torch.cuda.is_available() is False); nothing to time")
        return 0
    n = int(args.mb * 1e6)
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda:0")

    def timed(fn: Callable[[], Any], reps: int = args.reps) -> str:
        out = []
        for _ in range(reps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out.append(time.perf_counter() - start)
        sec = statistics.median(out)
        return f"{n / sec / 1e9:8.2f} GB/s  ({sec * 1e3:6.1f} ms)"

    print(f"{args.mb:g} MB on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, median of {args.reps}")
    page = torch.empty(n, dtype=torch.uint8)
    print(f"{'device -> pageable memory':<40}{timed(lambda: page.copy_(src))}")
    print(f"{'pageable memory -> device':<40}{timed(lambda: src.copy_(page))}")
    folder = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None, prefix="cuda-copies-")
    path = os.path.join(folder, "segment")
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, n)
        mm = mmap.mmap(fd, n)
        shared = torch.frombuffer(mm, dtype=torch.uint8, count=n)
        shared.copy_(src)  # its pages touched once, as a reused segment's are
        print(f"{'device -> shared memory':<40}{timed(lambda: shared.copy_(src))}")
        print(f"{'shared memory -> device':<40}{timed(lambda: src.copy_(shared))}")

        def fresh() -> None:
            fresh_path = os.path.join(folder, "fresh")
            f = os.open(fresh_path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(f, 0, n)
                m = mmap.mmap(f, n)
                view = torch.frombuffer(m, dtype=torch.uint8, count=n)
                view.copy_(src)
                torch.cuda.synchronize()
                del view
                m.close()
            finally:
                os.close(f)
                os.unlink(fresh_path)

        print(f"{'device -> a fresh segment':<40}{timed(fresh, max(3, args.reps // 2))}")
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        print(f"{'device -> pinned memory':<40}{timed(lambda: pinned.copy_(src))}")
        print(f"{'pinned memory -> device':<40}{timed(lambda: src.copy_(pinned))}")
        cudart = torch.cuda.cudart()
        start = time.perf_counter()
        if int(cudart.cudaHostRegister(shared.data_ptr(), n, 1)) != 0:
            print("cudaHostRegister refused the shared-memory mapping")
        else:
            print(f"{'cudaHostRegister of the mapping':<40}{(time.perf_counter() - start) * 1e3:8.1f} ms")
            print(f"{'device -> shared memory, registered':<40}{timed(lambda: shared.copy_(src))}")
            print(f"{'shared memory, registered -> device':<40}{timed(lambda: src.copy_(shared))}")
            start = time.perf_counter()
            cudart.cudaHostUnregister(shared.data_ptr())
            print(f"{'cudaHostUnregister':<40}{(time.perf_counter() - start) * 1e3:8.1f} ms")
        print(f"{'device -> device (clone)':<40}{timed(lambda: src.clone())}")
        print(f"{'shared memory -> pageable (host copy)':<40}{timed(lambda: page.copy_(shared))}")
    finally:
        os.close(fd)
        os.unlink(path)
        os.rmdir(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
