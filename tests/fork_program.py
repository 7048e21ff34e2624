"""A program that forks while its pool is open, for the fork-safety tests (Local, sshd hosts,
named pools): run it with ``run(...)``, check what it reports with ``check(...)``.

The program opens a pool (or attaches to a named one), puts a value in one of its dicts and an
eventual counter, notes its nodes' pids, then for each mode forks a child that tries to use the
inherited pool and ends:

* ``exit``: ``sys.exit(0)`` inside the pool's ``with`` block, as a program ends: the block
  unwinds and the exit hooks run in the child;
* ``os._exit``: ends without unwinding or exit hooks;
* ``mp``: a ``multiprocessing`` Process of the fork start method.

Two children per mode: one that only ends, one that first tries every way to use the pool.

After each child is waited for (killed after 20 s: a child stuck on the parent's sockets counts
as a failure), the parent notes its nodes, the losses its pool saw, its collections' values and
the named pool's registry entry. Everything is printed as one JSON object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PROGRAM = r'''
import json, multiprocessing, os, sys, time
import skyward as sky

config = json.loads(os.environ["FORK_TEST"])


@sky.function
def node_pids():
    return [os.getpid(), os.getppid()]  # the worker and its agent


@sky.function
def double(x):
    return 2 * x


def registry():
    if not config.get("name"):
        return None
    from skyward.named import registry as reg
    return reg.read(config["name"])


def attempts(pool, kept, count):
    tried = {}
    calls = {
        ">>": lambda: double(1) >> pool,
        "@": lambda: double(1) @ pool,
        "map": lambda: pool.map(double, [1, 2]),
        "dict": lambda: kept["a"],
        "sky.dict": lambda: sky.dict("kept")["a"],  # the active pool's, as a task would
        "counter": lambda: count.increment(),  # eventual: a buffered write
        "pool.dict": lambda: pool.dict("other"),
    }
    for what, call in calls.items():
        try:
            call()
        except Exception as exc:
            tried[what] = [type(exc).__name__, str(exc)]
        else:
            tried[what] = None
    return tried


def child(pool, kept, count, fd, uses):
    try:
        report = {"pid": os.getpid(), "active": pool.is_active}
        if uses:
            report["tried"] = attempts(pool, kept, count)
    except BaseException as exc:
        report = {"crashed": repr(exc)}
    os.write(fd, json.dumps(report).encode())
    os.close(fd)


def wait(pid):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return json.loads(b"".join(chunks) or b"null")


options = sky.Options(console=False)
if config.get("name"):
    compute = sky.Compute(name=config["name"], options=options)
elif config.get("ssh"):
    hosts = [sky.SSHHost(**h) for h in config["ssh"]]
    compute = sky.Compute(provider=sky.SSH(hosts=hosts), nodes=len(hosts), options=options)
else:
    compute = sky.Compute(nodes=2, options=options)

out = {"parent": os.getpid(), "modes": {}}
with compute as pool:
    lost = []
    pool.subscribe(lambda e: lost.append(e.node) if isinstance(e, sky.InstanceLost) else None)
    kept = pool.dict("kept")
    kept["a"] = 1
    count = pool.counter("count", consistency="eventual")
    count.increment()
    assert count.value == 1
    out["nodes"] = sorted(node_pids() @ pool)
    out["registry"] = registry()
    for mode, uses in [(mode, uses) for mode in config["modes"] for uses in (False, True)]:
        r, w = os.pipe()
        if mode == "mp":
            p = multiprocessing.get_context("fork").Process(target=child, args=(pool, kept, count, w, uses))
            p.start()
            os.close(w)
            p.join(20)
            if p.is_alive():
                p.kill()
                p.join()
            code = p.exitcode if p.exitcode is not None and p.exitcode >= 0 else None
        else:
            pid = os.fork()
            if pid == 0:
                os.close(r)
                child(pool, kept, count, w, uses)
                if mode == "os._exit":
                    os._exit(0)
                sys.exit(0)  # unwinds the `with` block, then the exit hooks run
            os.close(w)
            code = wait(pid)
        report = read_all(r)
        time.sleep(1.0)  # a node the child stopped or cut off is found lost by now
        out["modes"].setdefault(mode, []).append({
            "exit": code, "child": report, "nodes": sorted(node_pids() @ pool), "lost": list(lost),
            "kept": kept["a"], "count": count.value, "registry": registry(),
        })
print(json.dumps(out))
'''


def run(folder: Path, modes: list[str], *, ssh: list[dict[str, Any]] | None = None, name: str | None = None,
        env: dict[str, str] | None = None, timeout: float = 240) -> dict[str, Any]:
    """Run the program (in ``folder``) and return its report; fail with its output if it fails."""
    script = folder / "forking.py"
    script.write_text(PROGRAM)
    config = {"modes": modes, "ssh": ssh, "name": name}
    environment = {**(env or os.environ), "FORK_TEST": json.dumps(config)}
    environment.pop("PYTEST_CURRENT_TEST", None)
    out = subprocess.run([sys.executable, str(script)], cwd=folder, env=environment, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, f"exit {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def check(report: dict[str, Any], modes: list[str], *, name: str | None = None) -> None:
    """Every child ended on its own, got InheritedPoolError for every use of the pool, and left
    the parent's pool as it was: same nodes, no loss, same values, same registry entry."""
    parent = report["parent"]
    assert list(report["modes"]) == modes
    for mode, seen in [(mode, seen) for mode, both in report["modes"].items() for seen in both]:
        child = seen["child"]
        if child and "tried" in child:
            mode += ", after using the pool"
        # First what the parent sees: that is what a child must never change.
        assert seen["lost"] == [], f"{mode}: the parent's pool lost node(s) {seen['lost']}"
        assert seen["nodes"] == report["nodes"], f"{mode}: the parent's nodes changed"
        assert seen["kept"] == 1 and seen["count"] == 1, f"{mode}: the collections changed: {seen}"
        assert seen["registry"] == report["registry"], f"{mode}: the registry entry changed"
        assert seen["exit"] == 0, f"{mode}: the child did not end on its own (killed or failed): {seen}"
        assert child is not None and "crashed" not in child, f"{mode}: {child}"
        assert child["active"] is False, f"{mode}: the inherited pool says it is active in the child"
        for what, error in child.get("tried", {}).items():
            assert error is not None, f"{mode}: {what} on the inherited pool did not raise"
            kind, message = error
            assert kind == "InheritedPoolError", f"{mode}: {what} raised {kind}: {message}"
            assert f"process {parent}" in message and f"({child['pid']})" in message, message
            assert "sky.Compute(" in message, message
            if name is not None:
                assert f"sky.Compute(name={name!r})" in message, message
