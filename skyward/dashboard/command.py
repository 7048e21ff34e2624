"""``skyward dashboard [--host H] [--port P] [--open]``: the command's flags and handler."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def add_dashboard(command: Callable[[str], argparse.ArgumentParser]) -> None:
    p = command("dashboard")  # its help: _MODULE_COMMANDS of named/cli.py
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--open", action="store_true", help="open the dashboard in a browser")
    p.add_argument("--config", type=Path, help="skyward.toml whose pools to show (default: nearest one)")
    p.set_defaults(handler=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace) -> int:
    import json

    from skyward.errors import ConfigError

    from .server import serve

    if not 0 <= args.port <= 65535:  # bind() would raise OverflowError, a traceback
        raise ConfigError(f"--port {args.port}: a port goes from 0 to 65535 (0 picks a free one).")
    if args.config is not None and not args.config.is_file():
        raise ConfigError(f"--config {args.config}: no such file. Give the path of a skyward.toml.")

    def announce(url: str) -> None:
        if args.json:
            print(json.dumps({"url": url}), flush=True)
        else:
            print(f"skyward dashboard: {url}", flush=True)
            print("(the token in this URL is the key to your pools: do not share it; Ctrl-C stops)",
                  file=sys.stderr, flush=True)

    try:
        serve(args.host, args.port, open_browser=args.open, project=args.config, announce=announce)
    except KeyboardInterrupt:
        pass
    return 0
