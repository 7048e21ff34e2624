from __future__ import annotations

import pytest

import skyward.time as sky_time
from skyward.errors import ConfigError


@pytest.mark.parametrize(
    ("fn", "n", "expected"),
    [
        (sky_time.seconds, 90, 90.0),
        (sky_time.minutes, 10, 600.0),
        (sky_time.minutes, 0.5, 30.0),
        (sky_time.hours, 2, 7200.0),
        (sky_time.days, 1, 86400.0),
        (sky_time.days, 0, 0.0),
    ],
)
def test_conversions(fn, n: float, expected: float) -> None:
    result = fn(n)
    assert result == expected
    assert type(result) is float


@pytest.mark.parametrize("fn", [sky_time.seconds, sky_time.minutes, sky_time.hours, sky_time.days])
def test_negative_is_refused(fn) -> None:
    with pytest.raises(ConfigError) as info:
        fn(-5)
    message = str(info.value)
    assert "-5" in message and "negative" in message and "(5)" in message


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "10", None, True])
def test_non_numbers_and_non_finite_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError):
        sky_time.minutes(bad)  # type: ignore[arg-type]


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        sky_time.hours(-1)
