"""Package-index credentials never reach a command line.

Every local user can read every process's argv (``ps``, /proc/PID/cmdline); only the owner can
read its environment. The index here is private: served on loopback with HTTP basic auth, so uv
and pip get in only with the ``user:password@`` of its URL, and slow enough that the installers
they start live long enough to be seen. A watcher running as ``nobody`` (setpriv) reads every
process's cmdline for as long as the pool or the node script resolves and installs, and says
which installer commands it saw (so a watcher that saw nothing fails the test too) and every
one that held the password.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import skyward as sky
from skyward.bootstrap import script, wheelhouse
from skyward.records import pkglock, resolver

sys.path.insert(0, str(Path(__file__).parent / "record"))
from pkgindex import NAME, Index

QUIET = sky.Options(console=False, logging=False)
USER, PASSWORD = "skyuser", "pw-7f3Kq9xZ-not-on-argv"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="watching ps as another user needs root and setpriv")

# Runs as nobody. Reads the secret from stdin (never from its own argv), says "ready" after its
# first full look at /proc, and stops when stdin closes.
WATCH = r"""
import json, os, select, sys
secret = sys.stdin.readline().rstrip("\n")
leaks, seen, rounds = [], set(), 0
while True:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if not argv:
            continue
        text = " ".join(argv)
        if secret in text:
            leaks.append(text.replace(secret, "<PASSWORD>"))
        name = os.path.basename(argv[0])
        if name == "uv" and len(argv) > 2:
            seen.add(" ".join(["uv", *argv[1:3]]))
        elif "-m" in argv and "pip" in argv:
            seen.add("pip " + argv[argv.index("pip") + 1] if argv.index("pip") + 1 < len(argv) else "pip")
    rounds += 1
    if rounds == 1:
        print("ready", flush=True)
    if select.select([sys.stdin], [], [], 0)[0] and not sys.stdin.readline():
        break
print(json.dumps({"leaks": sorted(set(leaks)), "seen": sorted(seen), "rounds": rounds}), flush=True)
"""


@contextlib.contextmanager
def watching(secret: str) -> Iterator[dict[str, Any]]:
    """What ``nobody`` saw of every process's command line while the block ran."""
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", WATCH],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    assert proc.stdin is not None and proc.stdout is not None
    result: dict[str, Any] = {}
    try:
        proc.stdin.write(secret + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ready"
        yield result
    finally:
        out, _ = proc.communicate(timeout=60)  # closes its stdin: it stops and reports
    result.update(json.loads(out.strip().splitlines()[-1]))
    assert result["rounds"] > 1


class PrivateIndex(Index):
    """tests/record/pkgindex.py's index behind basic auth, each answer a little slow."""

    def __init__(self, root: Path, delay: float = 0.15) -> None:
        super().__init__(root)
        self.delay = delay
        self.let_in = 0  # requests that carried the credentials
        self.turned_away = 0

    def serve(self, address: str = "127.0.0.1") -> str:
        root, outer = str(self.root), self
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=root, **kwargs)

            def do_GET(self) -> None:
                time.sleep(outer.delay)
                if self.headers.get("Authorization") != expected:
                    outer.turned_away += 1
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="private"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                outer.let_in += 1
                super().do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return f"http://{USER}:{PASSWORD}@{address}:{self._server.server_address[1]}/simple"


@pytest.fixture
def home(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The suite's fresh home, and no package cache: the pool really resolves and installs."""
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    return home


@pytest.fixture
def private(tmp_path: Path) -> Iterator[tuple[PrivateIndex, str]]:
    index = PrivateIndex(tmp_path / "index")
    index.publish("1.0")
    url = index.serve()
    yield index, url
    index.close()


@sky.function
def probe() -> str:
    import skyprobe  # type: ignore[import-not-found]

    return str(skyprobe.VERSION)


def assert_clean(seen: dict[str, Any], *commands: str) -> None:
    assert seen["leaks"] == [], f"the index password was on a command line: {seen['leaks']}"
    for command in commands:  # the watcher did see the installers: it would have seen a password
        assert any(s.startswith(command) for s in seen["seen"]), (command, seen["seen"])


def test_a_local_pool_on_a_private_pip_index_puts_its_password_on_no_command_line(
        home: Path, private: tuple[PrivateIndex, str]) -> None:
    index, url = private
    image = sky.Image(pip=[NAME], pip_indexes=[sky.PipIndex(url=url, packages=(NAME,))])
    with watching(PASSWORD) as seen, sky.Compute(image=image, options=QUIET) as pool:
        assert probe() >> pool == "1.0"
    assert index.let_in > 0
    assert_clean(seen, "uv pip compile", "uv pip install")


def test_pip_settings_with_credentials_reach_uv_by_its_environment(
        home: Path, private: tuple[PrivateIndex, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """PIP_EXTRA_INDEX_URL (as pip.conf's extra-index-url would) with user:password@."""
    index, url = private
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", url)
    with watching(PASSWORD) as seen, sky.Compute(image=sky.Image(pip=[NAME]), options=QUIET) as pool:
        assert probe() >> pool == "1.0"
    assert index.let_in > 0
    assert_clean(seen, "uv pip compile", "uv pip install")


def test_the_wheelhouse_of_a_lock_is_fetched_with_no_password_on_pips_command_line(
        home: Path, private: tuple[PrivateIndex, str]) -> None:
    index, url = private
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    locked = resolver.resolve([NAME], python=sys.executable, indexes=[url])
    with watching(PASSWORD) as seen:
        wheels = wheelhouse.wheels_for_lock(pkglock.text(locked), here, (url,))
    assert [w.name for w in wheels] == [f"{NAME}-1.0-py3-none-any.whl"]
    assert index.let_in > 0
    assert_clean(seen, "pip wheel")


@pytest.mark.parametrize("where", ["UV_INDEX", "uv.toml"])
def test_uv_settings_with_credentials_reach_pip_by_its_environment(
        home: Path, private: tuple[PrivateIndex, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        where: str) -> None:
    """A private index only uv is configured with: named in UV_INDEX or a project's
    uv.toml, its credentials in uv's UV_INDEX_<NAME>_USERNAME/_PASSWORD. uv resolves the lock
    with them, and the wheelhouse's pip, which reads none of uv's settings, gets the index and
    its credentials by its environment too."""
    index, url = private
    bare = url.replace(f"{USER}:{PASSWORD}@", "")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("UV_INDEX_PRIVATE_USERNAME", USER)
    monkeypatch.setenv("UV_INDEX_PRIVATE_PASSWORD", PASSWORD)
    if where == "UV_INDEX":
        monkeypatch.setenv("UV_INDEX", f"private={bare}")
    else:
        (tmp_path / "uv.toml").write_text(f'[[index]]\nname = "private"\nurl = "{bare}"\n')
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    with watching(PASSWORD) as seen:
        locked = resolver.resolve([NAME], python=sys.executable)
        wheels = wheelhouse.wheels_for_lock(pkglock.text(locked), here)
    assert [w.name for w in wheels] == [f"{NAME}-1.0-py3-none-any.whl"]
    assert index.let_in > 0
    assert_clean(seen, "uv pip compile", "pip wheel")


def test_skyward_install_on_index_nodes_passes_the_index_by_environment(
        home: Path, private: tuple[PrivateIndex, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `skyward install` runs on a node of an index-mode pool (nodeops.install_locked, here in
    this process: the node's side is this same function)."""
    from skyward.named import install, nodeops

    index, url = private
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setenv("SKYWARD_SITE", str(site))
    monkeypatch.setenv("SKYWARD_UV", resolver.uv_binary())
    locked = resolver.resolve([NAME], python=sys.executable, indexes=[url])
    plan = install.Plan("index", (NAME,), locked, locked, "3.11", (url,), "p1")
    where = install._sources(plan)
    with watching(PASSWORD) as seen:
        out = nodeops.install_locked(pkglock.text(locked), {}, where.args, 120, env=where.env)
    assert out["ok"], out["output"]
    assert out["versions"] == {NAME: "1.0"} and index.let_in > 0
    assert_clean(seen, "uv pip install")


# -- the node's bootstrap script -------------------------------------------------------------------
def run_until_skyward(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run a rendered bootstrap script on this machine up to (not including) its skyward phase, with
    the client's uv as the node's: everything it does with the index happens in these phases."""
    cut = text.index("phase skyward ")
    cut = text.rindex("\n_p_skyward()", 0, cut) + 1
    sky_dir = tmp_path / "node-sky"
    (sky_dir / "bin").mkdir(parents=True)
    shutil.copy(resolver.uv_binary(), sky_dir / "bin" / "uv")
    dirs = {"SKYWARD_SKY": str(sky_dir), "SKYWARD_RUN": str(tmp_path / "node-run"),
            "SKYWARD_POOL": str(tmp_path / "node-run" / "pool")}
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "UV_CACHE_DIR": str(tmp_path / "node-uv-cache"), **dirs}
    return subprocess.run(["bash", "-s"], input=text[:cut] + "env_unlock\necho @@skyward ready\n",
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("locked", [True, False], ids=["lock", "image-pip"])
def test_the_node_script_installs_from_a_private_index_with_no_password_on_argv(
        home: Path, private: tuple[PrivateIndex, str], tmp_path: Path, locked: bool) -> None:
    index, url = private
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if shutil.which(f"python{python}", path="/usr/bin:/bin") is None:
        pytest.skip(f"no system python{python} for the node's venv")
    lock = pkglock.text(resolver.resolve([NAME], python=python, indexes=[url])) if locked else ""
    # The lock's install looks at the default index too (PyPI, out of reach here): the node's own
    # index, given in Image.env as users do, is this private one as well.
    env = {"UV_INDEX_URL": url} if locked else {}
    image = sky.Image(pip=[NAME], pip_indexes=[sky.PipIndex(url=url, packages=(NAME,))], env=env)
    plan = script.NodePlan(pool_id="p1", python=python, install="index", skyward_wheel="wheels/skyward/x/s.whl",
                           skyward_hash="x", uv_version="0", lock=lock)
    text = script.render(image, plan)
    with watching(PASSWORD) as seen:
        proc = run_until_skyward(text, tmp_path)
    assert proc.returncode == 0 and "@@skyward ready" in proc.stdout, proc.stdout + proc.stderr
    venv = tmp_path / "node-sky" / "envs" / script.env_key(image, plan)
    got = subprocess.run([str(venv / "bin" / "python"), "-c", "import skyprobe; print(skyprobe.VERSION)"],
                         capture_output=True, text=True, timeout=60)
    assert got.stdout.strip() == "1.0", got.stderr
    assert index.let_in > 0
    assert PASSWORD not in proc.stdout + proc.stderr
    assert_clean(seen, "uv pip install")
    # No file of the node's holds it either, but the pool's own 0600 folder.
    for path in (tmp_path / "node-sky").rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 1 << 20:
            assert PASSWORD.encode() not in path.read_bytes(), path


def test_a_node_without_uv_fetches_it_from_a_private_index_and_never_prints_the_password(
        tmp_path: Path, private: tuple[PrivateIndex, str]) -> None:
    """Index mode, a node with no uv: the script's fetcher takes the index from Image.env
    (UV_INDEX_URL, user:password@ included), logs in with it, and says where it fetched from
    without the password (what it prints becomes the pool's events and errors)."""
    import hashlib
    import platform
    import zipfile

    index, url = private
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    folder = index.root / "simple" / "uv"
    folder.mkdir()
    wheel = folder / f"uv-9.9.9-py3-none-manylinux_2_17_{arch}.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("uv-9.9.9.data/scripts/uv", "#!/bin/sh\necho uv 9.9.9\n")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (folder / "index.html").write_text(f'<a href="{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
    fetch = script._FETCH_UV
    proc = subprocess.run([sys.executable, "-", str(tmp_path / "bin"), "9.9.9"], input=fetch, capture_output=True,
                          text=True, timeout=60, env={"PATH": os.environ["PATH"], "UV_INDEX_URL": url})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert subprocess.run([str(tmp_path / "bin" / "uv")], capture_output=True, text=True).stdout == "uv 9.9.9\n"
    assert "fetched uv 9.9.9 from http://127.0.0.1:" in proc.stdout
    assert PASSWORD not in proc.stdout + proc.stderr and USER not in proc.stdout + proc.stderr
