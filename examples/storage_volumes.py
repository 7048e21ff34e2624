"""Buckets from your code (sky.Storage) and mounted on every node (sky.Volume).

    python examples/storage_volumes.py        # a local S3-compatible server (moto), sky.Local()
    SKYWARD_BUCKET=my-bucket AWS_REGION=us-east-1 python examples/storage_volumes.py   # real S3

Needs the storage extra (pip install 'skyward[storage]'). Without a bucket given, it starts
moto's S3 server on 127.0.0.1 for the run (pip install 'moto[server]'). The Volume part needs
FUSE on this machine (/dev/fuse and fusermount3: apt-get install fuse3); without it, it says so
and shows only the Storage part.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import skyward as sky


@contextlib.contextmanager
def local_s3() -> Iterator[sky.Storage]:
    """moto's S3 server on loopback, for this run only, with a bucket 'example-data'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            time.sleep(0.1)
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/example-data", method="PUT"))
        yield sky.Storage(f"http://127.0.0.1:{port}", access_key="example", secret_key="example", path_style=True)
    finally:
        server.terminate()
        server.wait()


@sky.function
def summarize(root: str) -> str:
    lines = Path(root, "numbers.txt").read_text().split()
    return f"{len(lines)} numbers, sum {sum(map(int, lines))}"


def save_result(root: str, node: int) -> str:
    path = Path(root, f"result-{node}.txt")
    path.write_text(f"node {node} was here\n")
    return path.name


def main() -> None:
    bucket = os.environ.get("SKYWARD_BUCKET")
    with contextlib.ExitStack() as stack:
        if bucket:
            storage = sky.storage.S3(region=os.environ.get("AWS_REGION", "us-east-1"))
        else:
            storage, bucket = stack.enter_context(local_s3()), "example-data"
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))

        # -- sky.Storage: from your own code --------------------------------------------------
        (work / "numbers.txt").write_text("\n".join(str(i) for i in range(1000)))
        with storage as st:
            st.upload(bucket, work / "numbers.txt", key="skyward-example/input/numbers.txt")
            print("in the bucket:", st.ls(bucket, prefix="skyward-example/"))

        # -- sky.Volume: the same bucket mounted on every node ----------------------------------
        from skyward.bootstrap.mounts import fuse_problem

        problem = fuse_problem()
        if problem:
            print(f"skipping the Volume part: {problem}")
            return
        data, out = str(work / "data"), str(work / "results")
        volumes = [
            sky.Volume(bucket, data, prefix="skyward-example/input", storage=storage),  # read-only
            sky.Volume(bucket, out, prefix="skyward-example/output", read_only=False, storage=storage),
        ]
        with sky.Compute(nodes=2, volumes=volumes) as pool:
            print("each node reads:", summarize(data) @ pool)
            print("written:", pool.map(lambda i: save_result(out, i), range(2)))
        # The pool closed: what the nodes wrote is in the bucket.
        with storage as st:
            print("results:", st.ls(bucket, prefix="skyward-example/output/"))
            for key in st.ls(bucket, prefix="skyward-example/"):
                st.rm(bucket, key)


if __name__ == "__main__":
    main()
