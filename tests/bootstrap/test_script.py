"""The bootstrap script rendered from an Image (pure: no hosts needed). The SSH tests run it."""

from __future__ import annotations

import shlex
import subprocess
import zipfile

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
