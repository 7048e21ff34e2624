"""`skyward install NAME PKG...` on real Local pools: resolved once on the
client keeping the pool's versions, installed on every node, importable by workers already
running, recorded in the lock and record (reproduce, diff), and clear errors. The SSH path (a
wheelhouse shipped to hosts with no route out) is tests/cli/test_install_ssh.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import CLI
from .wheelindex import WheelIndex

PROBE = """
    import json, sys
    import skyward as sky

    @sky.function
    def versions():
        import skylive, skylivedep
        return [skylive.VERSION, skylivedep.VERSION]

    with sky.Compute(name=sys.argv[1], options=sky.Options(console="silent")) as pool:
        print(json.dumps(versions() @ pool))
"""


@pytest.fixture
def index(tmp_path: Path) -> WheelIndex:
    ix = WheelIndex(tmp_path / "index")
    ix.publish("skylivedep", "1.0")
    ix.publish("skylivedep", "2.0")
    ix.publish("skylive", "1.0", "skylivedep>=1")
    ix.publish("skylive", "2.0", "skylivedep>=2")  # newest, but it needs a dependency the pool does not have
    return ix


def _toml(cli: CLI, ix: WheelIndex, *names: str) -> None:
    tables = "".join(
        f'[pools.{n}]\nprovider = "local"\nnodes = 2\n\n[pools.{n}.image]\npip = ["skylivedep==1.0"]\n'
        f'pip_indexes = [{{ url = "{ix.url}", packages = ["skylive", "skylivedep"] }}]\n\n' for n in names)
    cli.toml(tables)


def _probe(cli: CLI, name: str) -> object:
    ran = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE), name], cwd=cli.cwd, env=cli.env,
                         capture_output=True, text=True, timeout=90)
    return json.loads(ran.stdout) if ran.returncode == 0 else ran.stderr


def test_install_on_every_node_keeps_the_pools_versions_and_is_recorded(cli: CLI, index: WheelIndex) -> None:
    _toml(cli, index, "lv", "other")
    assert cli("up", "lv").code == 0
    pool_id = cli.record("lv")["id"]
    assert "No module named 'skylive'" in str(_probe(cli, "lv"))

    # A program attached before the install: its workers are running when the packages land.
    program = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        import skyward as sky

        @sky.function
        def versions():
            import skylive, skylivedep
            return [skylive.VERSION, skylivedep.VERSION]

        with sky.Compute(name="lv", options=sky.Options(console="silent")) as pool:
            print(sky.function(lambda: 1)() @ pool, flush=True)  # its workers run now
            sys.stdin.readline()
            print(versions() @ pool, flush=True)
    """)], cwd=cli.cwd, env=cli.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert program.stdout is not None and program.stdout.readline().strip() == "[1, 1]"
        done = cli("install", "lv", "skylive")
        assert done.code == 0, done
        # Resolved once, keeping the pool's skylivedep 1.0: skylive 1.0, not the newest 2.0.
        assert "skylive==1.0" in done.out and "skylivedep==1.0" in done.out, done
        assert "node 0" in done.err and "node 1" in done.err, done
        out, _ = program.communicate("go\n", timeout=60)
        assert out.strip() == "[['1.0', '1.0'], ['1.0', '1.0']]", out
    finally:
        if program.poll() is None:
            program.kill()
            program.communicate()
    assert _probe(cli, "lv") == [["1.0", "1.0"], ["1.0", "1.0"]]

    # The record: the lock has it, the amendment is vouched for by the trail.
    record = cli("history", pool_id, "--json").json()
    locked = {p["name"]: p["version"] for p in record["lock"]["packages"]}
    assert locked["skylive"] == "1.0" and locked["skylivedep"] == "1.0"
    (entry,) = record["installs"]
    assert entry["requirements"] == ["skylive"] and [p["name"] for p in entry["packages"]] == ["skylive"]
    assert cli("history", "--verify").code == 0
    assert "installed" in (shown := cli("history", pool_id).out) and "skylive (skylive==1.0, skylivedep==1.0)" in shown
    trail = [e["event"] for e in cli("history", "lv", "--json").json()]
    assert trail.count("installed") == 1
    assert "installed by" in cli("events", "lv").out

    # diff: a pool of the same settings without the install differs by it.
    assert cli("up", "other").code == 0
    other_id = cli.record("other")["id"]
    diff = cli("diff", pool_id, other_id, "--json")
    assert diff.code == 1 and {"what": "package removed", "key": "skylive", "a": "1.0", "b": None} in diff.json()

    # reproduce: the copy has it from its start, and differs in no package.
    again = cli("reproduce", pool_id, "--name", "copy", "--json", timeout=120)
    assert again.code == 0, again
    assert _probe(cli, "copy") == [["1.0", "1.0"], ["1.0", "1.0"]]
    differences = cli("diff", pool_id, again.json()["id"], "--json").json()
    assert not [d for d in differences if d["what"].startswith("package")], differences

    # Again: nothing new for the nodes, which say so; the record is not rewritten with a change.
    rerun = cli("install", "lv", "skylive")
    assert rerun.code == 0 and "skylive==1.0" in rerun.out, rerun


def test_install_errors_name_the_pool_the_package_and_the_node(cli: CLI, index: WheelIndex) -> None:
    _toml(cli, index, "lv")
    ghost = cli("install", "ghost", "skylive")
    assert ghost.code == 1 and "no pool named 'ghost'" in ghost.err, ghost
    assert cli("up", "lv").code == 0
    pool_id = cli.record("lv")["id"]

    bad = cli("install", "lv", "skylive>>1")
    assert bad.code == 2 and "'skylive>>1' is not a requirement" in bad.err, bad
    missing = cli("install", "lv", "skylive", "no-such-package-here")
    assert missing.code == 1, missing
    assert "no-such-package-here: does not resolve" in missing.err and "nothing was installed" in missing.err
    conflict = cli("install", "lv", "skylivedep>=2")
    assert conflict.code == 1 and "skylivedep>=2: conflicts with the versions pool 'lv' has" in conflict.err, conflict
    assert "No module named 'skylive'" in str(_probe(cli, "lv"))  # none of these installed anything

    # A node that cannot be reached fails on its own; the node done is said; nothing recorded.
    os.kill(cli.record("lv")["cluster"]["nodes"][1]["pid"], signal.SIGKILL)
    partial = cli("install", "lv", "skylive")
    assert partial.code == 1, partial
    assert "installing on node 1" in partial.err and "not reached" in partial.err, partial
    assert "done on: node 0; failed on: node 1" in partial.err, partial
    record = cli("history", pool_id, "--json").json()
    assert "skylive" not in {p["name"] for p in record["lock"]["packages"]} and not record.get("installs")
    (failed,) = [e for e in cli("history", "lv", "--json").json() if e["event"] == "install failed"]
    assert (failed["nodes_done"], failed["nodes_failed"]) == ([0], [1])
    as_json = cli("install", "lv", "skylive", "--json")
    nodes = as_json.json()["nodes"]
    assert [(n["node"], n["ok"]) for n in nodes] == [(0, True), (1, False)] and not as_json.json()["recorded"]


def test_install_on_a_pool_whose_slots_are_all_busy_does_not_wait(cli: CLI, index: WheelIndex) -> None:
    _toml(cli, index, "lv")
    assert cli("up", "lv").code == 0
    program = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        import skyward as sky
        with sky.Compute(name="lv", options=sky.Options(console="silent")) as pool:
            print("busy", flush=True)
            sky.function(time.sleep)(120) @ pool
    """)], cwd=cli.cwd, env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert program.stdout is not None and program.stdout.readline().strip() == "busy"
        time.sleep(0.5)  # the sleeps hold every node's only slot
        start = time.monotonic()
        done = cli("install", "lv", "skylive")
        assert done.code == 0, done
        assert time.monotonic() - start < 30  # the agents installed beside the busy workers
    finally:
        program.kill()
        program.communicate()
