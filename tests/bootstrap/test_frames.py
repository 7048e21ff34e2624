"""Frame codec and payload encoding over real socket pairs."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import numpy as np
import pytest

from skyward.bootstrap import serialize
from skyward.bootstrap.frames import Frame, FrameReader, FrameWriter, Kind


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def _send_async(writer: FrameWriter, frames: list[Frame]) -> threading.Thread:
    t = threading.Thread(target=lambda: [writer.send(f) for f in frames])
    t.start()
    return t


def test_small_and_large_frames_round_trip(pair) -> None:
    a, b = pair
    big = os.urandom(3 * 1024 * 1024)
    frames = [
        Frame(Kind.TASK, 1, b"hello"),
        Frame(Kind.RESULT, 2**40, b"", 3, [(0, b"x" * 10), (1, big), (2, b"/path")]),
        Frame(Kind.OUTPUT, 7, big),
        *[Frame(Kind.PING, i, bytes([i % 256]) * i) for i in range(200)],
    ]
    t = _send_async(FrameWriter(a), frames)
    reader = FrameReader(b)
    got = [reader.read() for _ in frames]
    t.join()
    for sent, recv in zip(frames, got, strict=True):
        assert (recv.kind, recv.task_id, recv.flags) == (sent.kind, sent.task_id, sent.flags)
        assert bytes(recv.body) == bytes(sent.body)
        assert [(c, bytes(d)) for c, d in recv.buffers] == [(c, bytes(d)) for c, d in sent.buffers]


def test_a_quiet_link_keeps_a_small_read_buffer_and_a_busy_one_grows_it(pair) -> None:
    """A link that carries a frame now and then (a node of a large pool between tasks) holds
    16 KiB; a burst that fills the buffer grows it, up to 256 KiB; every frame arrives whole."""
    from skyward.bootstrap.frames import _FIRST_CHUNK, _READ_CHUNK

    a, b = pair
    writer, reader = FrameWriter(a), FrameReader(b)
    for i in range(50):  # one at a time: each is read before the next is sent
        writer.send(Frame(Kind.PING, i, b"p" * 100))
        assert reader.read().task_id == i
    assert len(reader._buf) == _FIRST_CHUNK
    medium = os.urandom(100 * 1024)  # larger than the first buffer, read through it
    t = _send_async(writer, [Frame(Kind.OUTPUT, 1, medium)])
    assert reader.read().body == medium
    t.join()
    burst = [Frame(Kind.RESULT, i, bytes([i % 256]) * (i % 3000)) for i in range(2000)]
    t = _send_async(writer, burst)
    got = [reader.read() for _ in burst]
    t.join()
    assert [(f.task_id, f.body) for f in got] == [(f.task_id, f.body) for f in burst]
    assert len(reader._buf) == _READ_CHUNK


def test_eof_is_reported(pair) -> None:
    a, b = pair
    a.close()
    with pytest.raises(EOFError):
        FrameReader(b).read()


def test_truncated_frame_is_reported(pair) -> None:
    a, b = pair
    FrameWriter(a).send(Frame(Kind.TASK, 1, b"x" * 100))
    data = b.recv(50)
    c, d = socket.socketpair()
    c.sendall(data)
    c.close()
    with pytest.raises(EOFError, match="middle"):
        FrameReader(d).read()
    d.close()


def test_arrays_travel_out_of_band_and_come_back_writable(pair) -> None:
    a, b = pair
    arr = np.random.default_rng(0).random(1_000_000)
    flags, body, buffers = serialize.dumps({"x": arr})
    assert len(body) < 1000  # the array is not inside the pickle
    assert buffers[0][0] == 0  # random floats: not compressed
    t = _send_async(FrameWriter(a), [Frame(Kind.TASK, 1, body, flags, buffers)])
    out = serialize.loads_frame(FrameReader(b).read())["x"]
    t.join()
    np.testing.assert_array_equal(out, arr)
    out += 1  # writable
    small = serialize.loads(*serialize.dumps(np.arange(10)))
    small += 1


def test_compression_only_where_it_pays() -> None:
    flags, body, buffers = serialize.dumps(np.zeros(1_000_000))
    assert buffers[0][0] == serialize.BUF_LZ4 and len(buffers[0][1]) < 100_000
    np.testing.assert_array_equal(serialize.loads(flags, body, buffers), np.zeros(1_000_000))
    text = "abc" * 100_000
    flags, body, _ = serialize.dumps(text)
    assert flags & serialize.FLAG_BODY_LZ4 and len(body) < 50_000
    assert serialize.loads(flags, body, []) == text


def test_no_compression_between_processes_of_one_host() -> None:
    """A Local pool's tasks and results go uncompressed both ways: lz4 is slower than a copy
    through a local socket. The client asks for it; the worker learns it from its agent."""
    text = "abc" * 100_000
    flags, body, buffers = serialize.dumps((text, np.zeros(100_000)), compress=False)
    assert not flags & serialize.FLAG_BODY_LZ4 and len(body) > 300_000
    assert [b for b, _ in buffers] == [0]
    got = serialize.loads(flags, body, buffers)
    assert got[0] == text and not got[1].any()

    import skyward as sky

    seen: list[tuple[int, bool]] = []  # (size of the payload, whether lz4 touched it)
    real = serialize.loads

    def record(flags: int, body: Any, buffers: serialize.Buffers) -> Any:
        seen.append((memoryview(body).nbytes,
                     bool(flags & serialize.FLAG_BODY_LZ4 or any(b & serialize.BUF_LZ4 for b, _ in buffers))))
        return real(flags, body, buffers)

    @sky.function
    def echo(x: Any) -> Any:
        return x

    @sky.function
    def stream_and_store(x: Any) -> Any:  # a streamed value, a collection value, an error
        sky.dict("kept")["x"] = x
        yield x
        raise ValueError(x)

    with sky.Compute(nodes=1, options=sky.Options(console="silent")) as pool:
        serialize.loads = record  # (loads_frame calls it too)
        try:
            assert echo(text) >> pool == text
            assert pool.map(echo, [text, text]) == [text, text]
            got = stream_and_store(text) >> pool
            assert next(got) == text
            with pytest.raises(ValueError):
                next(got)
            assert pool.dict("kept")["x"] == text
        finally:
            serialize.loads = real
        pool_spill = pool.cluster.spill_dir
    assert pool_spill is not None and not any(lz4 for _, lz4 in seen)
    # The result, the chunk's, the streamed value, the collection value and the error: whole.
    assert sum(size >= 300_000 for size, _ in seen) >= 5


def test_describe_unpicklable_names_the_argument() -> None:
    lock = threading.Lock()
    assert "positional argument 1" in serialize.describe_unpicklable(len, (1, lock), {})
    assert "keyword argument 'k'" in serialize.describe_unpicklable(len, (), {"k": lock})
