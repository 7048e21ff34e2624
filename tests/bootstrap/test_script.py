"""The bootstrap script rendered from an Image (pure: no hosts needed). The SSH tests run it."""

from __future__ import annotations

import shlex
import subprocess
import zipfile
from pathlib import Path

import pytest

import skyward as sky
from skyward.bootstrap import script, wheelhouse


def plan(**kw: object) -> script.NodePlan:
    base: dict[str, object] = {"pool_id": "p1", "python": "3.11", "skyward_wheel": "wheels/skyward/ab/skyward.whl",
                               "skyward_hash": "ab"}
    base.update(kw)
    return script.NodePlan(**base)  # type: ignore[arg-type]


def phases(text: str) -> list[str]:
    return [line.split()[1] for line in text.splitlines() if line.startswith("phase ")]


def test_phases_in_order_and_only_those_the_image_needs() -> None:
    assert phases(script.render(sky.Image(), plan())) == ["env", "uv", "python", "venv", "skyward"]
    full = sky.Image(apt=["git"], pip=["six"], includes=["tests"], shell_vars={"X": "echo 1"})
    rendered = script.render(full, plan(includes_archive=True, ops=("echo op",)))
    assert phases(rendered) == ["env", "apt", "uv", "python", "venv", "deps", "skyward", "includes",
                                "shell_vars", "plugins"]
    assert [p for p in script.PHASES if p in phases(rendered)] == phases(rendered)


def test_the_script_is_valid_bash() -> None:
    image = sky.Image(apt=["git"], pip=["six", "torch"], env={"A": "it's $HOME"},
                      shell_vars={"B": "echo 'x y'"},
                      pip_indexes=[sky.PipIndex(url="https://download.pytorch.org/whl/cpu", packages=["torch"])])
    for install in ("wheelhouse", "index"):
        text = script.render(image, plan(install=install, ops=("echo 1",)))
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_env_values_are_quoted_literally() -> None:
    # (tests/test_image_validation.py runs the env phase and compares what a task sees.)
    text = script.render(sky.Image(env={"A": "it's $HOME; rm -rf /"}), plan())
    line = "export A='it'\"'\"'s $HOME; rm -rf /'"  # what env.sh holds: printf writes it as it is
    assert f"printf '%s\\n' {shlex.quote(line)} > " in text


def test_wheelhouse_installs_without_an_index_and_index_mode_scopes_pip_indexes() -> None:
    image = sky.Image(pip=["torch==2.3", "six"],
                      pip_indexes=[sky.PipIndex(url="https://download.pytorch.org/whl/cpu", packages=["torch"])])
    offline = script.render(image, plan(install="wheelhouse"))
    assert '--no-index --find-links "$SKY/wheels" torch==2.3 six' in offline
    online = script.render(image, plan(install="index"))
    # (by uv's environment, not its argv: tests/test_index_credentials.py)
    assert ('UV_INDEX=https://download.pytorch.org/whl/cpu"${UV_INDEX:+ $UV_INDEX}" "$UV" pip install '
            '--quiet --python "$ENV/bin/python" torch==2.3\n') in online
    assert '--python "$ENV/bin/python" six\n' in online
    assert "--no-index" not in online


def test_phase_keys_follow_their_inputs() -> None:
    a = script.env_key(sky.Image(pip=["six"]), plan())
    assert a == script.env_key(sky.Image(pip=["six"]), plan())
    assert a != script.env_key(sky.Image(pip=["six==1.16.0"]), plan())
    assert a != script.env_key(sky.Image(pip=["six"]), plan(python="3.12"))
    assert a != script.env_key(sky.Image(pip=["six"]), plan(install="index"))


@pytest.mark.parametrize(("line", "parsed"), [
    ("@@skyward phase deps started", ("deps", "started", None)),
    ("@@skyward phase apt failed 100", ("apt", "failed", 100)),
    ("@@skyward pid 12", None),
    ("some output", None),
])
def test_markers(line: str, parsed: tuple[str, str, int | None] | None) -> None:
    assert script.parse_marker(line) == parsed


def test_the_skyward_wheel_holds_every_subpackage_and_pins_the_agent_deps() -> None:
    wheel = wheelhouse.skyward_wheel()
    names = zipfile.ZipFile(wheel.path).namelist()
    for module in ("skyward/__init__.py", "skyward/bootstrap/agent.py", "skyward/providers/ssh.py",
                   "skyward/stacks/__init__.py", "skyward/runtime/info.py"):
        assert module in names
    assert not any("__pycache__" in n for n in names)
    meta = zipfile.ZipFile(wheel.path).read(next(n for n in names if n.endswith("METADATA"))).decode()
    for pin in wheelhouse.agent_requirements():
        assert f"Requires-Dist: {pin}" in meta
    assert wheelhouse.skyward_wheel() is wheel  # once per process


def test_the_skyward_wheel_is_the_same_bytes_whenever_it_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes keep a shipped file of the same name and size, and the lock checks the wheel's
    sha256: two clients building the wheel of the same code (another SKYWARD_HOME, another day)
    must make the same bytes."""
    import time as time_module

    files = [("skyward/__init__.py", wheelhouse.skyward_wheel().path)]  # (any file will do)
    first, second = tmp_path / "a.whl", tmp_path / "b.whl"
    wheelhouse._write_wheel(first, "1.0", files)
    later = time_module.time() + 86400 * 3
    monkeypatch.setattr(zipfile.time, "time", lambda: later)
    wheelhouse._write_wheel(second, "1.0", files)
    assert first.read_bytes() == second.read_bytes()
    assert zipfile.ZipFile(second).testzip() is None


def _node_script(text: str, sky_dir: Path, run_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(sky_dir.parent), "UV_CACHE_DIR": str(sky_dir.parent / "uv-cache"),
           "SKYWARD_SKY": str(sky_dir), "SKYWARD_RUN": str(run_dir), "SKYWARD_POOL": str(run_dir / "pool")}
    return subprocess.run(["bash", "-s"], input=text, capture_output=True, text=True, timeout=300, env=env)


def _run_node_script(text: str, sky_dir: Path, run_dir: Path) -> list[tuple[str, str]]:
    """The rendered script on this machine (the client's uv as the node's, this machine's Python),
    as far as its agent's start; the phases it reports, in order."""
    proc = _node_script(text, sky_dir, run_dir)
    assert proc.returncode == 0 and "@@skyward ready" in proc.stdout, proc.stdout + proc.stderr
    return [(p[0], p[1]) for p in map(script.parse_marker, proc.stdout.splitlines()) if p is not None]


def test_a_new_environment_gets_its_lock_and_skywards_wheel_in_one_uv_run(tmp_path: Path) -> None:
    """One `uv pip install` for the lock and skyward's wheel (checked by its sha256) where the
    environment is new; a new skyward on a warm node runs the skyward phase alone; an environment
    gone since is made again with everything in it (its phases' markers went with it)."""
    import hashlib
    import shutil
    import sys

    from cli.wheelindex import build_wheel

    from skyward.records import resolver

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if shutil.which(f"python{python}", path="/usr/bin:/bin") is None:
        pytest.skip(f"no system python{python} for the node's venv")
    sky_dir, run_dir = tmp_path / "sky", tmp_path / "run"
    (sky_dir / "bin").mkdir(parents=True)
    shutil.copy(resolver.uv_binary(), sky_dir / "bin" / "uv")
    dep = build_wheel(sky_dir / "wheels", "skyprobe", "1.0")
    lock = f"skyprobe==1.0 \\\n    --hash=sha256:{hashlib.sha256(dep.read_bytes()).hexdigest()}\n"

    def node_plan(version: str) -> script.NodePlan:
        wheel = build_wheel(sky_dir / "wheels" / "skyward" / version, "skyward", version, ("skyprobe==1.0",))
        return plan(python=python, skyward_wheel=f"wheels/skyward/{version}/{wheel.name}", skyward_hash=version,
                    skyward_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), lock=lock,
                    wheel_names=(dep.name,))

    def installed(p: script.NodePlan) -> str:
        venv = sky_dir / "envs" / script.env_key(sky.Image(), p)
        return subprocess.run([str(venv / "bin" / "python"), "-c", "import skyward, skyprobe; print(skyward.VERSION)"],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path).stdout.strip()

    # (the uv phase unpacks the shipped uv.gz: this one is there already, as on a warm node)
    first = node_plan("1.0")
    text = script.render(sky.Image(), first).replace('phase uv ', 'true ', 1)
    seen = dict((n, s) for n, s in _run_node_script(text, sky_dir, run_dir) if s != "started")
    assert (seen["deps"], seen["skyward"]) == ("done", "skipped")
    assert installed(first) == "1.0"
    seen = dict((n, s) for n, s in _run_node_script(text, sky_dir, run_dir) if s != "started")
    assert (seen["venv"], seen["deps"], seen["skyward"]) == ("skipped", "skipped", "skipped")
    # The environment gone: made again, and everything installed in it again.
    shutil.rmtree(sky_dir / "envs" / script.env_key(sky.Image(), first))
    seen = dict((n, s) for n, s in _run_node_script(text, sky_dir, run_dir) if s != "started")
    assert (seen["venv"], seen["deps"], seen["skyward"]) == ("done", "done", "skipped")
    assert installed(first) == "1.0"
    # Another skyward on the same environment: its phase alone.
    second = node_plan("2.0")
    text = script.render(sky.Image(), second).replace('phase uv ', 'true ', 1)
    seen = dict((n, s) for n, s in _run_node_script(text, sky_dir, run_dir) if s != "started")
    assert (seen["venv"], seen["deps"], seen["skyward"]) == ("skipped", "skipped", "done")
    assert installed(second) == "2.0"
    # A wheel that is not the one the lock names is refused.
    shutil.rmtree(sky_dir / "envs")
    tampered = text.replace(second.skyward_sha256, "0" * 64)
    failed = _node_script(tampered, sky_dir, run_dir)
    assert "@@skyward phase deps failed" in failed.stdout and "hash" in failed.stdout.lower(), failed.stdout


def _node_bin(tmp_path: Path, lz4: bool) -> Path:
    """A PATH of the commands these scripts run, with an lz4 command (this Python's lz4 module
    behind `lz4 -d -q -c FILE`) or without one, whatever this machine has."""
    import shutil
    import sys

    bin_dir = tmp_path / ("bin-lz4" if lz4 else "bin")
    bin_dir.mkdir()
    for name in ("id", "stat", "mkdir", "hostname", "gunzip", "gzip", "chmod", "mv", "cat"):
        found = shutil.which(name)
        assert found is not None, name
        (bin_dir / name).symlink_to(found)
    if lz4:
        fake = bin_dir / "lz4"
        fake.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import lz4.frame, sys; "
                        f"sys.stdout.buffer.write(lz4.frame.decompress(open(sys.argv[-1], \"rb\").read()))' \"$@\"\n")
        fake.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("lz4", [True, False], ids=["lz4", "no-lz4"])
def test_a_node_with_the_lz4_command_needs_uv_as_lz4_and_any_other_as_gzip(tmp_path: Path, lz4: bool) -> None:
    """uv travels packed two ways to SSH nodes: lz4 unpacks in 0.03 s of CPU, gzip in 0.25 s, but
    only where the node has the lz4 command. A node asks for the one it can unpack, never both."""
    sky_dir, run_dir = tmp_path / "sky", tmp_path / "run"
    files = {"bin/uv.gz": 10, "bin/uv.lz4": 12, "wheels/a.whl": 5}
    text = script.node_up("p1", 0, sudo=False, files=files, script="true", then="echo @@then",
                          lz4_or_gz=("bin/uv.lz4", "bin/uv.gz"))
    env = {"PATH": str(_node_bin(tmp_path, lz4)), "HOME": str(tmp_path), "SKYWARD_NODE_HOME": str(sky_dir),
           "SKYWARD_NODE_RUN": str(run_dir)}
    done = subprocess.run(["/bin/bash", "-s"], input=text + "token\n0\n0\n", env=env, capture_output=True,
                          text=True, timeout=60)
    assert "@@then" in done.stdout, done.stdout + done.stderr
    need = next(line for line in done.stdout.splitlines() if line.startswith("@@need")).split()[1:]
    assert need == (["bin/uv.lz4", "wheels/a.whl"] if lz4 else ["bin/uv.gz", "wheels/a.whl"])


@pytest.mark.parametrize("case", ["lz4", "no-lz4", "another-uv"])
def test_the_uv_phase_unpacks_the_lz4_frame_this_client_sent_else_the_gzip(tmp_path: Path, case: str) -> None:
    """Where the node has the lz4 command and a uv.lz4 of the size this client's is, the uv phase
    unpacks that; otherwise (no lz4 command, or a uv.lz4 another client's uv left) uv.gz."""
    import gzip

    import lz4.frame

    bin_dir = (tmp_path / "sky" / "bin")
    bin_dir.mkdir(parents=True)
    from_lz4, from_gz = b"#!/bin/sh\necho uv from lz4\n", b"#!/bin/sh\necho uv from gz\n"
    packed = lz4.frame.compress(from_lz4)
    (bin_dir / "uv.lz4").write_bytes(packed if case != "another-uv" else lz4.frame.compress(b"#!/bin/sh\necho old\n" * 3))
    (bin_dir / "uv.gz").write_bytes(gzip.compress(from_gz))
    text = script.render(sky.Image(), plan(install="wheelhouse", uv_lz4_size=len(packed)))
    body = text[text.index("_p_uv() {"):]
    body = body[: body.index("\n}\n") + 3]
    env = {"PATH": str(_node_bin(tmp_path, case != "no-lz4")), "UV": str(bin_dir / "uv")}
    done = subprocess.run(["/bin/bash", "-c", f"set -e\n{body}_p_uv"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == ("uv from lz4" if case == "lz4" else "uv from gz")
    assert sorted(p.name for p in bin_dir.iterdir()) == ["uv", "uv.gz", "uv.lz4"]  # no temporary file left


@pytest.mark.parametrize("kind", ["ascii", "non-ascii", "bash-without-read-N"])
def test_a_script_sent_on_stdin_runs_in_bash_and_leaves_the_rest_of_stdin_to_it(tmp_path: Path, kind: str) -> None:
    """bash_on_stdin: the script sent first on stdin runs in bash (in a session of its own), with
    the env= words set, and reads what the client sent after it (the pool's secret, the files)
    byte for byte. An ASCII script is taken in one read (read -N: bash -s reads a pipe one byte
    per read()); a script with other characters (-N counts characters), or a bash whose read
    refuses -N, runs through bash -s."""
    text = ('echo "foo=$FOO session=$(ps -o sid= -p $$ | tr -d " ") me=$$"; IFS= read -r secret; '
            'echo "secret=[$secret]"; cat\n')
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if kind == "non-ascii":
        text = "# (é)\n" + text
    if kind == "bash-without-read-N":  # (a read builtin of before bash 4.1: -N is not an option)
        (tmp_path / "old.sh").write_text('read() { for a; do if [ "$a" = -N ]; then echo "read: -N: invalid option" >&2; '
                                         'return 2; fi; done; builtin read "$@"; }\n')
        env["BASH_ENV"] = str(tmp_path / "old.sh")
    command = script.bash_on_stdin(text, "FOO=bar")
    assert ("read -r -N" in command) == (kind != "non-ascii"), command
    done = subprocess.run(["sh", "-c", command], input=(text + "s3cret line\nthe files\x00\x01").encode(),
                          env=env, capture_output=True, timeout=30)
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    first, second, rest = out.split("\n", 2)
    facts = dict(word.split("=", 1) for word in first.split())
    assert facts["foo"] == "bar" and facts["session"] == facts["me"], first  # (setsid: its own session)
    assert second == "secret=[s3cret line]" and rest == "the files\x00\x01", out


def test_a_starting_pools_folder_is_locked_before_anything_is_in_it_and_swept_after(tmp_path: Path) -> None:
    """hold_pool: the folder and its held lock come first; a sweep while the bootstrap (or the agent it
    starts) runs leaves the folder, one after all of them ended removes it, and a named pool's stays."""
    from skyward.bootstrap.sweep import LOCK, sweep

    pools = tmp_path / "pools"
    started = subprocess.Popen(
        ["bash", "-c", f'POOL={shlex.quote(str(pools / "p1-0"))}\n{script.hold_pool()}'
                       'ls -A "$POOL"; exec sleep 30'],  # what the shell execs holds it too (the agent)
        stdout=subprocess.PIPE, text=True)
    try:
        assert started.stdout is not None
        assert started.stdout.readline().strip() == LOCK  # nothing else there yet, and no temporary name left
        assert sweep(pools, "[!.]*-*") == []  # still starting
        assert (pools / "p1-0").is_dir()
    finally:
        started.kill()
        started.wait()
    kept = subprocess.run(["bash", "-c", f'POOL={shlex.quote(str(pools / "n1-0"))}\n{script.hold_pool(kept=True)}'],
                          check=True)
    assert kept.returncode == 0
    assert sweep(pools, "[!.]*-*") == [pools / "p1-0"]
    assert (pools / "n1-0" / ".kept").exists()


def _timed_lines(text: str, env: dict[str, str], stdin: str = "") -> list[tuple[float, str]]:
    """Each line the script prints, with when it came out (seconds from the start)."""
    import time

    started = time.monotonic()
    proc = subprocess.Popen(["bash", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(text + stdin)
        proc.stdin.close()
        lines = [(time.monotonic() - started, line.rstrip("\n")) for line in proc.stdout]
    finally:
        proc.kill()
        proc.wait()
    return lines


def test_progress_lines_that_need_no_hurry_go_out_with_the_next_that_does(tmp_path: Path) -> None:
    """A phase skipped (or done) and the script's pid wait for the next line the client must see
    at once (a phase starting or failing, ready): a warm node's progress in a write or two, one SSH
    packet each, where every line was a packet of its own. Nothing is lost or reordered."""
    sky_dir = tmp_path / "sky"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SKYWARD_SKY": str(sky_dir),
           "SKYWARD_RUN": str(tmp_path / "run"), "SKYWARD_POOL": str(tmp_path / "run" / "pools" / "p1-0")}
    slow_check = shlex.quote("sleep 0.5; true")
    text = (script._PRELUDE.format(pool="p1", env="envs/x")
            + '_p_a() { :; }\n_p_b() { echo working; }\n_p_c() { :; }\n_p_d() { exit 4; }\n'
            + 'touch "$SKY/done/a-k" "$SKY/done/c-k"\n'
            + 'phase a k true "$SKY/done"\n'            # skipped at once: held
            + f'phase c k {slow_check} "$SKY/done"\n'   # skipped 0.5 s later: held
            + "phase b '' true \"$SKY/done\"\n"         # starts: what is held goes with it
            + 'phase d "" true "$SKY/done"\n')          # fails: b's done goes with it
    lines = _timed_lines(text, env)
    said = [line for _, line in lines]
    assert said[0].startswith("@@skyward pid ")
    assert said[1:] == ["@@skyward phase a skipped", "@@skyward phase c skipped", "@@skyward phase b started",
                        "working", "@@skyward phase b done", "@@skyward phase d started",
                        "@@skyward phase d failed 4"]
    at = dict((line, t) for t, line in lines)
    # a's line waited for b's start (after c's slow check), not sent at once
    assert at["@@skyward phase a skipped"] >= 0.45
    assert at["@@skyward phase b started"] - at[said[0]] < 0.2
    # ready flushes too: a script whose phases all skip says it all at the end
    ready = (script._PRELUDE.format(pool="p1", env="envs/x") + '_p_a() { :; }\ntouch "$SKY/done/a-k"\n'
             + 'phase a k true "$SKY/done"\n' + script.render(sky.Image(), plan()).splitlines()[-1] + "\n")
    assert [line for _, line in _timed_lines(ready, env)][1:] == ["@@skyward phase a skipped", "@@skyward ready"]


def test_a_node_up_that_stops_early_still_says_what_it_held(tmp_path: Path) -> None:
    """node_up holds ``@@need`` when the node lacks nothing; when it stops before anything else
    goes out (here: no secret after the script), the held line still reaches the client, which
    tells an upload's failure from a failed connection by it."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SKYWARD_NODE_HOME": str(tmp_path / "sky"),
           "SKYWARD_NODE_RUN": str(tmp_path / "run")}
    text = script.node_up("p1", 0, sudo=False, files={}, script="true", then="echo @@then")
    done = subprocess.run(["bash", "-s"], input=text, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "@@need" in done.stdout.splitlines() and "@@then" not in done.stdout
