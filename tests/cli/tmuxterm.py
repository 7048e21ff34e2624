"""A real terminal for CLI tests: a private tmux server (its own socket, no config) running bash,
driven with send-keys and read with capture-pane.

``Tmux(folder, env, cwd)`` starts it; ``type("cmd")`` types a line and presses Enter,
``keys("C-c")`` sends keys, ``wait_for(regex)`` polls the screen (scrollback included) until the
regex matches and returns the match. ``close()`` stops the server and waits for every process it
ran (the test process is a child subreaper here: see conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest


class Tmux:
    def __init__(self, folder: Path, env: dict[str, str], cwd: Path, *, width: int = 100,
                 height: int = 30) -> None:
        tmux = shutil.which("tmux")
        if tmux is None:
            pytest.skip("tmux is not installed (apt-get install -y tmux); the terminal tests need it")
        self._argv = [tmux, "-S", str(folder / "tmux.sock"), "-f", "/dev/null"]
        self._env = {**env, "TERM": "xterm-256color"}
        self._env.pop("TMUX", None)
        self._cmd("new-session", "-d", "-s", "main", "-x", str(width), "-y", str(height), "-c", str(cwd),
                  "env PS1='outer$ ' bash --norc --noprofile")
        self._cmd("set-option", "-g", "history-limit", "5000")
        self.server = int(self._cmd("display-message", "-p", "#{pid}").strip())
        self.wait_for(r"outer\$")

    def _cmd(self, *args: str) -> str:
        proc = subprocess.run([*self._argv, *args], env=self._env, capture_output=True, text=True, timeout=20)
        if proc.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def type(self, line: str) -> None:
        self._cmd("send-keys", "-t", "main", "-l", line)
        self._cmd("send-keys", "-t", "main", "Enter")

    def keys(self, *keys: str) -> None:
        self._cmd("send-keys", "-t", "main", *keys)

    def resize(self, width: int, height: int) -> None:
        self._cmd("resize-window", "-t", "main", "-x", str(width), "-y", str(height))

    def screen(self) -> str:
        """What the terminal shows, scrollback included, without the blank end (so a pattern's
        ``$`` is where the cursor's line ends)."""
        return self._cmd("capture-pane", "-p", "-J", "-S", "-", "-t", "main").rstrip()

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            m = re.search(pattern, text)
            if m is not None:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not on the terminal after {timeout:g} s; it shows:\n{text}")
            time.sleep(0.1)

    def close(self) -> None:
        family = _descendants(self.server)
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._cmd("kill-server")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_running(p) for p in family):
            time.sleep(0.05)
        for pid in family:
            if _running(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        for pid in family:  # ours once orphaned (subreaper): reap them
            for _ in range(100):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    break
                if done:
                    break
                time.sleep(0.02)


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                parents[int(entry)] = int(fields[1])
    family = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in family and pid not in family:
                family.add(pid)
                grew = True
    return sorted(family)
