"""How the ``skyward`` command answers: exit codes, messages on stderr, JSON and tables on stdout.

Shared by cli.py (the named-pool commands) and recordcli.py (the record commands), which
import it and not each other's output helpers. Whatever goes out through ``err``, ``print_json``
and ``say`` has the secrets this process knows masked (``secrets.scrub``/``redact``): a pool's
secret env values, registered when the command attaches to it, and URL credentials always.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..observe.secrets import redact, scrub

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def err(message: str) -> None:
    """``skyward: message`` on stderr: errors, warnings and progress."""
    print(f"skyward: {redact(message)}", file=sys.stderr, flush=True)


def say(text: str) -> None:
    """A line (or lines) of text output on stdout that may hold what a node printed."""
    print(redact(text))


def print_json(data: Any) -> None:
    """``--json`` output: indented, keys sorted, anything else as its str; secrets masked."""
    print(json.dumps(scrub(json.loads(json.dumps(data, default=str))), indent=2, sort_keys=True))


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart, no trailing blanks."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()
             for r in [headers, *rows]]
    return "\n".join(lines)


def money(value: float | None) -> str:
    """``$1,234.50``; ``-`` when the price is not known."""
    return "-" if value is None else f"${value:,.2f}"
