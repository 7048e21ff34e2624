"""Streaming copies into shared memory (bootstrap/ntcopy.py): the bytes, every alignment,
the way shm.py uses them, the switch that turns them off, and the code page's permissions."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from skyward.bootstrap import ntcopy, serialize

X86_64_LINUX = sys.platform == "linux" and os.uname().machine in ("x86_64", "amd64")


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


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
            assert ntcopy.copy_many([(_address(dst) + dst_off, _address(src) + src_off, n)])
            assert np.array_equal(dst[dst_off : dst_off + n], src[src_off : src_off + n]), (n, src_off, dst_off)
            assert not dst[:dst_off].any() and not dst[dst_off + n :].any(), (n, src_off, dst_off)


@pytest.mark.skipif(not X86_64_LINUX, reason="streaming copies are built for x86-64 Linux only")
@pytest.mark.parametrize("ways", [2, 3, 4])
def test_a_copy_cut_among_threads_lands_whole(ways: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ntcopy, "ways", lambda: ways)
    used: set[str] = set()
    real = ntcopy._Helpers._run

    def run(self: ntcopy._Helpers) -> None:
        import threading

        used.add(threading.current_thread().name)
        real(self)

    monkeypatch.setattr(ntcopy, "_helpers_now", None)  # helpers of this test's own
    monkeypatch.setattr(ntcopy._Helpers, "_run", run)
    n = ntcopy.PARALLEL_MIN + 3 * ntcopy._BLOCK + 4096 + 5
    src = np.random.default_rng(ways).integers(0, 256, n + 7, dtype=np.uint8)
    dst = np.zeros(n + 64, np.uint8)
    assert ntcopy.copy_many([(_address(dst) + 1, _address(src) + 7, n)])
    assert np.array_equal(dst[1 : 1 + n], src[7 : 7 + n]) and dst[0] == 0 and not dst[1 + n :].any()
    assert len(used) == ways - 1  # the calling thread copied a part itself


@pytest.mark.parametrize("ways", [1, 2, 3, 4])
def test_shares_are_even_whole_blocks_and_cover_every_byte(ways: int) -> None:
    block = ntcopy._BLOCK
    bodies = [(1 << 40, 1 << 41, 5 * block), (2 << 40, 2 << 41, 7 * block), (3 << 40, 3 << 41, block)]
    shares = ntcopy._shares(bodies, ways)
    assert 1 <= len(shares) <= ways
    sizes = [sum(n for _, _, n in share) for share in shares]
    each = -(-13 * block // ways // block) * block  # 13 blocks in all, as evenly as whole blocks go
    assert sizes[:-1] == [each] * (len(sizes) - 1) and 0 < sizes[-1] <= each and sum(sizes) == 13 * block
    covered = sorted((d, s, n) for share in shares for d, s, n in share)
    for (dst, src, n) in bodies:  # each body's pieces follow one another, dst and src alike
        pieces = [p for p in covered if dst <= p[0] < dst + n]
        assert pieces[0][:2] == (dst, src) and sum(p[2] for p in pieces) == n
        for a, b in itertools.pairwise(pieces):
            assert b[0] == a[0] + a[2] and b[1] == a[1] + a[2]


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


def test_shm_streams_a_values_large_buffers_at_once_and_memcpys_small_values(
    spill: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[int]] = []
    real = ntcopy.copy_many

    def counted(copies: list[tuple[int, int, int]]) -> bool:
        calls.append([n for _, _, n in copies])
        return real(copies)

    monkeypatch.setattr(ntcopy, "copy_many", counted)
    rng = np.random.default_rng(1)
    big = rng.integers(0, 256, ntcopy.MIN + 12_345, dtype=np.uint8)
    bigger = rng.random(ntcopy.PARALLEL_MIN // 8 + 3)
    tiny = rng.integers(0, 256, 100_000, dtype=np.uint8)  # in the frame, not in a segment
    layers = [rng.integers(0, 256, 2_000_000, dtype=np.uint8) for _ in range(3)]
    cases: list[tuple[Any, list[int]]] = [
        ({"big": big, "bigger": bigger, "tiny": tiny}, [big.nbytes, bigger.nbytes]),
        (layers[:2], []),  # 4 MB in all: under MIN, memcpy
        (layers, [2_000_000] * 3),  # 6 MB in all: as one large value
    ]
    for value, streamed in cases:
        calls.clear()
        flags, body, buffers = serialize.dumps(value, spill=spill)
        assert calls == ([streamed] if streamed else []), value  # one value's copies: all at once
        out = serialize.loads(flags, body, buffers)
        if isinstance(value, dict):
            assert all(np.array_equal(out[k], value[k]) for k in value)
        else:
            assert all(np.array_equal(a, b) for a, b in zip(out, value, strict=True))


def test_where_it_cannot_be_shm_copies_as_before(spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ntcopy, "_loop", None)
    monkeypatch.setattr(ntcopy, "_tried", True)
    assert not ntcopy.available()
    big = np.random.default_rng(3).random(ntcopy.MIN // 8 * 3)
    flags, body, buffers = serialize.dumps(big, spill=spill)
    assert buffers[0][0] == serialize.BUF_SPILLED
    assert np.array_equal(serialize.loads(flags, body, buffers), big)


def test_the_switch_turns_it_off_and_a_forked_child_can_use_it_whatever_the_parent_held(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import os, sys
        import numpy as np
        from skyward.bootstrap import ntcopy
        print(ntcopy.available())
        src = np.arange((ntcopy.PARALLEL_MIN * 2 + 12345) // 8, dtype=np.uint64).view(np.uint8)
        dst = np.zeros_like(src)
        ntcopy.copy_many([(dst.__array_interface__["data"][0], src.__array_interface__["data"][0], src.nbytes)])
        dst[:] = 0  # the parent's helpers (if any) started: the child must start its own
        ntcopy._helpers_lock.acquire()  # as if another thread was handing out work at the fork
        pid = os.fork()
        if pid == 0:  # the child copies with the page it inherited
            import signal
            signal.alarm(20)  # a child that hangs dies, and the parent says so
            ok = ntcopy.copy_many([(dst.__array_interface__["data"][0], src.__array_interface__["data"][0], src.nbytes)])
            os._exit(0 if (not ok or (dst == src).all()) else 1)
        ntcopy._helpers_lock.release()
        print(os.waitpid(pid, 0)[1])
    """)
    env = {**os.environ, "SKYWARD_NT_COPY": "0"}
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert off.stdout.split() == ["False", "0"], off.stderr
    env.pop("SKYWARD_NT_COPY")
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert on.stdout.split() == [str(X86_64_LINUX), "0"], on.stderr
