"""Shared-memory segments (bootstrap/shm.py): one copy in, none out, reuse, and nothing left.

The pool-level exit paths (close, exception, a killed client, a killed node, a full
/dev/shm) are in tests/test_payload_shm.py; these check the segments themselves."""

from __future__ import annotations

import gc
import mmap
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import small_tmpfs

from skyward.bootstrap import serialize, shm


def _segments(folder: Path) -> list[shm._Segment]:
    return shm._owners[folder].segments


def _root(arr: np.ndarray) -> object:
    """What an array's memory belongs to, through views and memoryviews."""
    base: object = arr
    while isinstance(base, np.ndarray | memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return base


def test_an_array_is_copied_once_and_rebuilt_on_the_mapping_writable(spill: Path) -> None:
    arr = np.random.default_rng(1).random(500_000)  # 4 MB
    flags, body, buffers = serialize.dumps((arr, b"small"), spill=spill)
    assert buffers[0][0] == serialize.BUF_SPILLED and len(buffers[0][1]) < 200  # a reference
    assert len(list(spill.iterdir())) == 1
    out, small = serialize.loads(flags, body, buffers)
    np.testing.assert_array_equal(out, arr)
    assert small == b"small"
    # No copy: the array's memory is the receiver's mapping of the segment.
    assert isinstance(_root(out), mmap.mmap)
    out[0] = 42.0  # writable: the bytes are the receiver's until it lets go
    assert out[0] == 42.0


def test_the_segment_is_lent_while_any_view_lives_then_reused(spill: Path) -> None:
    arr = np.random.default_rng(2).random(500_000)
    out = serialize.loads(*serialize.dumps(arr, spill=spill))
    (seg,) = _segments(spill)
    part = out[10:20]  # a view of the array keeps the segment too
    del out
    gc.collect()
    assert not seg.free()
    del part
    assert seg.free()  # released as soon as the last view goes (no gc cycle needed)
    again = serialize.loads(*serialize.dumps(arr * 2, spill=spill))
    assert _segments(spill) == [seg] and len(list(spill.iterdir())) == 1  # reused, not a new file
    np.testing.assert_array_equal(again, arr * 2)
    # While lent, a second payload gets a segment of its own: the first is never overwritten.
    other = serialize.loads(*serialize.dumps(arr * 3, spill=spill))
    assert len(_segments(spill)) == 2
    np.testing.assert_array_equal(again, arr * 2)
    np.testing.assert_array_equal(other, arr * 3)


def test_a_values_buffers_share_one_segment_lent_until_its_last_view_goes(spill: Path) -> None:
    rng = np.random.default_rng(11)
    state = {f"layer{i}": rng.random(200_000 + 7 * i) for i in range(5)}  # 1.6 MB each, odd sizes
    flags, body, buffers = serialize.dumps(state, spill=spill)
    assert [b[0] for b in buffers] == [serialize.BUF_SPILLED] * 5
    assert len(list(spill.iterdir())) == 1  # one reservation, one file, one mapping to receive
    (seg,) = _segments(spill)
    out = serialize.loads(flags, body, buffers)
    for key, arr in state.items():
        np.testing.assert_array_equal(out[key], arr)
        assert out[key].ctypes.data % mmap.ALLOCATIONGRANULARITY == 0  # each on a page boundary
    assert len({id(_root(a)) for a in out.values()}) == 1
    keep = out["layer3"][5:9]
    del out
    gc.collect()
    assert not seg.free()  # one part's view still lives: the whole segment stays lent
    del keep
    assert seg.free()
    again = serialize.loads(*serialize.dumps(state, spill=spill))
    assert _segments(spill) == [seg]  # reused
    np.testing.assert_array_equal(again["layer4"], state["layer4"])


def test_a_forked_child_dropping_its_copy_of_a_view_gives_nothing_back(spill: Path) -> None:
    arr = np.random.default_rng(12).random(500_000)
    out = serialize.loads(*serialize.dumps(arr, spill=spill))
    (seg,) = _segments(spill)
    pid = os.fork()
    if pid == 0:  # the child's copy of the view goes: its finalizer runs here, in the child
        try:
            del out
            gc.collect()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert not seg.free()  # still lent: the parent's array lives on it
    np.testing.assert_array_equal(out, arr)
    del out
    assert seg.free()


def test_a_child_forked_while_the_locks_were_held_still_moves_arrays(spill: Path) -> None:
    out = serialize.loads(*serialize.dumps(np.arange(300_000.0), spill=spill))  # an owner, a mapping
    held: list[Any] = [shm._maps_lock, shm._owners_lock, shm._owners[spill].lock, shm._janitor.lock, shm._lent_lock]
    for lock in held:  # as if other threads were inside them at the fork
        lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(20)  # a child that hangs dies, and the parent says so
                arr = np.random.default_rng(13).random(400_000)
                back = serialize.loads(*serialize.dumps({"a": arr, "b": arr * 2}, spill=spill))
                code = 0 if np.array_equal(back["b"], arr * 2) else 2
            finally:
                os._exit(code)
    finally:
        for lock in held:
            lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    del out


def test_a_values_segment_never_read_is_given_back(spill: Path) -> None:
    parts = [np.random.default_rng(i).random(150_000) for i in range(3)]
    _, _, buffers = serialize.dumps(parts, spill=spill)
    (seg,) = _segments(spill)
    assert not seg.free()
    serialize.discard(buffers)
    assert seg.free()


def test_a_payload_never_read_is_given_back(spill: Path) -> None:
    arr = np.random.default_rng(3).random(500_000)
    _, _, buffers = serialize.dumps(arr, spill=spill)
    (seg,) = _segments(spill)
    assert not seg.free()
    serialize.discard(buffers)
    assert seg.free()
    serialize.discard(buffers)  # twice (or too late) changes nothing
    _, _, newer = serialize.dumps(arr, spill=spill)  # reused: a stale release must not free it
    serialize.discard(buffers)
    assert not seg.free()
    serialize.discard(newer)
    assert seg.free()


def test_small_and_remote_buffers_keep_the_stream(spill: Path) -> None:
    small = np.arange(1000.0)
    _, _, buffers = serialize.dumps(small, spill=spill)
    assert buffers[0][0] == 0 and not list(spill.iterdir())
    big = np.random.default_rng(4).random(500_000)
    _, _, buffers = serialize.dumps(big)  # no spill folder: a remote node
    assert buffers[0][0] == 0 and bytes(buffers[0][1][:8]) == big.tobytes()[:8]


def test_idle_and_surplus_free_segments_are_removed(spill: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = [np.full(300_000 + i, float(i)) for i in range(3)]  # 2.4 MB each, different sizes
    held = [serialize.loads(*serialize.dumps(a, spill=spill)) for a in arrays]
    assert len(list(spill.iterdir())) == 3
    del held
    owner = shm._owners[spill]
    owner.keep_bytes = 6 << 20  # room for two 3 MB segments
    with owner.lock:
        owner.trim(shm.IDLE)
    assert len(list(spill.iterdir())) == 2
    with owner.lock:
        assert not owner.trim(0.0)  # unused for 0 s or more: all of them go
    assert list(spill.iterdir()) == []


def test_a_segment_released_after_its_owner_died_is_removed(spill: Path) -> None:
    """The owner (a worker, say) exits while its result is still held: the receiver's release
    removes the file, and the agent's sweep removes the owner's free ones."""
    code = textwrap.dedent(f"""
        import numpy as np, sys
        from pathlib import Path
        from skyward.bootstrap import serialize
        folder = Path({str(spill)!r})
        lent = serialize.dumps(np.ones(500_000), spill=folder)
        free = serialize.dumps(np.zeros(600_000), spill=folder)
        serialize.discard(free[2])
        sys.stdout.buffer.write(repr(lent).encode())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    flags, body, buffers = eval(out.stdout)  # (int, bytes, [(int, bytes)]): our own repr
    assert len(list(spill.iterdir())) == 2
    value = serialize.loads(flags, body, buffers)
    np.testing.assert_array_equal(value, np.ones(500_000))
    pid = int(os.fsdecode(bytes(buffers[0][1][shm.REF.size :])).rsplit("/", 1)[1].split("-")[0])
    shm.sweep(spill, pid)  # the free one goes; the lent one stays while we hold it
    assert len(list(spill.iterdir())) == 1
    del value
    assert list(spill.iterdir()) == []


def test_a_full_folder_falls_back_to_the_stream(caplog: pytest.LogCaptureFixture) -> None:
    with small_tmpfs("16m") as folder:
        fits = np.random.default_rng(5).random(250_000)  # 2 MB
        too_big = np.random.default_rng(6).random(2_000_000)  # 16 MB: cannot fit
        try:
            payload = serialize.dumps((fits, too_big), spill=folder)
            flags = [b[0] for b in payload[2]]
            assert flags == [serialize.BUF_SPILLED, 0]  # the big one through the stream
            a, b = serialize.loads(*payload)
            np.testing.assert_array_equal(a, fits)
            np.testing.assert_array_equal(b, too_big)
            assert "no room for a 16 MB buffer" in caplog.text and str(folder) in caplog.text
            del a, b
        finally:
            shm.forget(folder)
        assert list(folder.iterdir()) == []


def test_allocation_failing_mid_way_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """posix_fallocate reserves every page before the copy: a tmpfs that fills up between the
    free-space check and the allocation gives ENOSPC there (never SIGBUS in the memcpy)."""
    monkeypatch.setattr(shm, "_room", lambda directory, size: True)
    with small_tmpfs("8m") as folder:
        arr = np.random.default_rng(7).random(2_000_000)  # 16 MB
        try:
            payload = serialize.dumps(arr, spill=folder)
            assert payload[2][0][0] == 0
            np.testing.assert_array_equal(serialize.loads(*payload), arr)
        finally:
            shm.forget(folder)
        assert list(folder.iterdir()) == []


def test_mappings_of_removed_segments_are_dropped(spill: Path) -> None:
    """A receiver's mapping would keep a removed segment's memory: the janitor's sweep (here
    called directly) unmaps it."""
    arr = np.random.default_rng(8).random(500_000)
    out = serialize.loads(*serialize.dumps(arr, spill=spill))
    del out
    (path,) = list(spill.iterdir())
    assert os.fsencode(path) in shm._maps
    owner = shm._owners[spill]
    with owner.lock:
        owner.trim(0.0)  # the owner removes it
    assert not path.exists()
    assert any(str(path) in line for line in Path("/proc/self/maps").read_text().splitlines())
    shm._unmap_stale()
    assert os.fsencode(path) not in shm._maps
    assert not any(str(path) in line for line in Path("/proc/self/maps").read_text().splitlines())


def test_large_bytes_travel_out_of_band_too(spill: Path) -> None:
    """Pickle keeps bytes inside its stream (no hook sees them): a persistent id takes the
    large ones out, so they reach shared memory (Local) or travel beside the body (remote)."""
    big, mutable = os.urandom(3 << 20), bytearray(os.urandom(2 << 20))
    value = {"b": big, "nested": [mutable, b"small", big]}
    flags, body, buffers = serialize.dumps(value, spill=spill)
    assert flags & serialize.FLAG_BODY_OOB and len(body) < 1000
    assert [b[0] for b in buffers] == [serialize.BUF_SPILLED] * 2  # `big` once, though twice in
    out = serialize.loads(flags, body, buffers)
    assert out == value and type(out["nested"][0]) is bytearray and type(out["b"]) is bytes
    assert all(seg.free() for seg in _segments(spill))  # copied out: the segments are free again
    flags, body, buffers = serialize.dumps(value)  # no folder: beside the body, not inside it
    assert flags & serialize.FLAG_BODY_OOB and len(body) < 1000 and len(buffers) == 2
    assert serialize.loads(flags, body, buffers) == value
    small = serialize.dumps([b"x" * 1000])
    assert not small[0] & serialize.FLAG_BODY_OOB and small[2] == []
    # Deeper than the quick look goes (a long list): found when the pickle turns out large.
    deep = [[i, b"x"] for i in range(100)] + [[[[big]]]]
    flags, body, buffers = serialize.dumps(deep, spill=spill)
    assert flags & serialize.FLAG_BODY_OOB and len(body) < 5000 and len(buffers) == 1
    assert serialize.loads(flags, body, buffers) == deep
