"""The lock's pure parts: reading uv's output, writing the install file, rendering the deps phase."""

from __future__ import annotations

import subprocess

import skyward as sky
from skyward.bootstrap.script import NodePlan, env_key, render
from skyward.records import pkglock, resolver

UV_OUTPUT = """\
cloudpickle==3.1.2 \\
    --hash=sha256:aaa \\
    --hash=sha256:bbb
Typing_Extensions==4.12.2 \\
    --hash=sha256:ccc
"""


def test_parse_reads_names_versions_and_hashes() -> None:
    got = pkglock.parse(UV_OUTPUT)
    assert got == (pkglock.Package("cloudpickle", "3.1.2", ("sha256:aaa", "sha256:bbb")),
                   pkglock.Package("typing-extensions", "4.12.2", ("sha256:ccc",)))
    assert pkglock.parse(pkglock.text(got)) == got  # what the nodes get reads back the same


def test_hashes_only_when_every_package_has_one() -> None:
    mixed = [pkglock.Package("a", "1", ("sha256:x",)), pkglock.Package("b", "2")]
    assert pkglock.text(mixed) == "a==1\nb==2\n"


def test_the_deps_phase_installs_the_lock_with_no_resolution() -> None:
    lock = pkglock.text([pkglock.Package("skyprobe", "1.0", ("sha256:x",))])
    plan = NodePlan(pool_id="p1", python="3.11", lock=lock)
    script = render(sky.Image(pip=["skyprobe"], apt=["curl"]), plan)
    assert "--no-deps --require-hashes --no-index --find-links" in script
    assert 'cat > "$POOL/lock.txt" <<\'SKYWARD_LOCK\'\nskyprobe==1.0' in script
    assert "dpkg-query -W -f '@@skyward apt ${Package} ${Version}\\n' curl" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # Another lock is another environment on the node; no lock keeps the old key.
    other = NodePlan(pool_id="p1", python="3.11", lock=lock.replace("1.0", "2.0"))
    assert env_key(sky.Image(), plan) != env_key(sky.Image(), other)
    assert env_key(sky.Image(), NodePlan(pool_id="p1", python="3.11")) != env_key(sky.Image(), plan)


def test_node_platform_names_linux_wheels_of_the_architecture() -> None:
    assert resolver.node_platform("arm64") == "aarch64-manylinux_2_28"
    assert resolver.node_platform("x86_64") == "x86_64-manylinux_2_28"
