"""bootstrap/fanout.py (the program sky.SSH(fanout=True) runs on the first host) and
bootstrap/agentfwd.py (the client's answers to its forwarded agent), run for real here: the
program is started as the client starts it, with an ``ssh`` that runs each command locally,
and the agent is a real Unix socket that ``ssh-add`` asks."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from skyward.bootstrap.agentfwd import KeyAgent

FAKE_SSH = """\
import os, sys
args = sys.argv[1:]
command = args[args.index("--") + 1]
# what the first host's ssh was told: the options, the host keys file it may read
with open(os.environ["FAKE_SSH_LOG"], "a") as f:
    f.write(repr(args[:args.index("--")]) + "\\n")
os.execvp("bash", ["bash", "-c", command])
"""


def run_fanout(tmp_path: Path, jobs: list[dict], blobs: list[bytes], *, sky: str = "", env: dict | None = None,
               parallel: int = 8) -> tuple[list[str], int]:
    fake = tmp_path / "fake_ssh.py"
    fake.write_text(FAKE_SSH)
    plan = {"ssh": ["-T", "-o", "BatchMode=yes"], "ssh_command": [sys.executable, str(fake)], "parallel": parallel,
            "sky": sky, "known_hosts": "10.0.0.9 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGt0ZXN0\n", "jobs": jobs}
    stdin = json.dumps(plan).encode() + b"\n" + b"".join(blobs)
    e = {**os.environ, "FAKE_SSH_LOG": str(tmp_path / "ssh.log"), **(env or {})}
    done = subprocess.run([sys.executable, "-m", "skyward.bootstrap.fanout"], input=stdin, capture_output=True,
                          timeout=60, env=e)
    return done.stdout.decode().splitlines(), done.returncode


def by_job(lines: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in lines:
        assert line.startswith("@@fan "), line
        _, index, rest = line.split(" ", 2)
        out.setdefault(int(index), []).append(rest)
    return out


def test_each_hosts_lines_come_back_tagged_with_its_exit_code(tmp_path: Path) -> None:
    jobs = [{"i": 3, "dest": ["-p", "22", "-l", "u", "10.0.0.3"], "command": "cat; echo done; exit 0", "stdin": 6},
            {"i": 7, "dest": ["-p", "22", "-l", "u", "10.0.0.7"], "command": "echo bad >&2; exit 5", "stdin": 0}]
    lines, code = run_fanout(tmp_path, jobs, [b"hello\n"])
    assert code == 0
    got = by_job(lines)
    assert got[3] == ["hello", "done", "@@exit 0"]
    assert got[7] == ["bad", "@@exit 5"]  # stderr with stdout: what the client shows when a start fails
    seen = (tmp_path / "ssh.log").read_text()
    assert "'BatchMode=yes'" in seen and "'10.0.0.7'" in seen
    known = [a for a in seen.split("'") if a.startswith("UserKnownHostsFile=")]
    assert known and not Path(known[0].split("=", 1)[1]).exists()  # the run's host keys file is gone


def test_a_need_is_answered_from_the_first_hosts_own_copy(tmp_path: Path) -> None:
    sky = tmp_path / "sky"
    (sky / "wheels").mkdir(parents=True)
    (sky / "wheels" / "a.whl").write_bytes(b"A" * 1000)
    # The host asks for a file, then reads the size line and that many bytes, as node_up does.
    command = ('echo "@@need wheels/a.whl"; IFS=" " read -r size; head -c "$size" > got.tar; '
               'tar -tvf got.tar; echo received')
    jobs = [{"i": 1, "dest": ["h"], "command": f"cd {tmp_path} && {command}", "stdin": 0, "answer": True}]
    lines, code = run_fanout(tmp_path, jobs, [], sky=str(sky))
    assert code == 0
    got = by_job(lines)[1]
    assert got[0] == "@@need wheels/a.whl" and got[-1] == "@@exit 0", got
    with tarfile.open(tmp_path / "got.tar") as t:
        member = t.getmember("wheels/a.whl")
        assert t.extractfile(member).read() == b"A" * 1000  # type: ignore[union-attr]
    # A file this host does not have: nothing made up, the host is told nothing and fails.
    jobs = [{"i": 2, "dest": ["h"], "command": 'echo "@@need ../etc/passwd"; IFS=" " read -r size || exit 9',
             "stdin": 0, "answer": True}]
    got = by_job(run_fanout(tmp_path, jobs, [], sky=str(sky))[0])[2]
    assert "@@fanout-lacks this node lacks a file the host needs" in got and got[-1] == "@@exit 9"


class Agent:
    """A Unix socket served by KeyAgent (as the client serves its forwarded channel), counting
    its connections."""

    def __init__(self, path: Path, keys: list[paramiko.PKey]) -> None:
        self.agent = KeyAgent(keys)
        self.connections = 0
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            self.agent(conn)  # type: ignore[arg-type]  (a socket has what a channel has here)

    def close(self) -> None:
        self.agent.close()
        self.server.close()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Agent, paramiko.PKey, Path]]:
    key = paramiko.Ed25519Key.from_private_key(io.StringIO(_ed25519()))
    path = tmp_path / "agent.sock"
    a = Agent(path, [key])
    try:
        yield a, key, path
    finally:
        a.close()


def _ed25519() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()).decode()


@pytest.mark.skipif(shutil.which("ssh-add") is None, reason="needs ssh-add (openssh-client)")
def test_every_login_shares_one_connection_to_the_forwarded_agent(tmp_path: Path, agent: tuple) -> None:
    a, _, path = agent
    jobs = [{"i": i, "dest": ["h"], "command": "ssh-add -l; ssh-add -l", "stdin": 0} for i in range(4)]
    lines, code = run_fanout(tmp_path, jobs, [], env={"SSH_AUTH_SOCK": str(path)})
    assert code == 0
    got = by_job(lines)
    for i in range(4):
        assert got[i][-1] == "@@exit 0", got[i]
        assert sum("(ED25519)" in line for line in got[i]) == 2, got[i]
    assert a.connections == 1  # eight listings, one channel (and the list asked once)


def agent_request(sock: socket.socket, body: bytes) -> bytes:
    sock.sendall(struct.pack(">I", len(body)) + body)
    size = struct.unpack(">I", sock.recv(4))[0]
    data = b""
    while len(data) < size:
        data += sock.recv(size - len(data))
    return data


def _string(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def test_the_client_signs_with_its_key_and_nothing_after_close(agent: tuple) -> None:
    a, key, path = agent
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        answer = agent_request(s, bytes([11]))
        assert answer[0] == 12 and key.asbytes() in answer
        data = b"session id and userauth request"
        answer = agent_request(s, bytes([13]) + _string(key.asbytes()) + _string(data) + struct.pack(">I", 0))
        assert answer[0] == 14
        blob = answer[5:]
        assert paramiko.Ed25519Key(data=key.asbytes()).verify_ssh_sig(data, paramiko.Message(blob))
        other = paramiko.Ed25519Key.from_private_key(io.StringIO(_ed25519()))
        refused = agent_request(s, bytes([13]) + _string(other.asbytes()) + _string(data) + struct.pack(">I", 0))
        assert refused == bytes([5])  # a key it does not hold
        assert agent_request(s, bytes([17])) == bytes([5])  # anything else: adding keys, locking...
        assert agent_request(s, bytes([13]) + b"\x00\x00\xff\xff") == bytes([5])  # malformed
        assert a.agent.signed == 1
        a.agent.close()  # the start is over: the channel is closed and nothing more is signed
        s.settimeout(5)
        try:
            gone = s.recv(1)
        except OSError:
            gone = b""
        assert gone == b""


def test_an_rsa_key_signs_with_the_sha2_hash_the_host_asks_for() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()).decode()
    key = paramiko.RSAKey.from_private_key(io.StringIO(pem))
    agent = KeyAgent([key])
    try:
        for flags, name in ((2, b"rsa-sha2-256"), (4, b"rsa-sha2-512")):
            body = bytes([13]) + _string(key.asbytes()) + _string(b"data") + struct.pack(">I", flags)
            answer = agent._answer(body)
            assert answer[4] == 14 and name in answer
    finally:
        agent.close()
