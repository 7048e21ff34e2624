"""One node starts the others: run a command on each of many hosts through OpenSSH, on a node.

A pool of ``sky.SSH(fanout=True)`` logs into its first node only; the client then runs
``python -m skyward.bootstrap.fanout`` there (an SSH session with the client's ssh-agent
forwarded: providers/ssh_fanout.py answers its signing requests), and this program logs into
the other hosts with the ``ssh`` command and runs what the client would have run on each (the
node's start, ``script.node_up``, or a release). The logins and their key exchanges are the
node's CPU, not the client's: a node costs the client one forwarded signature and the lines it
reads, where a login of its own costs it a key exchange in its interpreter (issue 65).

Its standard input: one line of JSON, the plan, then each job's input bytes in turn::

    {"ssh": [ARG...], "known_hosts": "TEXT", "parallel": N, "sky": "DIR",
     "jobs": [{"i": INDEX, "dest": [ARG...], "command": "TEXT", "stdin": SIZE}, ...]}

``ssh`` and ``dest`` are the ssh command's options (``dest`` ends with the host); the host keys
in ``known_hosts`` are the only ones accepted (the client's, written to a 0600 file of this run's,
removed at exit). Each job's output lines come back as ``@@fan INDEX LINE``, and its end as
``@@fan INDEX @@exit CODE``; lines are sent in batches, not one packet each. A job's
``@@need PATH...`` (node_up asking for shared files it lacks) is answered from ``sky``, this
node's copy of them (it was started with them), so a host that lacks them costs the client
nothing either. At most ``parallel`` logins run at once. Standard library and skyward only:
it runs in the node's environment, which has no SSH library.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, BinaryIO

_FLUSH_S = 0.02  # lines gathered this long go out together
LACKS = "@@fanout-lacks"  # a job's line: this node could not give the host what it asked for


class _Out:
    """Lines to the client, several per write (each write of the session is a packet there)."""

    def __init__(self, stream: BinaryIO, on_broken: Any = None) -> None:
        self._stream, self._lock, self._on_broken = stream, threading.Condition(), on_broken
        self._lines: list[str] = []
        self._done = False
        self._thread = threading.Thread(target=self._pump, name="fanout-out", daemon=True)
        self._thread.start()

    def line(self, index: int, text: str) -> None:
        with self._lock:
            self._lines.append(f"@@fan {index} {text}\n")
            self._lock.notify()

    def _pump(self) -> None:
        while True:
            with self._lock:
                while not self._lines and not self._done:
                    self._lock.wait()
                if not self._lines and self._done:
                    return
            threading.Event().wait(_FLUSH_S)
            with self._lock:
                batch, self._lines = self._lines, []
            try:
                self._stream.write("".join(batch).encode())
                self._stream.flush()
            except OSError:  # the client went away (it gave up waiting): nobody reads the hosts' lines
                if self._on_broken is not None:
                    self._on_broken()
                return

    def close(self) -> None:
        with self._lock:
            self._done = True
            self._lock.notify()
        self._thread.join()


class _AgentMux:
    """One connection to the forwarded agent for every login this program makes: each ``ssh``
    child connects to this socket instead of sshd's, whose every connection is a new channel
    to the client (a channel's opening, its requests and its close are packets the client's
    interpreter reads and writes). Requests go up one at a time, in order (the protocol answers
    in order); the list of identities is asked once and answered from memory after."""

    def __init__(self, upstream: str, path: str) -> None:
        self.upstream, self.path = upstream, path
        self._up: socket.socket | None = None
        self._lock = threading.Lock()
        self._identities: bytes | None = None
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)  # in this run's 0700 folder
        self._server.listen(64)
        threading.Thread(target=self._accept, name="fanout-agent", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="fanout-agent-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                request = _message(conn)
                if request is None:
                    return
                try:
                    conn.sendall(self._ask(request))
                except OSError:
                    return

    def _ask(self, request: bytes) -> bytes:
        is_list = request[4:5] == bytes([11])  # SSH_AGENTC_REQUEST_IDENTITIES
        with self._lock:
            if is_list and self._identities is not None:
                return self._identities
            try:
                if self._up is None:
                    self._up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    self._up.connect(self.upstream)
                self._up.sendall(request)
                answer = _message(self._up)
            except OSError:
                answer = None
            if answer is None:  # the client's side went away: every later request fails
                if self._up is not None:
                    self._up.close()
                self._up = None
                return b"\x00\x00\x00\x01\x05"  # SSH_AGENT_FAILURE
            if is_list:
                self._identities = answer
            return answer

    def close(self) -> None:
        self._server.close()
        with self._lock:
            if self._up is not None:
                self._up.close()


def _message(sock: socket.socket) -> bytes | None:
    """One agent message (its length and body), or None at the end of the stream."""
    data = b""
    while len(data) < 4:
        chunk = sock.recv(4 - len(data))
        if not chunk:
            return None
        data += chunk
    size = int.from_bytes(data, "big")
    if size > 256 * 1024:
        return None
    while len(data) < 4 + size:
        chunk = sock.recv(4 + size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size) if size else b""
    if len(data) != size:
        raise SystemExit(f"fanout: the plan ended early ({len(data)} of {size} bytes)")
    return data


def _answer_need(line: str, sky: str) -> bytes | None:
    """node_up's ``@@need PATH...`` answered from this node's SKY: a size line and a tar of them
    (the same bytes the client sends), or None when this node lacks one (the job fails)."""
    from skyward.bootstrap.remote import tar_archive

    names = line[len("@@need"):].split()
    items: list[tuple[str, Path | bytes, int]] = []
    for name in names:
        path = Path(sky) / name
        if ".." in name.split("/") or not path.is_file():
            return None
        items.append((name, path, 0o644))
    if not items:
        return b"0\n"
    size, parts = tar_archive(items)
    return b"".join([f"{size}\n".encode(), *parts])


def _job(job: dict[str, Any], data: bytes, plan: dict[str, Any], known: str, out: _Out,
         gate: threading.Semaphore, running: set[subprocess.Popen[bytes]], lock: threading.Lock,
         env: dict[str, str]) -> None:
    index = int(job["i"])
    with gate:
        argv = [*plan.get("ssh_command", ["ssh"]), *plan["ssh"], "-o", f"UserKnownHostsFile={known}",
                *job["dest"], "--", job["command"]]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    env=env)
        except OSError as exc:
            out.line(index, f"fanout: cannot run {argv[0]}: {exc}")
            out.line(index, "@@exit 127")
            return
        with lock:
            running.add(proc)
        assert proc.stdin is not None and proc.stdout is not None
        stdin: IO[bytes] | None = proc.stdin
        try:
            try:
                proc.stdin.write(data)
                proc.stdin.flush()
            except OSError:  # it ended before reading it all: its output says why
                stdin = None
            if not job.get("answer"):
                if stdin is not None:
                    stdin.close()
                stdin = None
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                out.line(index, line)
                if stdin is not None and line.startswith("@@need"):
                    reply = _answer_need(line, plan.get("sky", ""))
                    if reply is None:  # (the client starts this host itself: LACKS tells it so)
                        out.line(index, f"{LACKS} this node lacks a file the host needs")
                        reply = b""
                    try:
                        stdin.write(reply)
                        stdin.close()
                    except OSError:
                        pass
                    stdin = None
            if stdin is not None:
                try:
                    stdin.close()
                except OSError:
                    pass
            code = proc.wait()
        finally:
            with lock:
                running.discard(proc)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.line(index, f"@@exit {code}")


def main(argv: list[str] | None = None) -> int:
    stdin = sys.stdin.buffer
    plan = json.loads(stdin.readline())
    jobs = [(job, _read_exactly(stdin, int(job.get("stdin", 0)))) for job in plan["jobs"]]
    running: set[subprocess.Popen[bytes]] = set()
    lock = threading.Lock()

    def kill_all() -> None:
        with lock:
            for proc in running:
                if proc.poll() is None:
                    proc.kill()

    out = _Out(sys.stdout.buffer, kill_all)
    folder = tempfile.mkdtemp(prefix="skyward-fanout-")  # 0700
    known = os.path.join(folder, "known_hosts")
    fd = os.open(known, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(plan.get("known_hosts", ""))
    env = dict(os.environ)
    mux = None
    if env.get("SSH_AUTH_SOCK"):
        mux = _AgentMux(env["SSH_AUTH_SOCK"], os.path.join(folder, "agent.sock"))
        env["SSH_AUTH_SOCK"] = mux.path
    gate = threading.Semaphore(max(1, int(plan.get("parallel", 32))))
    threads = [threading.Thread(target=_job, args=(job, data, plan, known, out, gate, running, lock, env),
                                name=f"fanout-{job['i']}", daemon=True) for job, data in jobs]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        kill_all()
        out.close()
        if mux is not None:
            mux.close()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
