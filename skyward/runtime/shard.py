"""shard(): give each node its own disjoint slice of a data set.

Every node calls ``shard`` on the same data with the same arguments; because the
index assignment depends only on the length, ``shuffle``/``seed``/``drop_last`` and
the node's position, the slices are disjoint and together cover the data (all of it,
or all but the last ``n % total_nodes`` items with ``drop_last``).

Index assignment, for ``n`` items and ``N`` nodes:

* without ``shuffle``, node ``k`` gets the contiguous block ``[k*n//N, (k+1)*n//N)``,
  so block sizes differ by at most one;
* with ``shuffle``, ``random.Random(seed)`` shuffles ``range(n)`` first (the same
  permutation on every node) and node ``k`` takes the same block of that permutation;
* with ``drop_last``, every node gets exactly ``n//N`` items and the remainder is dropped.

The result has the type of the input where that can be done:

* list -> list, tuple -> tuple (a namedtuple gives a plain tuple), range -> range when
  not shuffled (a list when shuffled: a range cannot hold a permutation);
* numpy arrays -> arrays and torch tensors -> tensors, split along the first axis.
  A contiguous block is a slice, so it is a *view* that shares memory with the input;
  a shuffled shard is a copy. Tensors are indexed on their own device;
* pandas DataFrame/Series -> the same, through ``.iloc`` (positions, not labels);
* a torch map-style ``Dataset`` -> ``torch.utils.data.Subset`` of it;
* any other ``collections.abc.Sequence`` -> ``type(data)(items)``, or a list when that
  constructor does not take an iterable of items. Objects that are not registered as
  Sequence but have ``__len__`` and ``__getitem__`` (datasets from other libraries) are
  treated the same way.

A ``str`` is refused: sharding text character by character is almost always a slip
(a file path passed instead of its lines). Sets, dicts, generators and other
non-indexable inputs are refused too, with a hint to convert them first.

numpy, torch and pandas are never imported here unless the data already is one of
their objects, so calling shard on a list costs nothing extra.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence, Set
from typing import Any, TypeVar, overload

from skyward.errors import ConfigError

__all__ = ["shard"]

T = TypeVar("T")

# What a node takes: a contiguous block (range) or an explicit list of positions.
_Indices = range | list[int]


def _library(obj: object) -> str | None:
    """The top-level package (numpy/torch/pandas) that defines obj's type or a base of it."""
    # Walking the MRO also catches subclasses defined elsewhere (np.memmap, nn.Parameter,
    # a user's ndarray subclass) without importing any of those libraries.
    for cls in type(obj).__mro__:
        root = cls.__module__.partition(".")[0]
        if root in ("numpy", "torch", "pandas"):
            return root
    return None


def _length(obj: object, position: int) -> int:
    where = f"argument {position + 1} of shard()"
    if isinstance(obj, str):
        raise ConfigError(
            f"{where} is a str ({obj[:40]!r}): shard splits sequences of items and will not "
            f"split text into characters. Pass a list of items, e.g. text.splitlines() or "
            f"list(text) if characters really are the items."
        )
    library = _library(obj)
    if library is not None and hasattr(obj, "__len__") and hasattr(obj, "__getitem__"):
        try:
            return len(obj)
        except TypeError:
            # 0-d arrays and tensors define __len__ but have no first axis to split.
            raise ConfigError(
                f"{where} is a {type(obj).__name__} with no first dimension (a scalar): shard "
                f"splits data along its first axis. Pass an array with at least one dimension."
            ) from None
    if isinstance(obj, Sequence):
        return len(obj)
    if (
        not isinstance(obj, Mapping | Set)
        and hasattr(obj, "__len__")
        and hasattr(obj, "__getitem__")
    ):
        # Duck-typed indexables that do not register as Sequence (map-style datasets,
        # array types from other libraries) are indexed item by item.
        return len(obj)
    kind = type(obj).__name__
    if isinstance(obj, Set):
        hint = f"sorted({kind}) (not list(...): set order can differ between nodes)"
    elif isinstance(obj, Mapping):
        hint = "list(d.items()) or a list of its keys"
    else:
        hint = "list(...)"
    raise ConfigError(
        f"{where} is a {kind}, which cannot be indexed: shard needs an indexable sequence "
        f"(list, tuple, range, numpy array, torch tensor, pandas DataFrame/Series) so every "
        f"node can pick the same positions. Convert it first, e.g. {hint}."
    )


def _check_position(node: object, total_nodes: object) -> tuple[int, int]:
    if isinstance(total_nodes, bool) or not isinstance(total_nodes, int):
        raise ConfigError(
            f"total_nodes {total_nodes!r} is not an int: it is the number of nodes sharing "
            f"the data. Pass e.g. total_nodes=4."
        )
    if total_nodes < 1:
        raise ConfigError(
            f"total_nodes {total_nodes} must be at least 1: it is the number of nodes sharing "
            f"the data. Pass e.g. total_nodes=4."
        )
    if isinstance(node, bool) or not isinstance(node, int):
        raise ConfigError(
            f"node {node!r} is not an int: it is this node's index, 0 to total_nodes-1. "
            f"Pass e.g. node=0."
        )
    if not 0 <= node < total_nodes:
        raise ConfigError(
            f"node {node} is out of range for total_nodes={total_nodes}: node must be in "
            f"0..{total_nodes - 1}. Pass the node's index (sky.instance_info().node)."
        )
    return node, total_nodes


def _resolve_position(node: int | None, total_nodes: int | None) -> tuple[int, int]:
    if node is None and total_nodes is None:
        # Imported here: runtime.info pulls in pydantic, and shard with explicit
        # positions should work (and import) without a running task.
        # Outside a task this raises NoActivePoolError, whose message already says to
        # pass node= and total_nodes= to shard(); it is left to propagate as is.
        from skyward.runtime.info import current_instance_info

        info = current_instance_info()
        return _check_position(info.group_rank, info.group_size)  # its group's nodes (the pool's, one group)
    if node is None or total_nodes is None:
        given, missing = ("node", "total_nodes") if node is not None else ("total_nodes", "node")
        raise ConfigError(
            f"shard() got {given} but not {missing}: pass both, or neither to take them from "
            f"the running task."
        )
    return _check_position(node, total_nodes)


def _indices(
    n: int, node: int, total_nodes: int, *, shuffle: bool, seed: int, drop_last: bool
) -> _Indices:
    if drop_last:
        per_node = n // total_nodes
        start, stop = node * per_node, (node + 1) * per_node
    else:
        start, stop = node * n // total_nodes, (node + 1) * n // total_nodes
    if not shuffle:
        return range(start, stop)
    # Every node builds the whole permutation from the same seed, so the blocks taken
    # from it are disjoint without any communication between nodes.
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order[start:stop]


def _take(data: Any, idx: _Indices, library: str | None) -> Any:
    if library == "numpy":
        import numpy as np

        if isinstance(data, np.ndarray):
            if isinstance(idx, range):
                return data[idx.start : idx.stop]
            return data[np.asarray(idx, dtype=np.intp)]
    elif library == "torch":
        import torch

        if isinstance(data, torch.Tensor):
            if isinstance(idx, range):
                return data[idx.start : idx.stop]
            positions = torch.as_tensor(idx, dtype=torch.long, device=data.device)
            return data.index_select(0, positions)
        from torch.utils.data import Dataset, Subset

        if isinstance(data, Dataset):
            # A map-style Dataset's constructor cannot take items back; Subset is the
            # torch-native way to say "these positions of that dataset".
            return Subset(data, list(idx))
    elif library == "pandas" and hasattr(data, "iloc"):
        if isinstance(idx, range):
            return data.iloc[idx.start : idx.stop]
        return data.iloc[idx]

    if isinstance(data, range):
        if isinstance(idx, range):
            return data[idx.start : idx.stop]
        return [data[i] for i in idx]
    # Exact list/tuple: slicing is the fast path and already has the right type.
    if type(data) in (list, tuple) and isinstance(idx, range):
        return data[idx.start : idx.stop]
    items = [data[i] for i in idx]
    if type(data) is list:
        return items
    if isinstance(data, tuple):
        # A namedtuple's constructor takes fields, not an iterable; a plain tuple is
        # the honest result there.
        return tuple(items) if hasattr(type(data), "_fields") else type(data)(items)
    try:
        return type(data)(items)
    except Exception:
        # Any failure only means the constructor does not take an iterable of items
        # (or wants something else entirely); a list still holds the right shard.
        return items


@overload
def shard(
    data: T,
    /,
    *,
    shuffle: bool = ...,
    seed: int = ...,
    drop_last: bool = ...,
    node: int | None = ...,
    total_nodes: int | None = ...,
) -> T: ...


@overload
def shard(
    first: Any,
    second: Any,
    /,
    *more: Any,
    shuffle: bool = ...,
    seed: int = ...,
    drop_last: bool = ...,
    node: int | None = ...,
    total_nodes: int | None = ...,
) -> tuple[Any, ...]: ...


def shard(
    *data: Any,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    node: int | None = None,
    total_nodes: int | None = None,
) -> Any:
    """This node's slice of ``data`` (or of each of several aligned arrays).

    With one argument the shard itself is returned; with several, a tuple of shards cut
    at the same positions, so ``x[i]`` still pairs with ``y[i]``. ``node`` and
    ``total_nodes`` default to the running task's ``instance_info()``; pass both to
    shard outside a task. With ``shuffle``, every node must use the same ``seed``.
    """
    if not data:
        raise ConfigError(
            "shard() got no data: it needs at least one sequence to split. "
            "Call it as shard(items) or shard(x, y) for aligned arrays."
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(
            f"seed {seed!r} is not an int: every node must build the same shuffle from it. "
            f"Pass e.g. seed=0 (the same value on every node)."
        )
    lengths = [_length(item, position) for position, item in enumerate(data)]
    if len(set(lengths)) > 1:
        shown = ", ".join(f"{type(d).__name__}[{n}]" for d, n in zip(data, lengths, strict=True))
        raise ConfigError(
            f"shard() got arrays of different lengths ({shown}): aligned arrays must all have "
            f"the same length so item i of each stays together. Trim or fix them to one length."
        )
    node, total_nodes = _resolve_position(node, total_nodes)
    idx = _indices(lengths[0], node, total_nodes, shuffle=shuffle, seed=seed, drop_last=drop_last)
    shards = tuple(_take(item, idx, _library(item)) for item in data)
    return shards[0] if len(shards) == 1 else shards
