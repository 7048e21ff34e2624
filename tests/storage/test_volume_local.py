"""sky.Volume on sky.Local(): one rclone mount per pool on this machine, shared by its nodes,
against the moto server on loopback. Skipped (saying why) where FUSE cannot mount."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from s3server import S3Server, mounts_under, needs_fuse, sigterm_once_mounted

import skyward as sky
from skyward.observe import events as ev

pytestmark = needs_fuse
QUIET = sky.Options(console=False)


@sky.function
def listing(path: str) -> tuple[list[str], str]:
    return sorted(os.listdir(path)), Path(path, "one.txt").read_text()


@sky.function
def try_write(path: str) -> int | str:
    try:
        Path(path, "new.txt").write_text("no")
    except OSError as exc:
        return exc.errno or -1
    return "written"


def write_result(path: str, name: str) -> str:
    Path(path, name).write_text(f"result of {name}")
    return name


def test_a_task_reads_an_uploaded_file_on_every_node(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("hello from the bucket")
    st = s3.storage()
    st.upload(bucket, tmp_path / "one.txt", key="ds/one.txt")
    st.upload(bucket, tmp_path / "one.txt", key="ds/sub/two.txt")
    st.upload(bucket, tmp_path / "one.txt", key="elsewhere.txt")
    mount = str(tmp_path / "data")
    seen: list[sky.Event] = []
    unsubscribe = sky.subscribe(seen.append)
    try:
        with sky.Compute(nodes=2, volumes=[sky.Volume(bucket, mount, prefix="ds", storage=st)], options=QUIET) as pool:
            assert mounts_under(mount) == [mount]  # one mount for the pool, not one per node
            ev.bus.flush()
            phases = [(e.node, e.status) for e in seen
                      if isinstance(e, sky.BootstrapPhase) and e.pool == pool.id and e.phase == "volumes"]
            assert phases == [(-1, "started"), (-1, "done")]  # a phase of its own, once for the pool
            assert listing(mount) @ pool == [(["one.txt", "sub"], "hello from the bucket")] * 2
            assert try_write(mount) >> pool == errno.EROFS
    finally:
        unsubscribe()
    assert mounts_under(mount) == []
    assert not Path(mount).exists()  # the mount point skyward made is gone too


def test_a_read_write_volume_is_in_the_bucket_after_the_pool_closes(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    st = s3.storage()
    mount = tmp_path / "out"
    mount.mkdir()  # an existing empty folder is used as it is, and kept
    vol = sky.Volume(bucket, str(mount), prefix="runs/1", read_only=False, storage=st)
    with sky.Compute(nodes=2, volumes=[vol], options=QUIET) as pool:
        names = pool.map(lambda i: write_result(str(mount), f"part-{i}.txt"), range(4))
    assert sorted(names) == [f"part-{i}.txt" for i in range(4)]
    assert mounts_under(mount) == [] and mount.is_dir()
    assert st.ls(bucket, prefix="runs/1/") == [f"runs/1/part-{i}.txt" for i in range(4)]
    out = st.download(bucket, "runs/1/part-3.txt", tmp_path / "check.txt")
    assert out.read_text() == "result of part-3.txt"


def test_the_unmount_asks_rclone_again_when_an_answer_does_not_come(s3: S3Server, bucket: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Files are uploaded a second after they are closed, and rclone drops what is still queued
    when it is unmounted: the unmount waits until its remote control says nothing is queued.
    Asked on a loaded machine, that answer may not come; the next is asked for, rather than
    unmounting at once (which lost the files: the pool closes well within that second)."""
    from skyward.bootstrap import mounts

    real = mounts.local_rclone()
    fails = tmp_path / "rc-fails"
    fails.write_text("2")  # (the first two `rclone rc` calls fail, as under load)
    wrapper = tmp_path / "rclone"
    wrapper.write_text(f"""#!/bin/bash
if [ "$1" = rc ]; then
  n=$(cat {fails}); if [ "$n" -gt 0 ]; then echo $((n - 1)) > {fails}; exit 1; fi
fi
exec {real} "$@"
""")
    wrapper.chmod(0o755)
    monkeypatch.setattr(mounts, "local_rclone", lambda: str(wrapper))
    st = s3.storage()
    mount = tmp_path / "out"
    vol = sky.Volume(bucket, str(mount), prefix="runs/2", read_only=False, storage=st)
    with sky.Compute(nodes=1, volumes=[vol], options=QUIET) as pool:
        pool.map(lambda i: write_result(str(mount), f"part-{i}.txt"), range(2))
    assert st.ls(bucket, prefix="runs/2/") == ["runs/2/part-0.txt", "runs/2/part-1.txt"]
    assert fails.read_text().strip() == "0"  # (both failures were met)


def test_an_exception_in_the_block_unmounts(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    mount = str(tmp_path / "data")
    with pytest.raises(RuntimeError, match="user bug"), \
            sky.Compute(volumes=[sky.Volume(bucket, mount, storage=s3.storage())], options=QUIET):
        assert mounts_under(mount) == [mount]
        raise RuntimeError("user bug")
    assert mounts_under(mount) == []


def test_sigterm_unmounts(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    mount = str(tmp_path / "data")
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        import skyward as sky
        st = sky.Storage({s3.endpoint!r}, {s3.access_key!r}, {s3.secret_key!r}, path_style=True)
        with sky.Compute(volumes=[sky.Volume({bucket!r}, {mount!r}, storage=st)],
                         options=sky.Options(console=False)):
            print("mounted", flush=True)
            # Short sleeps: the kernel may hand SIGTERM to any of the process's threads, and a
            # main thread asleep in one long time.sleep() runs the handler only when it wakes.
            for _ in range(1200):
                time.sleep(0.1)
    """))
    def mounted() -> None:
        assert mounts_under(mount) == [mount]

    try:
        sigterm_once_mounted(script, mounted, 60)
        deadline = time.monotonic() + 10
        while mounts_under(mount) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mounts_under(mount) == []
    finally:  # a failure (the client timed out under load) must not leave the mount behind
        for left in mounts_under(mount):
            subprocess.run(["fusermount3", "-u", "-z", left], capture_output=True)


def test_a_non_empty_mount_point_fails_clearly(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    st = s3.storage()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "file").write_text("x")
    with pytest.raises(sky.ProviderError, match="not empty"), \
            sky.Compute(volumes=[sky.Volume(bucket, str(busy), storage=st)], options=QUIET):
        pass
    assert mounts_under(tmp_path) == []
    assert (busy / "file").read_text() == "x"


_ORPHAN = """
import ctypes, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the killed client's children land here
mount = sys.argv[2]
client = subprocess.Popen([sys.executable, sys.argv[1]], stdout=subprocess.PIPE, text=True)
print(client.stdout.readline().strip(), flush=True)
sys.stdin.readline()
client.kill()
client.wait()
t0 = time.monotonic()
def mounted():
    with open("/proc/mounts") as f:
        return any(line.split()[1] == mount for line in f)
while mounted() and time.monotonic() - t0 < 60:
    time.sleep(0.1)
print(f"{time.monotonic() - t0:.2f} {int(mounted())}", flush=True)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:  # reap the orphans (agents, rclone) as they exit
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0:
        time.sleep(0.1)
"""


def test_a_killed_client_leaves_no_mount_after_its_ttl(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    mount = str(tmp_path / "data")
    (tmp_path / "orphan.py").write_text(_ORPHAN)
    (tmp_path / "client.py").write_text(textwrap.dedent(f"""
        import time
        import skyward as sky
        st = sky.Storage({s3.endpoint!r}, {s3.access_key!r}, {s3.secret_key!r}, path_style=True)
        with sky.Compute(volumes=[sky.Volume({bucket!r}, {mount!r}, storage=st)], ttl=3,
                         options=sky.Options(console=False)):
            print("mounted", flush=True)
            time.sleep(120)
    """))
    reaper = subprocess.Popen([sys.executable, str(tmp_path / "orphan.py"), str(tmp_path / "client.py"), mount],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert reaper.stdin is not None and reaper.stdout is not None
        assert reaper.stdout.readline().strip() == "mounted"
        assert mounts_under(mount) == [mount]
        reaper.stdin.write("go\n")
        reaper.stdin.flush()
        elapsed, still = reaper.stdout.readline().split()
        print(f"the mount went {elapsed} s after the client was killed (ttl 3 s)")
        assert still == "0" and mounts_under(mount) == []  # the agents' orphan cleanup unmounted it
        assert reaper.wait(60) == 0
    finally:
        if reaper.poll() is None:
            reaper.kill()
        reaper.wait()
