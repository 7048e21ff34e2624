"""serialize.dumps pickles a large body a second time (with the hook that takes large bytes
out of band) only when its frames show a large bytes or bytearray: never for a long list of
small items, whose second pickling cost a Python call per object."""

from __future__ import annotations

import io
from typing import Any

import cloudpickle
import pytest

from skyward.bootstrap import serialize
from skyward.bootstrap.serialize import FLAG_BODY_OOB, SPILL_MIN, _large_bytes_in

BIG = b"x" * (2 * SPILL_MIN)


class Box:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is Box and other.value == self.value


def _body(obj: Any) -> bytes:
    with io.BytesIO() as f:
        cloudpickle.Pickler(f, protocol=5, buffer_callback=lambda _: None).dump(obj)
        return f.getvalue()


@pytest.mark.parametrize(("obj", "large"), [
    (list(range(400_000)), False),
    ("y" * 3_000_000, False),
    ([f"q{i}" for i in range(300_000)], False),
    ([b"z" * 100_000 for _ in range(30)], False),  # many payloads of 64 KiB+, none of SPILL_MIN
    ([[[[b"a" * (SPILL_MIN - 1)]]], *range(200_000)], False),
    ([Box(i) for i in range(50_000)] + [Box("s" * 70_000), 2**70, 1.5, None, {1: "a"}, {3}], False),
    ([0] * 100 + [[BIG]], True),
    ([[[bytearray(BIG)]], *range(300_000)], True),
    ([[[[b"a" * SPILL_MIN]]]], True),
    ([Box(i) for i in range(50_000)] + [Box([BIG])], True),
])
def test_large_bytes_are_found_from_the_frames(obj: Any, large: bool) -> None:
    assert _large_bytes_in(_body(obj)) is large
    flags, body, buffers = serialize.dumps(obj)
    assert bool(flags & FLAG_BODY_OOB) is large  # a large bytes travels beside the pickle
    assert serialize.loads(flags, body, buffers) == obj


def test_an_opcode_it_does_not_know_means_pickle_again() -> None:
    import pickle

    assert _large_bytes_in(pickle.dumps([1, 2], protocol=0))
