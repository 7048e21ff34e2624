"""sky.Compute(name=...) checks its arguments where it is called, before anything runs."""

from __future__ import annotations

import pytest

import skyward as sky


def test_name_with_spec_keywords_is_refused() -> None:
    with pytest.raises(sky.ConfigError, match=r"name='train'.*got nodes too.*\[pools\.train\]"):
        sky.Compute(name="train", nodes=2)


def test_name_with_worker_is_refused() -> None:
    with pytest.raises(sky.ConfigError, match=r"got worker too"):
        sky.Compute(name="train", worker=sky.Worker(concurrency=2))


def test_bad_pool_name_is_refused() -> None:
    with pytest.raises(sky.ConfigError, match=r"pool name 'Not OK' is not valid"):
        sky.Compute(name="Not OK")
