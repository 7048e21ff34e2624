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

import pytest

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


SERVING = textwrap.dedent("""
    import os, signal, time
    import httpx
    import skyward as sky

    seen = []

    def until(check, what):
        end = time.monotonic() + 120
        while not check():
            if time.monotonic() > end:
                raise SystemExit("timed out waiting for " + what)
            time.sleep(0.1)

    def main():
        sky.subscribe(lambda e: seen.append(e) if isinstance(e, sky.ReplicaReady) else None)
        with sky.Compute(nodes=2, options=sky.Options(console=CONSOLE)) as pool:
            with pool.serve("serve.apps:app") as endpoint:
                endpoint.wait_ready(timeout=120)
                print("url", endpoint.url, flush=True)
                until(lambda: "serving at" in open(os.environ["ERR"]).read(), "the serving line")
                by_index = {n["index"]: n["pid"] for n in pool.cluster.describe()["nodes"]}
                rank1 = next(m for m in pool.members.records() if m.rank == 1)
                os.kill(by_index[rank1.endpoint.index], signal.SIGKILL)
                until(lambda: len(seen) >= 3, "the replica back")
                endpoint.wait_ready(timeout=120)
                endpoint.update("serve.apps:make_app_v2", factory=True)
                assert httpx.get(endpoint.url + "/whoami", headers=endpoint.headers, timeout=30).status_code == 200


    if __name__ == "__main__":  # a node imports this file to unpickle; it must not serve again
        main()
""")


def _serve(tmp_path: Path, console: str) -> tuple[str, str]:
    script = tmp_path / "prog.py"
    script.write_text(SERVING.replace("CONSOLE", repr(console)))
    tests = Path(__file__).parent
    err = tmp_path / "stderr"
    path = os.pathsep.join([str(tests), *filter(None, [os.environ.get("PYTHONPATH")])])
    with err.open("w") as stderr:
        out = subprocess.run([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=stderr, text=True,
                             timeout=280, env=dict(os.environ, PYTHONPATH=path, ERR=str(err)))
    text = err.read_text()
    assert out.returncode == 0, text
    return out.stdout, text


@pytest.mark.timeout(300)
def test_serving_lines_say_the_url_a_lost_replica_its_return_and_an_update(tmp_path: Path) -> None:
    stdout, text = _serve(tmp_path, "log")
    url = stdout.split()[1]
    assert f"serving at {url}, " in text and "replica(s)" in text, text
    lost = re.search(r"node \d+: replica 1\.0 lost \(.+\); the others take its requests", text)
    assert lost, text
    back = re.search(r"node \d+: replica 1\.0 back, ready in [\d.]+ s", text)
    assert back and back.start() > lost.start(), text
    assert re.search(rf"{re.escape(url)} updated, 2 replica\(s\) restarted", text), text
    assert f"stopped serving at {url}" in text, text
    # Only a replica that comes back gets a line of its own; the first ones are in "serving at".
    assert "replica 0.0 back" not in text and text.count(" back, ready in ") == 1, text


@pytest.mark.timeout(300)
def test_minimal_shows_the_url_and_a_lost_replica_only(tmp_path: Path) -> None:
    stdout, text = _serve(tmp_path, "minimal")
    assert "serving at " + stdout.split()[1] in text, text
    assert "replica 1.0 lost" in text, text
    assert " back, ready in " not in text and " updated, " not in text, text
