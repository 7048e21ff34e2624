"""`skyward ssh` and `skyward cp` on SSH hosts: real sshd hosts reachable only through
a bastion, logged into as a user who is not root. The shell and the copies ride the pool's own
SSH connections (jump host and pinned host keys included); a real terminal (tmux) drives the
interactive shell."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshhosts import SSHHosts, SSHHostsUnavailable

from .conftest import CLI
from .tmuxterm import Tmux

pytestmark = pytest.mark.timeout(600)
SKYWARD = f"{sys.executable} -m skyward"


class Lab:
    def __init__(self, cli: CLI, hosts: SSHHosts, known: Path) -> None:
        self.cli, self.hosts, self.known = cli, hosts, known

    def on_host(self, i: int, command: str) -> str:
        argv = [*self.hosts[i].ssh_argv("/dev/null", strict="no"), command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout

    def cwd(self, i: int) -> str:
        return str(self.cli.record("lab")["cluster"]["nodes"][i]["pool_dir"])


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    hosts = SSHHosts(2, mode="netns", bastion=True, user="auto")
    try:
        hosts.start()
    except SSHHostsUnavailable as exc:
        pytest.skip(f"netns SSH test hosts unavailable: {exc}")
    cli = CLI(tmp_path_factory.mktemp("lab"))
    try:
        known = cli.cwd / "known_hosts"
        targets = json.dumps([f"{h.user}@{h.address}:{h.port}" for h in hosts])
        cli.toml(f'[pools.lab]\nprovider = "ssh"\nnodes = 2\nttl = 300\n\n'
                 f'[pools.lab.image]\nenv = {{ GREETING = "hi there" }}\n\n'
                 f'[pools.lab.ssh]\nhosts = {targets}\nkey = "{hosts[0].key_path}"\n'
                 f'jump = "{hosts.jump}"\nknown_hosts = "{known}"\n')
        up = cli("up", "lab", "--console", "silent", timeout=300)
        assert up.code == 0, up
        yield Lab(cli, hosts, known)
    finally:
        try:
            cli("down", "--all", "--force", timeout=120)
        finally:
            hosts.close()


def unreachable(address: str) -> bool:
    try:
        socket.create_connection((address, 22), timeout=1).close()
    except OSError:
        return True
    return False


def test_ssh_is_a_terminal_on_the_node_through_the_bastion_with_the_pools_venv(lab: Lab, tmp_path: Path) -> None:
    assert unreachable(lab.hosts[1].address)  # only the bastion leads there
    keys = lab.known.read_text()
    term = Tmux(tmp_path, lab.cli.env, lab.cli.cwd, width=100, height=30)
    try:
        term.type(f"{SKYWARD} ssh lab --node 1")
        term.wait_for(r"\(lab:1\) ")
        term.type('echo "@@host=$(hostname) @@user=$(id -un) @@pwd=$(pwd) @@greet=$GREETING '
                  '@@py=$(command -v python) @@tty=$(tty) @@size=$(stty size)"')
        m = term.wait_for(r"@@host=(\S+) @@user=(\S+) @@pwd=(\S+) @@greet=(.*) @@py=(\S+) @@tty=(\S+) @@size=(\d+ \d+)")
        assert (m[1], m[2]) == (lab.hosts[1].name, lab.hosts.user)
        assert m[3] == lab.cwd(1) and m[3].startswith("/var/tmp/skyward-"), m[3]  # where its tasks run
        assert m[4] == "hi there"
        assert m[5].startswith(f"/home/{lab.hosts.user}/.skyward/envs/") and m[5].endswith("/bin/python"), m[5]
        assert m[6].startswith("/dev/pts/") and m[7] == "30 100"  # a pseudo-terminal of this size

        term.type('python -c "import cloudpickle, skyward; print(\'@@imports\', \'ok\')"')  # the pool's venv
        term.wait_for(r"@@imports ok")
        term.resize(90, 25)  # a resized window reaches the node's terminal
        term.type('echo "@@resized=$(stty size)"')
        assert term.wait_for(r"@@resized=(\d+ \d+)")[1] == "25 90"
        term.type('read -r line; echo "@@read=$line"')  # keys go to the program reading them
        term.type("typed words")
        term.wait_for(r"@@read=typed words")
        term.type('echo "@@sleep""ing"; sleep 60')
        term.wait_for(r"@@sleeping")  # the line runs (C-c before it would interrupt nothing)
        term.keys("C-c")  # to the node, like every key: the sleep stops, the shell stays
        term.type('echo "@@after=$?"')
        assert term.wait_for(r"@@after=(\d+)")[1] == "130"
        term.type("exit 6")
        term.wait_for(r"exit 6\s*\nexit\s*\n\s*outer\$")  # back in the outer shell (keys typed before go to the node)
        term.type('echo "@@rc=$?"')
        assert term.wait_for(r"@@rc=(\d+)")[1] == "6"
    finally:
        term.close()
    assert lab.known.read_text() == keys  # the pool's pinned keys: nothing new was trusted


def test_ssh_with_a_command_on_a_terminal_runs_it_on_a_pseudo_terminal(lab: Lab, tmp_path: Path) -> None:
    term = Tmux(tmp_path, lab.cli.env, lab.cli.cwd)
    try:
        term.type(f"{SKYWARD} ssh lab -- python -q")  # the pool's Python, interactive
        term.wait_for(r">>>$")
        term.keys("C-c")
        term.wait_for(r"KeyboardInterrupt\s*\n>>>$")
        term.type("import os, sys; print('@@' + os.ttyname(0), sys.prefix)")
        m = term.wait_for(r"@@(/dev/pts/\d+) (\S+)")
        assert m[2].startswith(f"/home/{lab.hosts.user}/.skyward/envs/"), m[2]
        term.type("raise SystemExit(5)")
        term.wait_for(r"SystemExit\(5\)\s*\n\s*outer\$")
        term.type('echo "@@rc=$?"')
        assert term.wait_for(r"@@rc=(\d+)")[1] == "5"
    finally:
        term.close()


def test_ssh_with_a_command_keeps_stdout_stderr_stdin_and_the_exit_status(lab: Lab) -> None:
    ran = lab.cli("ssh", "lab", "--", 'echo out; echo err >&2; echo "$GREETING"; exit 4')
    assert ran.code == 4, ran
    assert ran.out == "out\nhi there\n" and "err" in ran.err, ran
    fed = subprocess.run([sys.executable, "-m", "skyward", "ssh", "lab", "--node", "1", "--", "tr a-z A-Z"],
                         input="hello\n", cwd=lab.cli.cwd, env=lab.cli.env, capture_output=True, text=True,
                         timeout=60)
    assert (fed.returncode, fed.stdout) == (0, "HELLO\n"), fed
    script = subprocess.run([sys.executable, "-m", "skyward", "ssh", "lab", "--node", "1"],
                            input='pwd\necho "$GREETING"\nexit 3\n', cwd=lab.cli.cwd, env=lab.cli.env,
                            capture_output=True, text=True, timeout=60)  # no terminal: a script on stdin
    assert (script.returncode, script.stdout) == (3, f"{lab.cwd(1)}\nhi there\n"), script
    # Every byte before the exit status arrives, each time (the end of the output races the
    # channel's close).
    for _ in range(10):
        again = lab.cli("ssh", "lab", "--", "seq 1 300; seq 1 50 >&2; exit 2")
        assert (again.code, again.out, again.err) == (2, "".join(f"{i}\n" for i in range(1, 301)),
                                                      "".join(f"{i}\n" for i in range(1, 51))), again
    # A reader that leaves early: no traceback, and the node's command does not run on forever.
    cut = subprocess.run(f"{SKYWARD} ssh lab -- 'yes | head -c 50000000' | head -c 6", shell=True, cwd=lab.cli.cwd,
                         env=lab.cli.env, capture_output=True, text=True, timeout=60)
    assert cut.stdout == "y\ny\ny\n" and "Traceback" not in cut.stderr, cut
    path = lab.cli("ssh", "lab", "--node", "1", "--", 'echo "$PYTHONPATH $SKYWARD_SITE"')
    assert path.out.split() == [f"{lab.cwd(1)}/site", f"{lab.cwd(1)}/site"], path  # where `install` puts packages
    where = lab.cli("ssh", "lab", "--node", "1", "--", "hostname")
    assert where.out.strip() == lab.hosts[1].name


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_cp_both_ways_on_every_node_with_a_folder_per_node(lab: Lab, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub" / "empty").mkdir(parents=True)
    (data / "a.txt").write_text("alpha\n")
    (data / "sub" / "big.bin").write_bytes(os.urandom(12 << 20))
    up = lab.cli("cp", str(data), "lab:", timeout=180)  # lab: is each node's working directory
    assert up.code == 0, up
    for i in (0, 1):
        listing = lab.on_host(i, f"cd {lab.cwd(i)}/data && find . | sort && sha256sum sub/big.bin && stat -c %U a.txt")
        assert "./sub/empty" in listing and digest(data / "sub" / "big.bin") in listing, listing
        assert listing.split()[-1] == lab.hosts.user  # the login user's, not the archive's owner
        assert ".skyward-cp-" not in lab.on_host(i, f"ls -a {lab.cwd(i)}")

    back = tmp_path / "back"
    down = lab.cli("cp", "lab:data", str(back), timeout=180)
    assert down.code == 0, down
    for n in ("node-0", "node-1"):
        assert (back / n / "data" / "a.txt").read_text() == "alpha\n"
        assert digest(back / n / "data" / "sub" / "big.bin") == digest(data / "sub" / "big.bin")
        assert (back / n / "data" / "sub" / "empty").is_dir()

    home = lab.cli("cp", str(data / "a.txt"), "lab:~/notes/", "--node", "1")  # ~ is the login user's home
    assert home.code == 0, home
    assert lab.on_host(1, "cat ~/notes/a.txt") == "alpha\n"

    # A file the login user cannot read, deep in a folder: the copy fails half way on that node,
    # naming it, and nothing arrives from either node.
    lab.on_host(0, f"mkdir -p {lab.cwd(0)}/half && echo ok > {lab.cwd(0)}/half/ok")
    lab.on_host(1, f"mkdir -p {lab.cwd(1)}/half && echo ok > {lab.cwd(1)}/half/ok && "
                   f"echo no > {lab.cwd(1)}/half/secret && chmod 000 {lab.cwd(1)}/half/secret")
    half = lab.cli("cp", "lab:half", str(tmp_path / "half"))
    assert half.code == 1 and "node 1" in half.err and "Permission denied" in half.err, half
    assert not (tmp_path / "half").exists() and not list(tmp_path.glob(".skyward-cp-*"))

    lab.on_host(0, f"echo only-here > {lab.cwd(0)}/lonely.txt")
    missing = lab.cli("cp", "lab:lonely.txt", str(tmp_path / "lonely"))
    assert missing.code == 1 and "lonely.txt: no such file or folder on node 1" in missing.err, missing
    assert lab.hosts[1].name in missing.err and not (tmp_path / "lonely").exists()
    one = lab.cli("cp", "lab:lonely.txt", str(tmp_path / "lonely.txt"), "--node", "0")
    assert one.code == 0 and (tmp_path / "lonely.txt").read_text() == "only-here\n", one
