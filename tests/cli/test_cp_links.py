"""`skyward cp` downloads and the symlinks a node's folder holds, on a real
Local named pool: a link that stays inside the copied folder is copied as a link; one that points
outside it (absolute, or climbing out, directly or through another link) is refused, with
nothing copied. Kept, such a link would let a later copy into the same folder write wherever it
points (``results/keys -> ~/.ssh``, then ``results/keys/authorized_keys``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import CLI

pytestmark = pytest.mark.timeout(180)

TOML = """
[pools.demo]
provider = "local"
nodes = 1
ttl = 300
"""


@pytest.fixture
def demo(cli: CLI) -> CLI:
    cli.toml(TOML)
    up = cli("up", "demo", "--console", "silent")
    assert up.code == 0, up
    return cli


def _node_dir(cli: CLI) -> Path:
    return Path(cli.record("demo")["cluster"]["nodes"][0]["log"]).parent


def _results(node: Path) -> Path:
    results = node / "results"
    (results / "sub").mkdir(parents=True)
    (results / "ok.txt").write_text("ok\n")
    (results / "sub" / "deep.txt").write_text("deep\n")
    os.symlink("ok.txt", results / "latest")  # inside: kept
    os.symlink("../ok.txt", results / "sub" / "up-one")  # climbs, but stays inside: kept
    return results


def test_a_download_keeps_links_that_stay_inside_the_copy(demo: CLI, tmp_path: Path) -> None:
    _results(_node_dir(demo))
    got = demo("cp", "demo:results", str(tmp_path / "here"), "--node", "0")
    assert got.code == 0, got
    here = tmp_path / "here"
    assert os.readlink(here / "latest") == "ok.txt" and (here / "latest").read_text() == "ok\n"
    assert os.readlink(here / "sub" / "up-one") == "../ok.txt"


@pytest.mark.parametrize(("link", "target"), [
    ("keys", "/etc"),  # absolute
    ("sub/away", "../../outside.txt"),  # climbs out of the copy
    ("sub/cwd", ".."),  # inside (the copy's root) ...
    ("sneaky", "sub/cwd/.."),  # ... but through it, one level above the copy: outside
])
def test_a_download_refuses_a_link_that_points_outside_the_copy(demo: CLI, tmp_path: Path, link: str,
                                                                 target: str) -> None:
    results = _results(_node_dir(demo))
    if link == "sneaky":
        os.symlink("..", results / "sub" / "cwd")
    os.symlink(target, results / link)
    dest = tmp_path / "here"
    refused = demo("cp", "demo:results", str(dest), "--node", "0")
    if link == "sub/cwd":  # the copy's root is inside the copy: that one is fine
        assert refused.code == 0, refused
        return
    assert refused.code == 1, refused
    message = refused.err
    assert f"{link} -> {target}" in message, message  # the value
    assert "outside" in message and "node 0" in message, message  # the rule, where
    assert "Nothing was copied" in message, message
    assert "rm " in message or "--node" in message or "copy what it points to" in message, message  # next step
    assert not dest.exists() and not list(tmp_path.glob(".skyward-cp-*"))


def test_a_link_through_a_link_the_archive_lists_later_is_refused(tmp_path: Path) -> None:
    """The order of a tar stream is the node's to choose: `sneaky -> sub/cwd/..` unpacked before
    `sub/cwd -> ..` looks inside when it arrives, and lands outside once both exist."""
    import io
    import tarfile

    from skyward.errors import SkywardError
    from skyward.named.copy import _extract

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, target in (("sub", tarfile.DIRTYPE, ""), ("sneaky", tarfile.SYMTYPE, "sub/cwd/.."),
                                   ("sub/cwd", tarfile.SYMTYPE, "..")):
            member = tarfile.TarInfo(name)
            member.type, member.linkname, member.mode = kind, target, 0o755
            tar.addfile(member)
    into = tmp_path / "payload"
    into.mkdir()
    buffer.seek(0)

    def refuse(member: tarfile.TarInfo, why: str) -> SkywardError:
        return SkywardError(f"{member.name} -> {member.linkname}: {why}")

    with tarfile.open(fileobj=buffer, mode="r|") as tar, pytest.raises(SkywardError, match=r"sneaky -> sub/cwd/\.\."):
        _extract(tar, into, refuse)
