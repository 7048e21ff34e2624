"""How the ``skyward`` command answers: exit codes, messages on stderr, JSON and tables on stdout.

Shared by cli.py (the named-pool commands) and recordcli.py (the record commands), which
import it and not each other's output helpers.
"""

from __future__ import annotations

import json
import sys
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def err(message: str) -> None:
    """``skyward: message`` on stderr: errors, warnings and progress."""
    print(f"skyward: {message}", file=sys.stderr, flush=True)


def print_json(data: Any) -> None:
    """``--json`` output: indented, keys sorted, anything else as its str."""
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart, no trailing blanks."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()
             for r in [headers, *rows]]
    return "\n".join(lines)


def money(value: float | None) -> str:
    """``$1,234.50``; ``-`` when the price is not known."""
    return "-" if value is None else f"${value:,.2f}"
