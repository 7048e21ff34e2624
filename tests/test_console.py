"""The console in a real terminal (a pseudo-terminal) and with stderr piped."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent("""
    import skyward as sky

    @sky.function
    def work(x):
        return x

    with sky.Compute(nodes=2) as pool:
        print("result", sum(pool.map(work, range(2000), chunksize=100)))
""")

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def run_in_terminal(script: Path) -> tuple[int, str]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="160", LINES="40")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the program exited and closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        rc = proc.wait(timeout=60)
    return rc, ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))


def test_rich_view_in_a_terminal(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    rc, text = run_in_terminal(script)
    assert rc == 0, text
    assert "result 1999000" in text
    # A line per node. A pool this small may be ready and gone between two redraws (8 a
    # second), so its last frame may show every node destroyed, never ready.
    assert re.search(r"│\s*0\s*│.*│\s*(ready|destroyed)\s*│", text), text
    assert re.search(r"│\s*1\s*│.*│\s*(ready|destroyed)\s*│", text), text
    assert "map work" in text and "100%" in text and "2000/2000" in text, text


def test_log_lines_when_stderr_is_piped(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "result 1999000"
    lines = out.stderr.splitlines()
    assert lines, "the log console printed nothing"
    assert all(re.match(r"^\d\d:\d\d:\d\d ", line) for line in lines), out.stderr
    text = out.stderr
    assert "ready, 2 node(s)" in text and "map work: 2000 item(s)" in text
    assert re.search(r"map work: done, 2000/2000", text) and "destroyed" in text
    assert "\x1b[" not in text


def test_silent_prints_nothing_but_task_output(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM.replace("sky.Compute(nodes=2)", "sky.Compute(nodes=2, options=sky.Options(console='silent'))")
                      .replace("return x", "print('hello', x) if x == 0 else None\n    return x"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert "[node 0] hello 0" in out.stdout or "[node 1] hello 0" in out.stdout


def test_minimal_prints_only_ready_errors_and_destroyed(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM.replace("sky.Compute(nodes=2)", "sky.Compute(nodes=2, options=sky.Options(console='minimal'))"))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr
    assert "ready" in lines[0] and "destroyed" in lines[1]
