"""`skyward logs NAME -f` on real Local pools: new lines of every node's agent
log as they are written, prefixed by node, without a task slot, until Ctrl-C (exit 0)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .conftest import CLI


class Follower:
    """`skyward logs NAME -f ...` running, its output read as it comes."""

    def __init__(self, cli: CLI, *args: str) -> None:
        self.proc = cli.start("logs", *args)
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._read, args=(s, into), daemon=True)
                         for s, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    def _read(self, stream, into: list[str]) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_for(self, found: Callable[[list[str]], bool], timeout: float = 20, stream: str = "out") -> None:
        lines = self.out if stream == "out" else self.err
        deadline = time.monotonic() + timeout
        while not found(list(lines)):
            assert self.proc.poll() is None, f"the follower ended: {self.proc.returncode} {self.err}"
            assert time.monotonic() < deadline, f"not seen in {timeout} s; stdout {self.out} stderr {self.err}"
            time.sleep(0.05)

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(15)
        for t in self._threads:
            t.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def test_follow_prints_new_lines_by_node_until_ctrl_c(cli: CLI) -> None:
    assert cli("up", "fl", "--provider", "local", "--nodes", "2").code == 0
    follower = Follower(cli, "fl", "-f", "--lines", "5")
    try:
        # First the last lines of each log, then what is written from now on.
        follower.wait_for(lambda out: {line.split(" ")[1] for line in out if "agent: serving on" in line} == {"0", "1"})
        ran = cli("exec", "fl", "--", "printf 'half a line' >> agent.log; sleep 0.5; echo ' and its end'"
                  " >> agent.log; echo \"marker of $(basename $PWD)\" >> agent.log")
        assert ran.code == 0, ran
        follower.wait_for(lambda out: sum("marker of node-" in line for line in out) == 2)
        for rank in (0, 1):
            (line,) = [o for o in follower.out if f"marker of node-{rank}" in o]
            assert line.startswith(f"[node {rank} ") and line.endswith(f"] marker of node-{rank}"), line
        whole = [o for o in follower.out if "half a line" in o]
        assert len(whole) == 2 and all(o.endswith("half a line and its end") for o in whole), whole
        assert follower.interrupt() == 0, follower.err
    finally:
        follower.kill()


def test_follow_needs_no_task_slot_and_survives_a_lost_node(cli: CLI) -> None:
    assert cli("up", "busy", "--provider", "local", "--nodes", "2").code == 0
    nodes = cli.record("busy")["cluster"]["nodes"]
    # A program keeps the only slot of every node busy.
    program = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        import skyward as sky
        with sky.Compute(name="busy", options=sky.Options(console="silent")) as pool:
            print("busy", flush=True)
            sky.function(time.sleep)(60) @ pool
    """)], cwd=cli.cwd, env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    follower = None
    try:
        assert program.stdout is not None and program.stdout.readline().strip() == "busy"
        time.sleep(0.5)  # the sleeps have reached the nodes
        follower = Follower(cli, "busy", "-f", "--json", "--lines", "0")
        time.sleep(1.5)
        for rank, node in enumerate(nodes):
            with open(node["log"], "a") as log:
                log.write(f"written while busy {rank}\n")
        follower.wait_for(lambda out: sum("written while busy" in line for line in out) == 2, timeout=10)
        seen = [json.loads(line) for line in follower.out]
        assert sorted((s["node"], s["line"]) for s in seen) == [(0, "written while busy 0"), (1, "written while busy 1")]

        program.terminate()  # the program lets go (a program would replace a lost node)
        program.communicate(timeout=30)
        os.kill(nodes[1]["pid"], signal.SIGKILL)  # node 1's agent dies: node 0 is followed on
        follower.wait_for(lambda err: any("node 1" in e and "stopped following" in e for e in err), stream="err")
        with open(nodes[0]["log"], "a") as log:
            log.write("still here\n")
        follower.wait_for(lambda out: any("still here" in line for line in out))
        assert follower.interrupt() == 0
        # The follower only looked: it started no node in place of node 1.
        assert [n["index"] for n in cli.record("busy")["cluster"]["nodes"]] == [0, 1]
        assert not any(b"node-2" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in cli.processes())
    finally:
        if follower is not None:
            follower.kill()
        if program.poll() is None:
            program.kill()
        program.communicate()


def test_follow_of_an_unknown_pool_or_node_fails_clearly(cli: CLI) -> None:
    unknown = cli("logs", "nope", "-f")
    assert unknown.code == 1 and "no pool named 'nope'" in unknown.err, unknown
    assert cli("up", "one", "--nodes", "1").code == 0
    bad = cli("logs", "one", "-f", "--node", "3")
    assert bad.code == 2 and "nodes 0 to 0" in bad.err, bad
