from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import pytest

from skyward.errors import ConfigError
from skyward.runtime.shard import shard


def all_shards(data: Any, total: int, **kwargs: Any) -> list[Any]:
    return [shard(data, node=k, total_nodes=total, **kwargs) for k in range(total)]


def flatten(shards: Iterable[Any]) -> list[Any]:
    return [item for s in shards for item in list(s)]


class Items(Sequence[int]):
    """A user Sequence whose constructor takes an iterable of items."""

    def __init__(self, items: Iterable[int]) -> None:
        self._items = list(items)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Items: ...
    def __getitem__(self, i: int | slice) -> int | Items:
        if isinstance(i, slice):
            return Items(self._items[i])
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)


class Window(Sequence[int]):
    """A user Sequence whose constructor does not take items: shard falls back to a list."""

    def __init__(self, start: int, stop: int) -> None:
        self._start, self._stop = start, stop

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            raise TypeError("no slicing")
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._start + i

    def __len__(self) -> int:
        return self._stop - self._start


# --- disjoint and covering ---------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 3, 10, 11, 97])
@pytest.mark.parametrize("total", [1, 2, 3, 4, 7])
def test_list_shards_are_contiguous_disjoint_and_cover(n: int, total: int) -> None:
    data = list(range(n))
    shards = all_shards(data, total)
    assert flatten(shards) == data  # contiguous blocks in order: disjoint and covering
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    for k, s in enumerate(shards):
        assert s == data[k * n // total : (k + 1) * n // total]


@pytest.mark.parametrize("total", [1, 3, 4])
def test_tuple_shards_cover(total: int) -> None:
    data = tuple("abcdefghij")
    shards = all_shards(data, total)
    assert all(type(s) is tuple for s in shards)
    assert tuple(flatten(shards)) == data


@pytest.mark.parametrize("total", [1, 2, 3, 5])
def test_numpy_shards_cover(total: int) -> None:
    data = np.arange(23 * 2).reshape(23, 2)
    shards = all_shards(data, total)
    assert all(isinstance(s, np.ndarray) and s.shape[1:] == (2,) for s in shards)
    assert np.array_equal(np.concatenate(shards), data)


def test_more_nodes_than_items_gives_empty_shards() -> None:
    shards = all_shards([1, 2], 4)
    assert flatten(shards) == [1, 2]
    assert sum(1 for s in shards if not s) == 2


# --- shuffle -------------------------------------------------------------------------


@pytest.mark.parametrize("total", [1, 2, 3, 4])
def test_shuffled_shards_are_disjoint_and_cover(total: int) -> None:
    data = list(range(50))
    shards = all_shards(data, total, shuffle=True, seed=7)
    seen = flatten(shards)
    assert len(seen) == len(set(seen)) == 50
    assert sorted(seen) == data


def test_shuffle_is_deterministic_per_seed_and_differs_between_seeds() -> None:
    data = list(range(100))
    first = all_shards(data, 4, shuffle=True, seed=1)
    again = all_shards(data, 4, shuffle=True, seed=1)
    other = all_shards(data, 4, shuffle=True, seed=2)
    assert first == again
    assert flatten(first) != flatten(other)
    assert flatten(first) != data  # it really shuffled


def test_shuffled_numpy_matches_shuffled_list() -> None:
    # The permutation depends only on n and seed, so mixed container types line up.
    data = list(range(40))
    for k in range(3):
        as_list = shard(data, shuffle=True, seed=3, node=k, total_nodes=3)
        as_array = shard(np.array(data), shuffle=True, seed=3, node=k, total_nodes=3)
        assert as_array.tolist() == as_list


def test_shuffled_numpy_covers() -> None:
    data = np.arange(31)
    shards = all_shards(data, 4, shuffle=True, seed=0)
    assert sorted(np.concatenate(shards).tolist()) == list(range(31))


# --- drop_last -----------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_drop_last_gives_equal_sizes(shuffle: bool) -> None:
    data = list(range(11))
    shards = all_shards(data, 3, drop_last=True, shuffle=shuffle, seed=5)
    assert [len(s) for s in shards] == [3, 3, 3]
    seen = flatten(shards)
    assert len(set(seen)) == 9 and set(seen) <= set(data)


def test_drop_last_without_shuffle_drops_the_tail() -> None:
    shards = all_shards(list(range(11)), 3, drop_last=True)
    assert shards == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_drop_last_with_fewer_items_than_nodes() -> None:
    assert all_shards([1, 2], 3, drop_last=True) == [[], [], []]


# --- several aligned arrays ----------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_multiple_arrays_stay_aligned(shuffle: bool) -> None:
    x = np.arange(30)
    y = [f"label-{i}" for i in range(30)]
    z = tuple(i * 10 for i in range(30))
    pairs = []
    for k in range(4):
        xs, ys, zs = shard(x, y, z, shuffle=shuffle, seed=9, node=k, total_nodes=4)
        assert isinstance(xs, np.ndarray) and type(ys) is list and type(zs) is tuple
        assert len(xs) == len(ys) == len(zs)
        for xi, yi, zi in zip(xs.tolist(), ys, zs, strict=True):
            assert yi == f"label-{xi}" and zi == xi * 10
            pairs.append(xi)
    assert sorted(pairs) == list(range(30))


def test_single_array_returns_the_shard_not_a_tuple() -> None:
    assert shard([1, 2, 3, 4], node=0, total_nodes=2) == [1, 2]
    result = shard([1, 2, 3, 4], [5, 6, 7, 8], node=1, total_nodes=2)
    assert result == ([3, 4], [7, 8])


# --- type preservation ---------------------------------------------------------------


def test_list_and_tuple_types() -> None:
    assert type(shard([1, 2, 3], node=0, total_nodes=2)) is list
    assert type(shard([1, 2, 3], shuffle=True, node=0, total_nodes=2)) is list
    assert type(shard((1, 2, 3), node=0, total_nodes=2)) is tuple
    assert type(shard((1, 2, 3), shuffle=True, node=0, total_nodes=2)) is tuple


def test_ndarray_keeps_dtype_and_trailing_shape() -> None:
    data = np.zeros((10, 3, 2), dtype=np.float32)
    for shuffle in (False, True):
        s = shard(data, shuffle=shuffle, node=1, total_nodes=3)
        assert isinstance(s, np.ndarray)
        assert s.dtype == np.float32 and s.shape == (3, 3, 2)


def test_contiguous_ndarray_shard_is_a_view_and_shuffled_is_a_copy() -> None:
    data = np.arange(10)
    assert np.shares_memory(shard(data, node=0, total_nodes=2), data)
    assert not np.shares_memory(shard(data, shuffle=True, node=0, total_nodes=2), data)


def test_custom_sequence_type_is_preserved() -> None:
    data = Items(range(10))
    for shuffle in (False, True):
        shards = [shard(data, shuffle=shuffle, node=k, total_nodes=3) for k in range(3)]
        assert all(type(s) is Items for s in shards)
        assert sorted(flatten(shards)) == list(range(10))


def test_sequence_without_an_items_constructor_falls_back_to_list() -> None:
    s = shard(Window(100, 110), node=1, total_nodes=2)
    assert s == [105, 106, 107, 108, 109]


def test_list_subclass_is_preserved() -> None:
    class Batch(list[int]):
        pass

    s = shard(Batch([1, 2, 3, 4]), node=1, total_nodes=2)
    assert type(s) is Batch and s == [3, 4]


def test_namedtuple_gives_a_plain_tuple() -> None:
    Point = namedtuple("Point", "x y z")
    assert shard(Point(1, 2, 3), node=0, total_nodes=1) == (1, 2, 3)
    assert type(shard(Point(1, 2, 3), node=0, total_nodes=1)) is tuple


def test_range() -> None:
    assert shard(range(10), node=1, total_nodes=2) == range(5, 10)
    shuffled = shard(range(10), shuffle=True, node=1, total_nodes=2)
    assert type(shuffled) is list and len(shuffled) == 5


def test_bytes() -> None:
    assert shard(b"abcd", node=1, total_nodes=2) == b"cd"


def test_duck_typed_indexable_is_sharded_into_a_list() -> None:
    class Dataset:
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> dict[str, int]:
            return {"row": i}

    assert shard(Dataset(), node=1, total_nodes=3) == [{"row": 2}, {"row": 3}]


def test_torch_tensor() -> None:
    torch = pytest.importorskip("torch")
    data = torch.arange(20).reshape(10, 2)
    for shuffle in (False, True):
        shards = [shard(data, shuffle=shuffle, node=k, total_nodes=3) for k in range(3)]
        assert all(isinstance(s, torch.Tensor) and s.shape[1] == 2 for s in shards)
        rows = torch.cat(shards)
        assert sorted(rows[:, 0].tolist()) == list(range(0, 20, 2))
    listed = shard(list(range(10)), shuffle=True, seed=4, node=0, total_nodes=3)
    tensor = shard(torch.arange(10), shuffle=True, seed=4, node=0, total_nodes=3)
    assert tensor.tolist() == listed


# --- errors --------------------------------------------------------------------------


def gen() -> Iterator[int]:
    yield from range(3)


@pytest.mark.parametrize(
    ("data", "hint"),
    [({1, 2, 3}, "sorted("), (gen(), "list(...)"), ({"a": 1}, "items()"), (iter([1]), "list")],
)
def test_non_indexable_input_is_refused(data: Any, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        shard(data, node=0, total_nodes=1)
    message = str(info.value)
    assert "indexable sequence" in message and hint in message


def test_str_is_refused() -> None:
    with pytest.raises(ConfigError, match="str"):
        shard("some/path.txt", node=0, total_nodes=1)


def test_scalar_array_is_refused() -> None:
    with pytest.raises(ConfigError, match="first dimension"):
        shard(np.array(3.0), node=0, total_nodes=1)


def test_mismatched_lengths_name_them() -> None:
    with pytest.raises(ConfigError) as info:
        shard([1, 2, 3], np.arange(4), node=0, total_nodes=2)
    message = str(info.value)
    assert "list[3]" in message and "ndarray[4]" in message


def test_no_data() -> None:
    with pytest.raises(ConfigError, match="no data"):
        shard(node=0, total_nodes=1)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("node", "total", "match"),
    [
        (2, 2, "out of range"),
        (-1, 2, "out of range"),
        (0, 0, "at least 1"),
        (0, -3, "at least 1"),
        (1.0, 2, "not an int"),
        (0, 2.0, "not an int"),
        (True, 2, "not an int"),
    ],
)
def test_bad_positions(node: Any, total: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        shard([1, 2, 3], node=node, total_nodes=total)


@pytest.mark.parametrize("kwargs", [{"node": 0}, {"total_nodes": 2}])
def test_node_and_total_nodes_go_together(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="pass both"):
        shard([1, 2, 3], **kwargs)  # type: ignore[call-overload]


def test_seed_must_be_an_int() -> None:
    with pytest.raises(ConfigError, match="seed"):
        shard([1, 2], shuffle=True, seed="abc", node=0, total_nodes=1)  # type: ignore[call-overload]


def test_pandas_uses_positions_not_labels() -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": range(10)}, index=range(100, 110))
    for shuffle in (False, True):
        parts = [shard(frame, frame["a"], shuffle=shuffle, node=k, total_nodes=3) for k in range(3)]
        for rows, column in parts:
            assert type(rows) is pd.DataFrame and type(column) is pd.Series
            assert list(rows["a"]) == list(column)
        assert sorted(x for rows, _ in parts for x in rows["a"]) == list(range(10))
