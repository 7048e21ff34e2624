"""Streaming copies into shared memory (bootstrap/ntcopy.py): the bytes, every alignment,
the way shm.py uses them, the switch that turns them off, and the code page's permissions."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from skyward.bootstrap import ntcopy, serialize, shm

X86_64_LINUX = sys.platform == "linux" and os.uname().machine in ("x86_64", "amd64")


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


@pytest.fixture
def spill() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="skyward-test-", dir="/dev/shm"))
    try:
        yield folder
    finally:
        shm.forget(folder)
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()


def test_it_is_there_on_x86_64_linux() -> None:
    # Where it could be and is not, every large copy quietly takes the slow path: say so.
    assert ntcopy.available() is X86_64_LINUX


@pytest.mark.skipif(not X86_64_LINUX, reason="streaming copies are built for x86-64 Linux only")
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, ntcopy._BLOCK - 1, ntcopy._BLOCK, ntcopy._BLOCK + 1,
                               3 * ntcopy._BLOCK + 4096 + 17, 5_000_003])
def test_every_byte_lands_and_nothing_around_it(n: int) -> None:
    rng = np.random.default_rng(n)
    for src_off in (0, 1, 7, 16, 33):
        for dst_off in (0, 1, 15, 48, 63):
            src = rng.integers(0, 256, n + src_off + 64, dtype=np.uint8)
            dst = np.zeros(n + dst_off + 128, np.uint8)
            assert ntcopy.copy(_address(dst) + dst_off, _address(src) + src_off, n)
            assert np.array_equal(dst[dst_off : dst_off + n], src[src_off : src_off + n]), (n, src_off, dst_off)
            assert not dst[:dst_off].any() and not dst[dst_off + n :].any(), (n, src_off, dst_off)


@pytest.mark.skipif(not X86_64_LINUX, reason="streaming copies are built for x86-64 Linux only")
def test_the_code_page_is_never_writable_and_executable() -> None:
    assert ntcopy.available()
    page = ntcopy._keep[0]
    import ctypes

    address = ctypes.addressof(ctypes.c_char.from_buffer(page))  # type: ignore[arg-type]
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            low, high = (int(x, 16) for x in span.split("-"))
            if low <= address < high:
                assert perms.startswith("r-x"), line
                return
    raise AssertionError(f"no mapping holds the code page at {address:#x}")


def test_shm_copies_large_buffers_with_it_and_small_ones_with_memcpy(
    spill: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = ntcopy.copy

    def counted(dst: int, src: int, n: int) -> bool:
        calls.append(n)
        return real(dst, src, n)

    monkeypatch.setattr(ntcopy, "copy", counted)
    big = np.random.default_rng(1).integers(0, 256, ntcopy.MIN + 12_345, dtype=np.uint8)
    small = np.random.default_rng(2).integers(0, 256, ntcopy.MIN - 1, dtype=np.uint8)
    flags, body, buffers = serialize.dumps({"big": big, "small": small}, spill=spill)
    assert calls == [big.nbytes]
    out = serialize.loads(flags, body, buffers)
    assert np.array_equal(out["big"], big) and np.array_equal(out["small"], small)


def test_where_it_cannot_be_shm_copies_as_before(spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ntcopy, "_loop", None)
    monkeypatch.setattr(ntcopy, "_tried", True)
    assert not ntcopy.available()
    big = np.random.default_rng(3).random(ntcopy.MIN // 8 * 3)
    flags, body, buffers = serialize.dumps(big, spill=spill)
    assert buffers[0][0] == serialize.BUF_SPILLED
    assert np.array_equal(serialize.loads(flags, body, buffers), big)


def test_the_switch_turns_it_off_and_a_forked_child_can_use_it(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import os, sys
        import numpy as np
        from skyward.bootstrap import ntcopy
        print(ntcopy.available())
        src = np.arange(1 << 20, dtype=np.uint8)
        dst = np.zeros_like(src)
        pid = os.fork()
        if pid == 0:  # the child copies with the page it inherited
            ok = ntcopy.copy(dst.__array_interface__["data"][0], src.__array_interface__["data"][0], src.nbytes)
            os._exit(0 if (not ok or (dst == src).all()) else 1)
        print(os.waitpid(pid, 0)[1])
    """)
    env = {**os.environ, "SKYWARD_NT_COPY": "0"}
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert off.stdout.split() == ["False", "0"], off.stderr
    env.pop("SKYWARD_NT_COPY")
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert on.stdout.split() == [str(X86_64_LINUX), "0"], on.stderr
