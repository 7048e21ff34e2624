"""torch tensors cross like numpy arrays: their storage goes out of band as one
buffer (shared memory on Local pools, rebuilt there without a copy), with dtype, shape, strides,
offset, sharing between views, requires_grad and nn.Parameter kept; odd layouts go through
torch's own pickle. A tensor that was on CUDA lands on CUDA where CUDA is, else on the CPU, said
once (a log warning and a Log event per pool); Options(tensor_device="cpu") puts it on the CPU
always. Without a GPU here, "on CUDA" is a pickle whose storage names cuda:0."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

import skyward as sky  # noqa: E402
from skyward.bootstrap import serialize  # noqa: E402
from skyward.observe import events as ev  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


def rt(obj: Any) -> Any:
    return serialize.loads(*serialize.dumps(obj))


def same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (type(a), type(b))
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
    assert a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
    assert a.requires_grad == b.requires_grad
    assert torch.equal(a.detach(), b.detach())


def storage_of(t: Any) -> int:
    return int(t.untyped_storage().data_ptr())


@pytest.fixture(autouse=True)
def _fresh_landing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test hears the 'landed on the CPU' warning anew."""
    monkeypatch.setattr(serialize, "_told", set())


def edge_cases() -> dict[str, Any]:
    """What must come back equal: one storage shared by several views, strides, offsets, dtypes,
    grads, parameters, odd layouts, containers."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(64, 48, generator=gen)
    model = torch.nn.Linear(8, 3)
    return {
        "base": base,
        "strided": base[3:, 1::3],  # offset and strides into base's storage
        "t": base.t(),
        "bf16": torch.randn(1000, generator=gen).to(torch.bfloat16),
        "f16": torch.randn(7, 5, generator=gen).half(),
        "ints": torch.arange(-50, 50, dtype=torch.int64).reshape(10, 10)[:, ::2],
        "bools": torch.rand(33, generator=gen) > 0.5,
        "complex": torch.randn(6, dtype=torch.complex64, generator=gen),
        "grad": torch.randn(5, requires_grad=True, generator=gen),
        "param": torch.nn.Parameter(torch.randn(4, 4, generator=gen)),
        "frozen": torch.nn.Parameter(torch.randn(2, generator=gen), requires_grad=False),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(3.5),
        "big": torch.randint(0, 255, (3 << 20,), dtype=torch.uint8, generator=gen),
        "state": model.state_dict(),
        "nested": [(torch.ones(2), {"x": [torch.zeros(3, dtype=torch.int8)]})],
        "sparse": torch.randn(4, 4, generator=gen).relu().to_sparse(),
        "csr": torch.randn(3, 3, generator=gen).relu().to_sparse_csr(),
        "conj": torch.randn(3, dtype=torch.complex64, generator=gen).conj(),
        "meta": torch.empty(2, 3, device="meta"),
    }


def check_edge_cases(back: dict[str, Any], sent: dict[str, Any]) -> None:
    for key in ("base", "strided", "t", "bf16", "f16", "ints", "bools", "complex", "grad", "param", "frozen",
                "empty", "scalar", "big"):
        same(back[key], sent[key])
    assert type(back["param"]) is torch.nn.Parameter and back["frozen"].requires_grad is False
    # Views that shared a storage share one again, and only they do.
    assert storage_of(back["base"]) == storage_of(back["strided"]) == storage_of(back["t"])
    assert storage_of(back["bf16"]) != storage_of(back["base"])
    back["base"][4, 1] = 1234.0
    assert back["strided"][1, 0].item() == 1234.0 and back["t"][1, 4].item() == 1234.0
    assert back["state"].keys() == sent["state"].keys()
    for k, v in sent["state"].items():
        same(back["state"][k], v)
    (ones, inner), = back["nested"]
    same(ones, torch.ones(2))
    same(inner["x"][0], torch.zeros(3, dtype=torch.int8))
    for key in ("sparse", "csr"):
        assert back[key].layout == sent[key].layout
        assert torch.equal(back[key].to_dense(), sent[key].to_dense())
    assert back["conj"].is_conj() and torch.equal(back["conj"], sent["conj"])
    assert back["meta"].is_meta and back["meta"].shape == (2, 3)


# -- through serialize -----------------------------------------------------------------------


def test_edge_cases_round_trip() -> None:
    sent = edge_cases()
    check_edge_cases(rt(sent), sent)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32,
                                   torch.uint8, torch.bool, torch.complex128])
def test_every_dtype(dtype: Any) -> None:
    t = (torch.arange(2 << 20) % 7).to(dtype).reshape(1024, -1)[::2, 3:]
    same(rt(t), t)


def test_a_storage_travels_once_out_of_band() -> None:
    """The bytes go beside the pickle, one buffer per storage however many views use it (torch's
    own pickle put them inside it: a 4 MB tensor made a 4 MB body)."""
    base = torch.randn(1 << 20)  # 4 MB
    flags, body, buffers = serialize.dumps({"a": base, "b": base[10:], "c": base.view(1024, 1024).t()})
    assert memoryview(body).nbytes < 2048, memoryview(body).nbytes
    assert [memoryview(b).nbytes for _, b in buffers] == [4 << 20]
    # The buffer is the tensor's own memory: nothing was copied on the way out.
    assert memoryview(buffers[0][1]).obj.__array_interface__["data"][0] == storage_of(base)
    back = serialize.loads(flags, body, buffers)
    assert storage_of(back["a"]) == storage_of(back["b"]) == storage_of(back["c"])


def test_small_storages_travel_inside_the_pickle() -> None:
    flags, body, buffers = serialize.dumps([torch.arange(10), torch.ones(3, 3)])
    assert buffers == []
    back = serialize.loads(flags, body, buffers)
    same(back[0], torch.arange(10))


def test_a_received_tensor_is_writable_and_owns_no_sender_memory() -> None:
    """Rebuilt on a read-only buffer (bytes), the tensor gets a copy it may write to."""
    t = torch.arange(1 << 18, dtype=torch.float32)
    flags, body, buffers = serialize.dumps(t)
    frozen = [(f, bytes(b)) for f, b in buffers]
    back = serialize.loads(flags, body, frozen)
    back[0] = 5.0
    assert back[0].item() == 5.0 and frozen[0][1][:4] == b"\0\0\0\0"


def test_a_cuda_storage_is_copied_to_the_host_straight_into_its_segment(tmp_path: Path) -> None:
    """On a Local pool a storage that must come to the host (CUDA; here a CPU one made to take that
    path) is copied once, into the shared-memory segment that travels, not into a buffer that is
    then copied into one; a segment reserved for a pickle that fails, or that is pickled again,
    is given back."""
    import threading

    from skyward.bootstrap import shm

    spill = Path(tempfile.mkdtemp(dir="/dev/shm")) if Path("/dev/shm").is_dir() else tmp_path

    def free() -> list[bool]:
        return [seg.free() for seg in shm._owners[spill].segments]

    t = torch.arange(1 << 20, dtype=torch.float32)
    try:
        with mock.patch.object(serialize, "_to_host", lambda data: True):
            flags, body, buffers = serialize.dumps({"a": t, "b": t[3:]}, spill=spill)
            assert [f for f, _ in buffers] == [serialize.BUF_SPILLED] and free() == [False]
            back = serialize.loads(flags, body, buffers)
            same(back["b"], t[3:])
            assert storage_of(back["a"]) == storage_of(back["b"])
            del back
            assert free() == [True]
            with pytest.raises(TypeError):
                serialize.dumps((t, threading.Lock()), spill=spill)
            assert free() == [True]
            # Bytes too deep for the first look: pickled twice; the first pass's segment is freed.
            flags, body, buffers = serialize.dumps([[[[b"x" * (2 << 20)]]], t], spill=spill)
            assert free().count(False) == 2
            serialize.discard(buffers)
            assert all(free())
    finally:
        shm.forget(spill)
        spill.rmdir()


class _FakeCudart:
    """torch.cuda.cudart() as _pin and _unpin use it, answering ``answer`` to registrations."""

    def __init__(self, answer: int = 0) -> None:
        self.answer, self.calls = answer, []

    def cudaHostRegister(self, address: int, size: int, flags: int) -> int:
        self.calls.append(("register", address, size, flags))
        return self.answer

    def cudaHostUnregister(self, address: int) -> int:
        self.calls.append(("unregister", address))
        return 0


def test_cuda_copies_pin_a_shared_memory_mapping_once_and_unpin_it_before_it_is_unmapped(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A CUDA copy into or out of a shared-memory segment page-locks the segment's whole mapping
    (pageable memory copies at a quarter of the speed), once per mapping, and the mapping is
    unpinned just before it goes; where CUDA refuses, nothing more is asked of it."""
    import ctypes

    from skyward.bootstrap import shm

    cudart = _FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(serialize, "_pin_refused", False)
    spill = Path(tempfile.mkdtemp(dir="/dev/shm")) if Path("/dev/shm").is_dir() else tmp_path
    try:
        view, _ = shm.reserve(spill, 2 << 20)
        mm = view.obj
        anchor = ctypes.c_char.from_buffer(mm)
        address = ctypes.addressof(anchor)
        del anchor
        serialize._pin(pickle.PickleBuffer(view[10:]))  # as a received buffer comes
        serialize._pin(view)
        assert cudart.calls == [("register", address, len(mm), 1)]
        assert id(mm) in serialize._pinned
        del view
        shm.forget(spill)  # the pool closed: its segments are unmapped
        assert cudart.calls[-1] == ("unregister", address) and id(mm) not in serialize._pinned
        assert mm.closed

        # A mapping dropped while a view of it is in use stays mapped until the view goes: a
        # copy through that view after the unpin hook ran must not pin it (it would stay
        # registered with CUDA once unmapped).
        view, _ = shm.reserve(spill, 2 << 20)
        serialize._pin(view)
        mm = view.obj
        shm._unmap(mm)  # as the receivers' cache drops a mapping; the view keeps it mapped
        assert not mm.closed and id(mm) not in serialize._pinned
        calls = len(cudart.calls)
        serialize._pin(view[4096:])
        assert len(cudart.calls) == calls and id(mm) not in serialize._pinned
        del view

        refusing = _FakeCudart(answer=1)
        monkeypatch.setattr(torch.cuda, "cudart", lambda: refusing)
        view, _ = shm.reserve(spill, 2 << 20)
        serialize._pin(view)
        serialize._pin(memoryview(bytearray(10)))  # not shared memory: nothing to pin
        other, _ = shm.reserve(spill, 2 << 20)
        serialize._pin(other)
        assert [c[0] for c in refusing.calls] == ["register"] and serialize._pin_refused
        del view, other
    finally:
        shm.forget(spill)
        if spill != tmp_path:
            spill.rmdir()


def test_no_torch_where_none_is_used() -> None:
    """A process that never imported torch pickles and unpickles without importing it."""
    code = textwrap.dedent("""
        import sys
        import numpy as np
        from skyward.bootstrap import serialize
        out = serialize.loads(*serialize.dumps({"a": np.arange(1 << 20), "b": b"x" * (2 << 20), "c": [1, 2]}))
        assert out["c"] == [1, 2] and len(out["b"]) == 2 << 20
        print("torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


# -- where CUDA tensors land -------------------------------------------------------------------


def as_if_cuda() -> Any:
    """Pickle as a GPU node does: the reducer records the storages' device as cuda:0."""
    return mock.patch.object(serialize, "_device_of", lambda storage: "cuda:0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: the tensor would land on it")
def test_a_cuda_result_lands_on_the_cpu_said_once(caplog: pytest.LogCaptureFixture) -> None:
    base = torch.randn(300, 300)
    with as_if_cuda():
        payload = serialize.dumps({"w": base, "v": base[5:, ::2], "step": 3})
        again = serialize.dumps([base])
    with caplog.at_level(logging.WARNING, logger="skyward.tensors"):
        back = serialize.loads(*payload)
        serialize.loads(*again)
    same(back["v"], base[5:, ::2])
    assert back["w"].device.type == "cpu" and storage_of(back["w"]) == storage_of(back["v"])
    said = [r.getMessage() for r in caplog.records if r.name == "skyward.tensors"]
    assert len(said) == 1 and "cuda:0" in said[0] and "CPU" in said[0] and "tensor_device='cpu'" in said[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: the tensor would land on it")
def test_torch_own_pickle_of_a_cuda_storage_lands_on_the_cpu() -> None:
    """What torch's own reduction makes of a CUDA tensor (a torch.save naming cuda:0) loads here,
    where plain pickle raises 'Attempting to deserialize object on a CUDA device'."""
    t = torch.arange(12.0).reshape(3, 4)
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: "cuda:0"):
        own = pickle.dumps(t, protocol=5)
        quantized = serialize.dumps(torch.quantize_per_tensor(t, 0.5, 0, torch.qint8))
    with pytest.raises(RuntimeError, match="CUDA"):
        pickle.loads(own)
    same(serialize.loads(0, own, []), t)
    q = serialize.loads(*quantized)
    assert q.is_quantized and torch.equal(q.dequantize(), t)


def test_tensor_device_cpu_puts_them_on_the_cpu_without_a_word(caplog: pytest.LogCaptureFixture) -> None:
    events: list[ev.Event] = []
    serialize.pool_opened("cpu-pool", True, events.append)
    try:
        with mock.patch.object(torch.cuda, "is_available", lambda: True), caplog.at_level(logging.WARNING):
            assert serialize.landing("cuda:0") == "cpu"
    finally:
        serialize.pool_closed("cpu-pool")
    assert events == [] and not [r for r in caplog.records if r.name == "skyward.tensors"]
    with pytest.raises(sky.ConfigError, match="tensor_device"):
        sky.Options(tensor_device="gpu")  # type: ignore[arg-type]
    assert sky.Options(tensor_device="cpu").tensor_device == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: the tensor would land on it")
def test_each_open_pool_hears_it_once_as_an_event() -> None:
    heard: dict[str, list[ev.Event]] = {"a": [], "b": []}
    for pool, got in heard.items():
        serialize.pool_opened(pool, False, got.append)
    try:
        with as_if_cuda():
            payload = serialize.dumps(torch.ones(10))
        for _ in range(3):
            serialize.loads(*payload)
    finally:
        for pool in heard:
            serialize.pool_closed(pool)
    for pool, got in heard.items():
        assert [(type(e), e.pool, e.level) for e in got] == [(ev.Log, pool, "WARNING")]  # type: ignore[attr-defined]


# -- jax -----------------------------------------------------------------------------------


def test_a_jax_array_arrives_as_a_jax_array_on_the_default_device() -> None:
    jax = pytest.importorskip("jax", reason="jax is not installed here")
    x = jax.numpy.arange(12.0).reshape(3, 4)
    # jax pickles an array as its numpy value, naming no device: one made on a GPU node is
    # rebuilt on the receiver's default device (the CPU on a client without a GPU, the GPU on
    # one with jax's CUDA plugin: seen on an H100 machine).
    flags, body, buffers = serialize.dumps({"x": x})
    assert b"cpu" not in bytes(body).lower() and b"cuda" not in bytes(body).lower()
    back = serialize.loads(flags, body, buffers)["x"]
    assert type(back).__module__.startswith("jax") and back.devices() == x.devices()
    assert next(iter(back.devices())) == jax.devices()[0] and bool((back == x).all())


# -- through Local pools -------------------------------------------------------------------


@sky.function
def echo(x: Any) -> Any:
    return x


@sky.function
def mapped_from(t: Any, folder: str) -> tuple[bool, bool]:
    """Whether the node's tensor lies in a shared-memory segment of ``folder``, and is writable."""
    return _in_segment(t, folder), _writable(t)


def _in_segment(t: Any, folder: str) -> bool:
    ptr = t.untyped_storage().data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= ptr < hi:
            return len(fields) >= 6 and fields[5].startswith(folder)
    return False


def _writable(t: Any) -> bool:
    t.view(-1)[0] = 7
    return bool(t.view(-1)[0].item() == 7)


@sky.function
def cuda_like(n: int) -> Any:
    """A node whose tensors were on cuda:0 (its pickler says so)."""
    from skyward.bootstrap import serialize

    serialize._device_of = lambda storage: "cuda:0"
    base = torch.arange(n, dtype=torch.float32)
    return {"w": base, "v": base[1:], "loss": 0.2}


def test_a_one_node_pool_echoes_every_edge_case_through_shared_memory() -> None:
    sent = edge_cases()
    with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
        spill = pool.cluster.spill_dir
        assert spill is not None
        back = echo(sent) >> pool
        check_edge_cases(back, sent)
        # The big storage came back on the worker's segment, not copied out of it (the small
        # ones came in the frame, below serialize.SPILL_MIN).
        assert _in_segment(back["big"], str(spill)) and not _in_segment(back["base"], str(spill))
        assert (mapped_from(sent["big"], str(spill)) >> pool) == (True, True)
        assert sent["big"][0].item() != 7  # the node wrote into its own copy, not ours
        del back
        for _ in range(3):  # the segments are given back and reused
            again = echo(sent["big"]) >> pool
            same(again, sent["big"])
            del again
        segments = [n for n in os.listdir(spill) if n != ".owner.lock"]  # (not its owners' lock)
        assert len(segments) == 2, segments
        kept = echo(sent["big"]) >> pool
    same(kept, sent["big"])  # still readable after the pool (and its folder) went
    del kept


def test_a_two_node_pool_broadcasts_and_returns_tensors() -> None:
    sent = edge_cases()
    with sky.Compute(nodes=2, options=sky.Options(console=False)) as pool:
        results = echo(sent) @ pool
        assert len(results) == 2
        for back in results:
            check_edge_cases(back, sent)
        parts = list(pool.map(echo, [sent["base"][i] for i in range(4)]))
        for i, part in enumerate(parts):
            same(part, sent["base"][i])


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: the tensor would land on it")
def test_a_gpu_nodes_result_reaches_a_cpu_client() -> None:
    events: list[ev.Event] = []
    with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
        stop = sky.subscribe(events.append)
        try:
            first = cuda_like(300_000) >> pool
            second = cuda_like(10) >> pool
            ev.bus.flush()
        finally:
            stop()
    assert first["loss"] == 0.2 and first["w"].device.type == "cpu"
    same(first["v"], torch.arange(300_000, dtype=torch.float32)[1:])
    assert storage_of(first["w"]) == storage_of(first["v"])
    same(second["w"], torch.arange(10, dtype=torch.float32))
    warnings = [e for e in events if isinstance(e, ev.Log) and e.level == "WARNING" and "cuda:0" in e.message]
    assert len(warnings) == 1 and warnings[0].pool == pool.id


@sky.function
def device_and_sum(t: Any) -> tuple[str, float, bool]:
    """Where the node's tensor is, its sum, and whether the node said it landed on its CPU."""
    from skyward.bootstrap import serialize

    return str(t.device), float(t.sum()), "" in serialize._told


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: the tensor would land on it")
def test_a_cuda_argument_lands_on_a_cpu_nodes_cpu() -> None:
    t = torch.ones(500_000)
    with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
        assert (device_and_sum(torch.ones(1)) >> pool)[2] is False
        with as_if_cuda():
            assert (device_and_sum(t) >> pool) == ("cpu", 500_000.0, True)


@sky.function
def cuda_like_stream(n: int) -> Any:
    """Streams tensors pickled as on cuda:0, and leaves one in a collection."""
    from skyward.bootstrap import serialize

    serialize._device_of = lambda storage: "cuda:0"
    sky.dict("weights")["w"] = torch.full((1000,), 2.0)
    for i in range(n):
        yield torch.full((300_000,), float(i))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: the tensor would land on it")
def test_streamed_items_and_collection_values_land_on_the_cpu_too() -> None:
    with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
        items = list(cuda_like_stream(3) >> pool)
        assert "" in serialize._told  # they came as CUDA tensors and landed here on the CPU
        serialize._told.clear()
        stored = pool.dict("weights")["w"]
        assert "" in serialize._told
    assert [t.device.type for t in items] == ["cpu"] * 3
    for i, t in enumerate(items):
        same(t, torch.full((300_000,), float(i)))
    same(stored, torch.full((1000,), 2.0))


# -- on a GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@cuda
def test_cuda_tensors_round_trip_on_cuda() -> None:
    t = torch.randn(1 << 20, device="cuda")
    back = rt({"t": t, "v": t[5:]})
    assert back["t"].is_cuda and torch.equal(back["t"], t) and storage_of(back["t"]) == storage_of(back["v"])


@pytest.mark.gpu
@cuda
def test_cuda_results_and_arguments_through_a_pool() -> None:
    t = torch.randn(1 << 20, device="cuda")
    with sky.Compute(nodes=1, options=sky.Options(console=False)) as pool:
        back = echo(t) >> pool
        assert back.is_cuda and torch.equal(back, t)
        assert serialize._pinned and not serialize._pin_refused  # the segment's mapping, page-locked here
        for _ in range(3):  # again through the same, pinned, segments
            assert torch.equal(echo(t) >> pool, t)
    assert not serialize._pinned  # unpinned as the pool's segments were unmapped
    with sky.Compute(nodes=1, options=sky.Options(console=False, tensor_device="cpu")) as pool:
        back = echo(t) >> pool
        assert back.device.type == "cpu" and torch.equal(back, t.cpu())


# -- the hint when a result cannot be unpickled --------------------------------------------


def _needs_cuda() -> Any:
    raise RuntimeError("Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False.")


class _OnGpu:
    def __reduce__(self) -> Any:
        return _needs_cuda, ()


def test_a_device_error_is_named_as_such_not_as_a_version_mismatch() -> None:
    """A GPU object torch does not cover (a cupy array...) fails to unpickle here: the message says
    it is about the device, not about package versions (it said versions for every failure)."""
    from skyward.bootstrap.frames import Frame, Kind
    from skyward.core.dispatch import decode_result

    flags, body, buffers = serialize.dumps(("ok", _OnGpu()))
    with pytest.raises(sky.SerializationError) as caught:
        decode_result(Frame(Kind.RESULT, 1, body, flags, buffers), "make", 0)
    text = str(caught.value)
    assert "a device this machine does not have" in text and "same versions" not in text
    assert "CUDA" in text  # the error itself is quoted
