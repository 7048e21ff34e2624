"""Hostile Image values are refused where they are written, and the env values
that are accepted reach the node literally: the env phase of the real bootstrap script is run with
bash and the environment it leaves is compared with what the Image said."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import skyward as sky
from skyward.bootstrap import script
from skyward.errors import ConfigError


@pytest.mark.parametrize("key", ["A B", "1A", "A;touch /tmp/x", "", "A=B", "A-B", "$(id)", "A\nB", "é"])
def test_env_keys_must_be_shell_names(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        sky.Image(env={key: "v"})
    said = str(info.value)
    assert repr(key) in said and "[A-Za-z_][A-Za-z0-9_]*" in said


@pytest.mark.parametrize("key", ["X Y", "9", "a;b"])
def test_shell_vars_names_must_be_shell_names(key: str) -> None:
    with pytest.raises(ConfigError, match=r"shell_vars"):
        sky.Image(shell_vars={key: "echo 1"})


def test_an_env_value_with_a_nul_byte_is_refused() -> None:
    with pytest.raises(ConfigError, match="NUL"):
        sky.Image(env={"A": "x\0y"})


def test_good_env_keys_are_kept() -> None:
    assert dict(sky.Image(env={"_A1": "1", "PATH": "/x", "hf_token": "t"}).env) == {
        "_A1": "1", "PATH": "/x", "hf_token": "t"}


@pytest.mark.parametrize("entry", [
    "-o", "-oAPT::Update::Pre-Invoke::=touch /tmp/pwned", "--allow-unauthenticated", "./evil.deb",
    "/tmp/evil.deb", "git; rm -rf /", "git curl", "Git", "g", "git=", "git=-o", "pkg/../../x", "$(id)", "",
])
def test_apt_entries_must_be_package_names(entry: str) -> None:
    with pytest.raises(ConfigError) as info:
        sky.Image(apt=["curl", entry])
    said = str(info.value)
    assert repr(entry) in said and "package name" in said


@pytest.mark.parametrize("entry", ["git", "libssl3", "python3.11", "g++", "libc6:amd64", "git=1:2.39.2-1",
                                   "openssh-server=1:9.2p1-2+deb12u3", "nvidia-driver-535"])
def test_apt_package_names_and_versions_are_kept(entry: str) -> None:
    assert sky.Image(apt=[entry]).apt == (entry,)


HOSTILE = {
    "MULTI": "line one\nline two\n",
    "QUOTES": "it's \"quoted\" and 'single'",
    "SUBST": "$(touch {canary}) `touch {canary}` ${{HOME}} $HOME",
    # The env file's heredoc delimiter on a line of its own: on the old script the rest ran as shell.
    "DELIM": "x\nSKYWARD_ENV\ntouch {canary}\n",
    "BACKSLASH": "a\\nb\\",
    "EMPTY": "",
    "UNICODE": "naïve — ok",
    "PERCENT": "%s %q %%",
}


def test_env_values_reach_the_node_literally(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    env = {k: v.format(canary=canary) for k, v in HOSTILE.items()}
    plan = script.NodePlan(pool_id="p1", python="3.11", skyward_wheel="wheels/skyward/ab/skyward.whl",
                           skyward_hash="ab")
    text = script.render(sky.Image(env=env), plan)
    # The script up to the point where the rest of the bootstrap has sourced the env file, then
    # what a task would see.
    cut = text.index('. "$POOL/env.sh"\n') + len('. "$POOL/env.sh"\n')
    probe = f"{sys.executable} -c 'import json, os; print(json.dumps(dict(os.environ)))'\n"
    dirs = {"SKYWARD_SKY": str(tmp_path / "sky"), "SKYWARD_RUN": str(tmp_path / "run"),
            "SKYWARD_POOL": str(tmp_path / "run" / "pool")}
    proc = subprocess.run(["bash", "-s"], input=text[:cut] + probe, capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **dirs})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert {k: seen.get(k) for k in env} == env
    assert not canary.exists(), "an env value ran as shell"
    assert oct((tmp_path / "run" / "pool" / "env.sh").stat().st_mode & 0o777) == "0o600"
    # The agent's own start (providers/ssh.py) sources env.sh from a fresh bash: the same values.
    again = subprocess.run(["bash", "-c", f'. {tmp_path / "run" / "pool" / "env.sh"}; {probe}'],
                           capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})
    assert {k: json.loads(again.stdout).get(k) for k in env} == env
    assert not canary.exists()


# -- apt through sudo, for a login user who is not root ---------------------------------------------
def _node_check_as_nobody(rules: str, packages: tuple[str, ...]) -> str:
    """The node check of providers/ssh.py (script.node_dirs_command) run as ``nobody`` by a real sudo
    whose /etc/sudoers.d holds only ``rules`` (a tmpfs in a mount namespace of its own: the
    machine's rules are untouched). Returns the check's ``@@sudo`` line."""
    import shutil
    import tempfile

    home = tempfile.mkdtemp(prefix="skyward-sudo-")
    os.chown(home, 65534, 65534)
    inner = ('mount -t tmpfs -o mode=755 tmpfs /etc/sudoers.d && printf "%s\\n" "$RULES" > /etc/sudoers.d/skyward'
             ' && chmod 440 /etc/sudoers.d/skyward && visudo -cqf /etc/sudoers.d/skyward'
             ' && exec setpriv --reuid=65534 --regid=65534 --clear-groups bash -c "$CHECK"')
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", inner],
                              capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": home, "RULES": rules,
                                   "CHECK": script.node_dirs_command("p1", 0, sudo=packages)})
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    return next(line for line in proc.stdout.splitlines() if line.startswith("@@sudo"))


@pytest.mark.skipif(os.geteuid() != 0 or not all(map(__import__("shutil").which, ("sudo", "unshare", "setpriv"))),
                    reason="needs root, sudo, unshare and setpriv")
def test_the_sudo_advice_names_a_narrow_rule_that_passes_the_check_and_says_the_broad_one_is_root() -> None:
    packages = ("git", "curl")
    advice = script.sudo_advice("nobody", packages)
    narrow = advice.split("'")[1]
    assert narrow.startswith("nobody ALL=(root) NOPASSWD: /usr/bin/apt-get install ")
    assert "amounts to giving nobody root" in advice and "NOPASSWD: /usr/bin/apt-get'" in advice
    # The narrow rule is what the apt phase needs, and it passes the check before anything runs...
    assert _node_check_as_nobody(narrow, packages) == "@@sudo ok"
    # ...so does the broad one (root-equivalent: said so above), and no rule does not.
    assert _node_check_as_nobody("nobody ALL=(root) NOPASSWD: /usr/bin/apt-get", packages) == "@@sudo ok"
    assert _node_check_as_nobody("# nothing for nobody", packages) != "@@sudo ok"
    # The narrow rule is narrow: the install of other packages is refused.
    assert _node_check_as_nobody(narrow, ("git", "openssh-server")) != "@@sudo ok"
    text = script.render(sky.Image(apt=list(packages)), script.NodePlan(pool_id="p1", python="3.11"))
    assert "$SUDO apt-get install -o DPkg::Lock::Timeout=300 -y -q --no-install-recommends git curl" in text
