"""`skyward ssh` and `skyward cp` on a Local named pool: a shell on a node, as a real
terminal program (tmux), one command with its exit status, files and folders both ways."""

from __future__ import annotations

import filecmp
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import CLI
from .tmuxterm import Tmux

pytestmark = pytest.mark.timeout(180)

TOML = """
[pools.demo]
provider = "local"
nodes = 2
ttl = 300

[pools.demo.image]
env = { GREETING = "hi there" }
"""
SKYWARD = f"{sys.executable} -m skyward"


@pytest.fixture
def demo(cli: CLI) -> CLI:
    cli.toml(TOML)
    up = cli("up", "demo", "--console", "silent")
    assert up.code == 0, up
    return cli


def node_dirs(cli: CLI) -> list[Path]:
    """Each Local node's working directory (where its agent log is)."""
    return [Path(n["log"]).parent for n in cli.record("demo")["cluster"]["nodes"]]


def audit(cli: CLI, event: str) -> list[dict[str, object]]:
    return [e for e in cli("history", "demo", "--json").json() if e["event"] == event]


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root: a file's bytes, None for a folder."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


# -- skyward ssh -------------------------------------------------------------------------------------
def test_ssh_is_a_shell_in_the_nodes_folder_with_the_pools_environment(demo: CLI, tmp_path: Path) -> None:
    term = Tmux(tmp_path, demo.env, demo.cwd)
    try:
        term.type(f"{SKYWARD} ssh demo --node 1")
        term.wait_for(r"\(demo:1\) ")
        term.type('echo "@@pwd=$(pwd) @@greet=$GREETING @@py=$(command -v python) @@tty=$(tty)"')
        m = term.wait_for(r"@@pwd=(\S+) @@greet=(.*) @@py=(\S+) @@tty=(\S+)")
        assert Path(m[1]) == node_dirs(demo)[1]
        assert m[2] == "hi there"
        assert m[3] == str(Path(sys.executable).parent / "python")  # the interpreter Local nodes run
        assert m[4].startswith("/dev/pts/")

        # The shell is a client of the pool while it is open: in use, its lease renewed.
        (row,) = demo("ls", "--json").json()
        assert row["state"] == "in use", row

        # Ctrl-C stops what runs in the shell, not the shell (nor skyward).
        term.type('echo "@@sleep""ing"; sleep 60')
        term.wait_for(r"@@sleeping")  # the line runs (C-c before it would interrupt nothing)
        term.keys("C-c")
        term.type('echo "@@after=$?"')
        assert term.wait_for(r"@@after=(\d+)")[1] == "130"

        term.type("exit 4")
        term.wait_for(r"exit 4\s*\nexit\s*\n\s*outer\$")  # back in the outer shell (keys typed before go to the node)
        term.type('echo "@@rc=$?"')
        assert term.wait_for(r"@@rc=(\d+)")[1] == "4"
    finally:
        term.close()
    (row,) = demo("ls", "--json").json()
    assert row["state"] == "running", row  # detached again
    (entry,) = audit(demo, "ssh")
    assert (entry["node"], entry["exit_code"], entry["command"]) == (1, 4, "(interactive shell)")


def test_ssh_with_a_command_on_a_terminal_gives_it_the_keys_ctrl_c_included(demo: CLI, tmp_path: Path) -> None:
    term = Tmux(tmp_path, demo.env, demo.cwd)
    try:
        term.type(f"{SKYWARD} ssh demo -- python -q")  # an interactive program, not a shell
        term.wait_for(r">>>$")
        term.keys("C-c")  # the program's: Python says KeyboardInterrupt and goes on
        term.wait_for(r"KeyboardInterrupt\s*\n>>>$")
        term.type("print(6 * 7)")
        term.wait_for(r"\n42\s*\n>>>$")
        term.type("raise SystemExit(5)")
        term.wait_for(r"SystemExit\(5\)\s*\n\s*outer\$")
        term.type('echo "@@rc=$?"')
        assert term.wait_for(r"@@rc=(\d+)")[1] == "5"
    finally:
        term.close()


def test_ssh_with_a_command_runs_it_there_and_exits_with_its_status(demo: CLI) -> None:
    ran = demo("ssh", "demo", "--node", "1", "--", 'echo "$GREETING"; pwd; exit 7')
    assert ran.code == 7, ran
    assert ran.out.splitlines() == ["hi there", str(node_dirs(demo)[1])]
    words = demo("ssh", "demo", "--", "printf", "%s|", "a b", "c")  # several words: each one argument
    assert (words.code, words.out) == (0, "a b|c|"), words
    # stdin is the command's
    fed = subprocess.run([sys.executable, "-m", "skyward", "ssh", "demo", "--", "tr a-z A-Z"], input="hello\n",
                         cwd=demo.cwd, env=demo.env, capture_output=True, text=True, timeout=60)
    assert (fed.returncode, fed.stdout) == (0, "HELLO\n"), fed
    script = subprocess.run([sys.executable, "-m", "skyward", "ssh", "demo", "--node", "1"],
                            input='pwd\necho "$GREETING"\nexit 3\n', cwd=demo.cwd, env=demo.env,
                            capture_output=True, text=True, timeout=60)  # no terminal: a script on stdin
    assert (script.returncode, script.stdout) == (3, f"{node_dirs(demo)[1]}\nhi there\n"), script


def test_ssh_refuses_what_it_cannot_do_with_the_rule_and_the_way_out(demo: CLI) -> None:
    bad = demo("ssh", "demo", "--node", "5")
    assert bad.code == 2 and "--node 5" in bad.err and "nodes 0 to 1" in bad.err, bad
    gone = demo("ssh", "nope")
    assert gone.code == 1 and "no pool named 'nope'" in gone.err, gone
    as_json = demo("ssh", "demo", "--json", "--", "true")
    assert as_json.code == 2 and "skyward exec demo --json" in as_json.err, as_json
    assert audit(demo, "ssh") == []


# -- skyward cp --------------------------------------------------------------------------------------------
def make_tree(root: Path) -> Path:
    data = root / "data"
    (data / "sub" / "empty").mkdir(parents=True)
    (data / "a.txt").write_text("alpha\n")
    (data / "sub" / "b.bin").write_bytes(os.urandom(300_000))
    return data


def test_cp_uploads_to_every_node_and_downloads_into_a_folder_per_node(demo: CLI, tmp_path: Path) -> None:
    data = make_tree(tmp_path)
    nodes = node_dirs(demo)
    up = demo("cp", str(data), "demo:inputs/", "--json")  # a trailing / : into that folder, made
    assert up.code == 0, up
    assert [r["target"] for r in up.json()] == [f"demo:{d}/inputs/data" for d in nodes]
    for d in nodes:  # relative node paths start in the node's working directory
        assert tree(d / "inputs" / "data") == tree(data)

    one = tmp_path / "note.txt"
    one.write_text("only node 1\n")
    assert demo("cp", str(one), "demo:note.txt", "--node", "1").code == 0
    assert not (nodes[0] / "note.txt").exists() and (nodes[1] / "note.txt").read_text() == "only node 1\n"

    back = tmp_path / "back"
    down = demo("cp", "demo:inputs/data", str(back))  # every node: back/node-<N>/data
    assert down.code == 0, down
    assert sorted(p.name for p in back.iterdir()) == ["node-0", "node-1"]
    for n in ("node-0", "node-1"):
        assert tree(back / n / "data") == tree(data)
    assert "node 1" in down.out and str(back / "node-1" / "data") in down.out

    got = demo("cp", "demo:note.txt", str(tmp_path / "got.txt"), "--node", "1")  # one node: the path itself
    assert got.code == 0, got
    assert (tmp_path / "got.txt").read_text() == "only node 1\n"

    # Onto a folder that exists: merged, like cp -r (a changed file replaced, the others kept).
    (data / "a.txt").write_text("changed\n")
    (nodes[0] / "inputs" / "data" / "extra").write_text("kept\n")
    assert demo("cp", str(data / "a.txt"), "demo:inputs/data/", "--node", "0").code == 0
    assert (nodes[0] / "inputs" / "data" / "a.txt").read_text() == "changed\n"
    assert (nodes[0] / "inputs" / "data" / "extra").read_text() == "kept\n"
    again = demo("cp", "demo:inputs/data", str(tmp_path / "one"), "--node", "0")
    assert again.code == 0, again
    assert not filecmp.dircmp(tmp_path / "one", nodes[0] / "inputs" / "data").diff_files

    for d in [*nodes, tmp_path]:  # no staging folder left anywhere
        assert not list(d.rglob(".skyward-cp-*"))
    entries = audit(demo, "cp")
    assert len(entries) == 6 and entries[0]["nodes"] == [0, 1], entries


def test_cp_of_a_path_missing_on_one_node_names_it_and_copies_nothing(demo: CLI, tmp_path: Path) -> None:
    nodes = node_dirs(demo)
    (nodes[0] / "result.csv").write_text("1,2\n")
    dest = tmp_path / "results"
    missing = demo("cp", "demo:result.csv", str(dest))
    assert missing.code == 1, missing
    assert "result.csv: no such file or folder on node 1" in missing.err and "node 0" not in missing.err, missing
    assert str(nodes[1]) in missing.err  # where relative paths start
    assert not dest.exists() and not list(tmp_path.glob(".skyward-cp-*"))

    # An upload one node cannot take (a file where a folder must be made) goes to no node.
    (nodes[1] / "blocker").write_text("a file\n")
    src = tmp_path / "x.txt"
    src.write_text("x\n")
    refused = demo("cp", str(src), "demo:blocker/x.txt")
    assert refused.code == 1 and "blocker: is a file on node 1" in refused.err, refused
    assert not (nodes[0] / "blocker").exists()

    # A folder of the copy where a node has a file (deep inside): refused before anything moves.
    data = make_tree(tmp_path)
    (nodes[0] / "inputs" / "data").mkdir(parents=True)
    (nodes[0] / "inputs" / "data" / "sub").write_text("a file where the copy has a folder\n")
    clash = demo("cp", str(data), "demo:inputs/")
    assert clash.code == 1, clash
    assert f"{nodes[0]}/inputs/data/sub: the copy of {data} has a folder where node 0" in clash.err, clash
    assert not (nodes[1] / "inputs").exists()  # node 1 could take it, and got nothing either
    local = tmp_path / "local"
    (local / "data").mkdir(parents=True)
    (local / "data" / "a.txt").mkdir()  # a folder here where the node has a file
    assert demo("cp", str(data), "demo:fine/", "--node", "1").code == 0
    fetched = demo("cp", "demo:fine/data", str(local), "--node", "1")
    assert fetched.code == 1 and f"{local}/data/a.txt: the copy of" in fetched.err, fetched
    assert sorted(p.name for p in (local / "data").iterdir()) == ["a.txt"]  # nothing else arrived

    nothing = demo("cp", str(tmp_path / "nope.txt"), "demo:")
    assert nothing.code == 1 and "nope.txt: no such file or folder here" in nothing.err, nothing
    both = demo("cp", str(src), str(tmp_path / "y"))
    assert both.code == 2 and "NAME:PATH" in both.err, both
    unknown = demo("cp", str(src), "other:x")
    assert unknown.code == 1 and "no pool named 'other'" in unknown.err, unknown
    for d in [*nodes, tmp_path]:  # no staging folder left anywhere
        assert not list(d.rglob(".skyward-cp-*"))


def test_cp_shows_a_progress_bar_on_a_terminal_only(demo: CLI, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(24 << 20))
    quiet = demo("cp", str(big), "demo:big.bin", "--node", "0")
    assert quiet.code == 0 and "%" not in quiet.err, quiet  # not a terminal: no bar
    term = Tmux(tmp_path, demo.env, demo.cwd)
    try:
        term.type(f"{SKYWARD} cp {big} demo:copy.bin; echo \"@@cp=$?\"")
        assert term.wait_for(r"@@cp=(\d+)")[1] == "0"
        bar = term.wait_for(r"big\.bin to 2 node\(s\).*100%.*50\.3/50\.3 MB")
        assert bar
    finally:
        term.close()
    for d in node_dirs(demo):
        assert (d / "copy.bin").read_bytes() == big.read_bytes()
    json.dumps(audit(demo, "cp"))  # recorded like every change


def test_a_node_that_cannot_be_reached_is_named_and_the_others_still_answer(demo: CLI, tmp_path: Path) -> None:
    pid = demo.record("demo")["cluster"]["nodes"][1]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:  # ours to reap (the tests are its subreaper)
                break
        except ChildProcessError:
            pass
        time.sleep(0.05)
    src = tmp_path / "x.txt"
    src.write_text("x\n")
    every = demo("cp", str(src), "demo:")
    assert every.code == 1, every
    assert "node 1" in every.err and "cannot be reached" in every.err and "--node" in every.err, every
    assert not (node_dirs(demo)[0] / "x.txt").exists()  # nothing went to the node that answers either
    shell = demo("ssh", "demo", "--node", "1", "--", "true")
    assert shell.code == 1 and "node 1" in shell.err, shell
    assert demo("cp", str(src), "demo:", "--node", "0").code == 0
    assert demo("ssh", "demo", "--node", "0", "--", "cat x.txt").out == "x\n"


def test_ctrl_c_stops_a_long_copy_at_once_and_leaves_nothing(demo: CLI, tmp_path: Path) -> None:
    node = node_dirs(demo)[0]
    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as f:  # 8 GB that read as zeros and take no disk: a copy of many seconds
        f.truncate(8 << 30)
    (node / "huge.bin").hardlink_to(huge)
    got = tmp_path / "got.bin"
    term = Tmux(tmp_path, demo.env, demo.cwd)
    try:
        for n, (src, dest, way) in enumerate([("demo:huge.bin", str(got), "from"), (str(huge), "demo:up.bin", "to")]):
            term.type(f"{SKYWARD} cp {src} {dest} --node 0; echo \"@@cp{n}=$?\"")
            term.wait_for(rf"huge\.bin {way} 1 node\(s\).*[1-9]\d*\.\d MB/s")  # under way
            started = time.monotonic()
            term.keys("C-c")
            assert term.wait_for(rf"@@cp{n}=(\d+)", timeout=20)[1] == "130", term.screen()
            assert time.monotonic() - started < 10
    finally:
        term.close()
    assert not got.exists() and not (node / "up.bin").exists()
    for d in (node, tmp_path):
        assert not list(d.rglob(".skyward-cp-*")), list(d.rglob(".skyward-cp-*"))
