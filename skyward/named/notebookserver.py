"""On the node: start a notebook server for ``skyward notebook`` and stop it when the client goes.

``python -m skyward.named.notebookserver jupyter|marimo --root DIR [--watch-pid PID]`` runs in
the pool's environment on the node (the client activates it first, as ``skyward ssh`` does). It
reads the server's token from the first line of stdin (a secret: never on a command line, which
every user of the node can read with ``ps``), starts JupyterLab or marimo on a free port of the
node's loopback (or of ``--host``: a Slurm node's private address, the only one the login node's
tunnel reaches), in DIR, and prints one JSON line once the server answers: ``{"port", "pid",
"log"}`` (or ``{"error", "log"}`` when it did not start).

It then watches, and stops the server (its whole process group: the kernels too) when:

* its stdin ends: the client closed the connection (Ctrl-C, or the client died);
* the agent of the node (``--watch-pid``) is gone, or DIR is: ``skyward down`` stopped the pool.

Standard library only: this runs beside the agent, in whatever environment the pool has.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

_START_TIMEOUT = 180.0  # seconds a server may take to answer (a cold node imports a lot)
_POLL = 1.0


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


def _command(kind: str, host: str, port: int, root: str) -> list[str]:
    if kind == "marimo":
        # The token comes on the server's stdin (`-`), which this process writes and closes.
        return [sys.executable, "-m", "marimo", "-q", "-y", "edit", "--headless", "--host", host,
                "--port", str(port), "--token-password-file", "-", "--skip-update-check", root]
    # JUPYTER_TOKEN (the environment, see main) is the server's token. The node has no route to
    # the internet here as often as not: no update checks, no news.
    # (A node logged into as root is common on rented GPU boxes: allowed, the server is on the
    # node's loopback behind a token.)
    return [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ip={host}", f"--port={port}",
            "--port-retries=0", f"--ServerApp.root_dir={root}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.news_url=None", "--LabApp.extension_manager=readonly",
            *(["--allow-root"] if os.geteuid() == 0 else [])]


def _jupyter_paths(env: dict[str, str]) -> dict[str, str]:
    """Jupyter's data and config folders of what the pool installed beside its interpreter:
    ``skyward install`` (and this command) put packages in a folder on PYTHONPATH (the pool's live
    folder, ``uv pip install --target``), whose ``share/jupyter`` holds JupyterLab's assets and
    kernel specs and whose ``etc/jupyter`` enables the server's extensions; Jupyter looks for them
    under its interpreter's prefix only."""
    data, config, lab = [], [], None
    for entry in filter(None, env.get("PYTHONPATH", "").split(os.pathsep)):
        for prefix in (entry, os.path.dirname(os.path.dirname(os.path.dirname(entry)))):  # DIR or DIR/lib/pythonX.Y/site-packages
            share, etc = os.path.join(prefix, "share", "jupyter"), os.path.join(prefix, "etc", "jupyter")
            if os.path.isdir(share) and share not in data:
                data.append(share)
                if lab is None and os.path.isdir(os.path.join(share, "lab", "static")):
                    lab = os.path.join(share, "lab")
            if os.path.isdir(etc) and etc not in config:
                config.append(etc)
    out = {}
    if data:
        out["JUPYTER_PATH"] = os.pathsep.join([*data, *filter(None, [env.get("JUPYTER_PATH")])])
    if config:
        out["JUPYTER_CONFIG_PATH"] = os.pathsep.join([*config, *filter(None, [env.get("JUPYTER_CONFIG_PATH")])])
    own = os.path.join(sys.prefix, "share", "jupyter", "lab", "static")
    if lab is not None and "JUPYTERLAB_DIR" not in env and not os.path.isdir(own):
        out["JUPYTERLAB_DIR"] = lab
    return out


def _alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's group (a Jupyter server shuts its kernels down on it), then
    SIGKILL to what is left after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        break
    # Kernels of their own session outlive a killed server: their group goes too.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _say(message: dict[str, object]) -> None:
    try:
        os.write(1, (json.dumps(message) + "\n").encode())
    except OSError:  # the client is gone: nobody to tell
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skyward.named.notebookserver")
    p.add_argument("kind", choices=["jupyter", "marimo"])
    p.add_argument("--root", required=True)
    p.add_argument("--watch-pid", type=int)
    p.add_argument("--host", default="127.0.0.1",
                   help="the address the server listens on (default: the node's loopback)")
    args = p.parse_args(argv)

    token = sys.stdin.buffer.readline().decode().strip()
    if not token:
        _say({"error": "no token on stdin"})
        return 2
    folder = os.path.join(args.root, ".skyward-notebook")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    port = _free_port(args.host)
    log = os.path.join(folder, f"{args.kind}-{port}.log")
    env = dict(os.environ)
    if args.kind == "jupyter":
        env["JUPYTER_TOKEN"] = token
        env.update(_jupyter_paths(env))
    with open(log, "ab") as out:
        # A session of its own: the server and its kernels stop as one group.
        proc = subprocess.Popen(_command(args.kind, args.host, port, args.root), cwd=args.root, env=env,
                                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    assert proc.stdin is not None
    try:
        if args.kind == "marimo":
            proc.stdin.write(token.encode() + b"\n")
        proc.stdin.close()
    except OSError:
        pass
    try:
        deadline = time.monotonic() + _START_TIMEOUT
        while not _answers(args.host, port):
            if proc.poll() is not None or time.monotonic() > deadline:
                why = (f"it exited with code {proc.returncode}" if proc.returncode is not None
                       else f"it did not answer within {_START_TIMEOUT:g} s")
                _say({"error": f"the {args.kind} server did not start: {why}", "log": log, "tail": _tail(log)})
                return 1
            time.sleep(0.2)
        with open(os.path.join(folder, f"{args.kind}-{port}.pid"), "w") as f:
            f.write(f"{proc.pid}\n")
        _say({"port": port, "pid": proc.pid, "log": log})
        reason = _watch(proc, args.root, args.watch_pid)
        _say({"stopped": reason})
        return 0
    finally:
        _stop(proc)
        try:
            os.unlink(os.path.join(folder, f"{args.kind}-{port}.pid"))
        except OSError:
            pass


def _watch(proc: subprocess.Popen[bytes], root: str, agent: int | None) -> str:
    """Wait for a reason to stop; say which."""
    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([stdin], [], [], _POLL)
        if ready and not os.read(stdin, 4096):
            return "the client left"
        if proc.poll() is not None:
            return f"the server exited with code {proc.returncode}"
        if not _alive(agent) or not os.path.isdir(root):
            return "the pool was stopped"


if __name__ == "__main__":
    sys.exit(main())
