"""A client environment with no pip in it: made by ``uv venv`` and ``uv pip install``,
as uv users make theirs. The lock a pool records and the wheels its nodes get are the same,
byte for byte, as from an environment with pip; pip is never installed into it; a tool the
client lacks is named with the command that installs it.

The SSH path from such an environment runs in tests/cli/test_no_pip_client_ssh.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import uvclient

from skyward.bootstrap import wheelhouse
from skyward.errors import ProviderError

pytestmark = pytest.mark.timeout(300)

# The lock and the wheelhouse of an SSH pool, as providers/ssh.py builds them: resolved once
# for this interpreter, then the wheels of exactly that lock. One pure and one binary package.
LOCK_AND_WHEELS = """
    import hashlib, json, sys
    from skyward.bootstrap import wheelhouse
    from skyward.records import pkglock, resolver

    requirements = sys.argv[1:]
    locked = resolver.resolve(requirements, python=sys.executable)
    text = pkglock.text(locked)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheels = wheelhouse.wheels_for_lock(text, here)
    print(json.dumps({"lock": text, "record": pkglock.describe(locked, python=here, platform=None, indexes=[], resolver=resolver.uv_version()),
                      "wheels": {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels}}))
"""


@pytest.fixture(scope="module")
def uv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return uvclient.make(tmp_path_factory.mktemp("uv-client"))


def _lock_and_wheels(python: Path | str, home: Path, requirements: list[str]) -> dict[str, object]:
    proc = subprocess.run([str(python), "-c", textwrap.dedent(LOCK_AND_WHEELS), *requirements],
                          capture_output=True, text=True, timeout=240,
                          env=uvclient.clean_env(SKYWARD_HOME=str(home), PIP_NO_CACHE_DIR="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_lock_and_wheels_from_an_environment_without_pip_are_those_from_one_with_pip(
        uv_python: Path, tmp_path: Path) -> None:
    import importlib.metadata

    requirements = ["six==1.16.0", f"lz4=={importlib.metadata.version('lz4')}"]
    with_pip = _lock_and_wheels(sys.executable, tmp_path / "with-pip", requirements)
    without = _lock_and_wheels(uv_python, tmp_path / "without-pip", requirements)
    assert "--hash=sha256:" in str(with_pip["lock"])
    assert without["lock"] == with_pip["lock"]
    # (the resolver's version is the uv each environment has installed: not what is compared)
    assert {**without["record"], "resolver": ""} == {**with_pip["record"], "resolver": ""}  # type: ignore[dict-item]
    assert without["wheels"] == with_pip["wheels"]
    assert {name.split("-")[0] for name in without["wheels"]} == {"six", "lz4"}  # type: ignore[union-attr]
    # And nothing was installed into the user's environment to get them.
    has = subprocess.run([str(uv_python), "-c", "import importlib.util as u; print(u.find_spec('pip'))"],
                         capture_output=True, text=True, timeout=60, env=uvclient.clean_env())
    assert has.stdout.strip() == "None"


def test_pip_for_the_wheelhouse_runs_apart_from_the_users_environment(uv_python: Path, tmp_path: Path) -> None:
    """Where the environment has no pip, a pip of skyward's own (from the interpreter's bundled
    wheel, kept in skyward's cache) runs with this same interpreter: its platform tags."""
    code = textwrap.dedent("""
        import json, subprocess, sys
        from skyward.bootstrap import wheelhouse
        cmd, env = wheelhouse.pip_command()
        tags = subprocess.run([*cmd, "debug", "--verbose"], capture_output=True, text=True, env=env).stdout
        print(json.dumps({"cmd": cmd, "path": env.get("PYTHONPATH", ""), "tags": tags}))
    """)
    home = tmp_path / "home"
    proc = subprocess.run([str(uv_python), "-c", code], capture_output=True, text=True, timeout=120,
                          env=uvclient.clean_env(SKYWARD_HOME=str(home)))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["cmd"][:3] == [str(uv_python), "-m", "pip"]
    assert seen["path"].startswith(str(home / "cache")), seen
    assert "Compatible tags" in seen["tags"] and f"cp{sys.version_info.major}{sys.version_info.minor}" in seen["tags"]


def test_no_pip_to_be_had_names_pip_and_the_command_that_installs_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No pip here, none bundled with the interpreter, and no index to fetch one from: the error
    says which tool is missing and how to install it (not that a version left the index)."""
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_EXTRA_INDEX_URL", "UV_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("UV_NO_CONFIG", "1")
    with pytest.raises(ProviderError) as info:
        wheelhouse.isolated_pip(bundled=())
    said = str(info.value)
    assert "pip" in said and f"uv pip install --python {sys.executable} pip" in said, said
    assert "install='index'" in said or 'install="index"' in said, said
    assert "removed from the index" not in said


def test_the_bundled_pip_is_unpacked_once_into_skywards_cache(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    first = wheelhouse.isolated_pip()
    assert first.is_relative_to(tmp_path / "home" / "cache") and (first / "pip" / "__main__.py").exists()
    stamp = hashlib.sha256(str(sorted(p.name for p in first.iterdir())).encode()).hexdigest()
    again = wheelhouse.isolated_pip()
    assert again == first
    assert hashlib.sha256(str(sorted(p.name for p in again.iterdir())).encode()).hexdigest() == stamp


def test_without_a_bundled_pip_wheel_pip_comes_from_the_index_into_skywards_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python whose ensurepip carries no wheel (some distributions strip it): skyward's pip is
    fetched once with uv from this machine's index, into its cache, and runs."""
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    folder = wheelhouse.isolated_pip(bundled=())
    assert folder.is_relative_to(tmp_path / "home" / "cache")
    ran = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, timeout=60,
                         env=uvclient.clean_env(PYTHONPATH=str(folder)))
    assert ran.returncode == 0 and ran.stdout.startswith("pip ") and str(folder) in ran.stdout, ran
    assert wheelhouse.isolated_pip(bundled=()) == folder  # once
