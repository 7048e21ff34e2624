"""Object storage benchmarks against a local S3-compatible server (moto in server mode, loopback).

    .venv/bin/python benchmarks/storage.py [--size-mb 1024] [--boto3] [--json PATH]

* sky.Storage upload and download of one file (default 1 GB), in MB/s
* sequential read of the same file through a sky.Volume (rclone over FUSE) by a task on a
  Local pool, in MB/s (skipped, saying why, where FUSE cannot mount)
* the baselines, in the same run: ``cp`` of the file on local disk, and the same sequential read
  loop on the local file
* ``--boto3``: boto3's upload_file/download_file on the same file and server (how the client
  library was chosen; needs boto3)

moto keeps every object in Python memory and is the bottleneck for uploads: the figures say how
fast skyward's client is against *this* server on *this* machine, not what S3 would give.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
from _home import scratch_home  # noqa: E402

scratch_home()

from s3server import S3Server, fuse_skip_reason  # noqa: E402

import skyward as sky  # noqa: E402

BLOCK = 8 << 20


def seq_read(path: str) -> float:
    """Seconds to read ``path`` front to back in 8 MB blocks."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(BLOCK):
            pass
    return time.perf_counter() - t0


@sky.function
def read_on_node(path: str) -> float:
    return seq_read(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--boto3", action="store_true", help="also measure boto3 on the same file")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    size = args.size_mb << 20
    mb = size / 1e6
    out: dict[str, Any] = {"size_mb": args.size_mb}
    work = Path(tempfile.mkdtemp(prefix="skyward-bench-storage-", dir="/var/tmp"))
    try:
        src = work / "big.bin"
        with open(src, "wb") as f:
            for _ in range(size // (1 << 20)):
                f.write(os.urandom(1 << 20))
        t0 = time.perf_counter()
        subprocess.run(["cp", str(src), str(work / "copy.bin")], check=True)
        out["cp_local_mb_s"] = mb / (time.perf_counter() - t0)
        (work / "copy.bin").unlink()
        out["seq_read_local_mb_s"] = mb / seq_read(str(src))

        with S3Server() as s3:
            s3.create_bucket("bench")
            st = s3.storage()
            t0 = time.perf_counter()
            st.upload("bench", src, key="data/big.bin")
            out["upload_mb_s"] = mb / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            st.download("bench", "data/big.bin", work / "down.bin")
            out["download_mb_s"] = mb / (time.perf_counter() - t0)
            assert (work / "down.bin").stat().st_size == size
            (work / "down.bin").unlink()

            reason = fuse_skip_reason()
            if reason:
                out["volume_seq_read_mb_s"] = None
                out["volume_skipped"] = reason
            else:
                mount = str(work / "mnt")
                vol = sky.Volume("bench", mount, prefix="data", storage=st)
                with sky.Compute(volumes=[vol], options=sky.Options(console=False)) as pool:
                    out["volume_seq_read_mb_s"] = mb / (read_on_node(f"{mount}/big.bin") >> pool)

            if args.boto3:
                import boto3
                from boto3.s3.transfer import TransferConfig

                client = boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id=s3.access_key,
                                      aws_secret_access_key=s3.secret_key, region_name="us-east-1",
                                      verify=False)
                cfg = TransferConfig(multipart_chunksize=32 << 20, max_concurrency=8)
                t0 = time.perf_counter()
                client.upload_file(str(src), "bench", "boto3.bin", Config=cfg)
                out["boto3_upload_mb_s"] = mb / (time.perf_counter() - t0)
                t0 = time.perf_counter()
                client.download_file("bench", "boto3.bin", str(work / "b.bin"), Config=cfg)
                out["boto3_download_mb_s"] = mb / (time.perf_counter() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for k, v in out.items():
        print(f"{k:24} {v:.0f}" if isinstance(v, float) else f"{k:24} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
