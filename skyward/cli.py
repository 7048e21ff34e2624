"""The ``skyward`` command. Pool management (up/down/ls/...) arrives with the CLI issue."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from skyward import __version__

    parser = argparse.ArgumentParser(
        prog="skyward",
        description="Run Python functions on pools of machines. See the README for the library API.",
    )
    parser.add_argument("--version", action="version", version=f"skyward {__version__}")
    parser.parse_args(sys.argv[1:] if argv is None else argv)
    parser.print_help()
    return 0
