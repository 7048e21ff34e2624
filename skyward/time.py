"""Readable durations: ``sky.time.minutes(10)`` instead of ``600``.

Every helper returns seconds as a float, the unit skyward's timeouts and TTLs take.
A negative, NaN or infinite duration is refused (skyward spells "no limit" as None),
and so is anything that is not a real number, bools included.
"""

from __future__ import annotations

import math

from skyward.errors import ConfigError

__all__ = ["days", "hours", "minutes", "seconds"]


def _to_seconds(n: float, unit: str, factor: float) -> float:
    # bool is an int subclass; hours(True) is almost certainly a mistake, not "1 hour".
    if isinstance(n, bool) or not isinstance(n, int | float):
        raise ConfigError(
            f"duration {n!r} is a {type(n).__name__}, not a number: {unit}() takes a number "
            f"of {unit}. Use e.g. {unit}(10)."
        )
    if math.isnan(n) or math.isinf(n):
        raise ConfigError(
            f"duration {n!r} {unit} is not finite: durations must be finite numbers. "
            f"Use None instead of a duration where you mean no limit."
        )
    if n < 0:
        raise ConfigError(
            f"duration {n!r} {unit} is negative: durations must be 0 or more. "
            f"Use e.g. {unit}({-n!r})."
        )
    return float(n) * factor


def seconds(n: float) -> float:
    """``n`` seconds, as float seconds."""
    return _to_seconds(n, "seconds", 1.0)


def minutes(n: float) -> float:
    """``n`` minutes, as float seconds."""
    return _to_seconds(n, "minutes", 60.0)


def hours(n: float) -> float:
    """``n`` hours, as float seconds."""
    return _to_seconds(n, "hours", 3600.0)


def days(n: float) -> float:
    """``n`` days, as float seconds."""
    return _to_seconds(n, "days", 86400.0)
